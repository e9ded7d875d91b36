"""Rule 3: pull every fragment into the island in parallel and run the query there.

The paper's plan (ii): each engine runs only a scan (with the query's columns and, when it can,
its filter), the rows arrive as Arrow, and DuckDB in this process combines them. Nothing is
written anywhere. Not feasible when the inputs would not fit the island's memory budget.
"""

from __future__ import annotations

from collections.abc import Sequence

from sstore.polystore.plan import Fetch, Plan, Step
from sstore.polystore.planning import PlanningInput
from sstore.polystore.rules.common import final_run, gather_fragments
from sstore.polystore.sqltext import ISLAND_DIALECT

BYTES_PER_VALUE = 16  # a rough width of one value in Arrow, for the memory check


def pull_into_island(inp: PlanningInput) -> list[Plan]:
    if len(inp.engines_used()) < 2:
        return []
    fetches, replacements = gather_fragments(inp, Fetch)
    final = final_run(inp, "island", ISLAND_DIALECT, replacements)
    plan = Plan("pull into island", "pull_into_island", tuple(fetches), final)
    plan.feasible, plan.why_not = island_fit(fetches, inp.memory_budget_bytes)
    return [plan]


def island_fit(fetches: Sequence[Step], budget_bytes: int) -> tuple[bool, str]:
    """Whether the fetched inputs fit the island's memory budget, and if not, why."""
    needed = sum(f.rows * f.columns for f in fetches) * BYTES_PER_VALUE
    if needed > budget_bytes:
        return False, (f"~{needed / 1e9:.1f} GB of inputs exceed the island's budget of "
                       f"{budget_bytes / 1e9:.1f} GB")
    return True, ""
