"""Rule 1: a query whose objects all live in one engine runs there, whole.

Names become physical names and the tree is printed in that engine's dialect; nothing moves.
"""

from __future__ import annotations

from sqlglot import exp

from sstore.polystore.plan import Plan
from sstore.polystore.planning import PlanningInput
from sstore.polystore.rules.common import combined, final_run, read_fragment
from sstore.polystore.sqltext import physical_table


def run_in_place(inp: PlanningInput) -> list[Plan]:
    engines = inp.engines_used()
    if len(engines) != 1:
        return []
    engine = engines[0]
    replacements: dict[str, exp.Expression] = {}
    for obj in inp.objects:
        if len(obj.fragments) == 1:
            replacements[obj.name] = physical_table(obj.fragments[0].physical)
        else:  # split inside one engine: a UNION ALL there
            replacements[obj.name] = combined([read_fragment(inp, obj, f, project=False)
                                               for f in obj.fragments])
    final = final_run(inp, engine, inp.dialect(engine), replacements)
    return [Plan(f"in {engine}", "run_in_place", (), final)]

