"""Chosen plans kept for repeated queries: a dashboard's query is planned once every few runs.

Planning asks every engine about every fragment (sizes, caches) and prints every candidate's
SQL: on a query that runs in a few milliseconds that costs as much as the query. A repeated
query (same SQL, same catalog, same ``repeats``) reuses the plan chosen last time for up to
``replan_every`` runs, then is planned afresh (sizes and measured costs have moved on).

Reusing a plan never serves stale rows: its moves refresh their caches when they run (they ask
the sources what they hold then), and its fetches read the fragments as they are. The one
thing a plan fixes is which fragments it reads: a fragment left out because it was empty
(``prune_empty_fragments``) is checked to be empty still before each reuse; one that has
gained rows sends the query back to the planner.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from sstore.polystore.plan import Plan

IsEmpty = Callable[[str, str], bool]  # (engine, physical) -> still empty?


@dataclass
class _Entry:
    plan: Plan
    uses: int = 0


@dataclass
class PlanCache:
    replan_every: int = 10
    entries: dict[tuple[str, int, Hashable], _Entry] = field(default_factory=dict)

    @staticmethod
    def key(sql: str, repeats: int, catalog: Hashable) -> tuple[str, int, Hashable]:
        """``catalog``: what identifies the catalog's state (``Polystore`` passes the catalog
        object (by identity) and ``Catalog.version``, which every change moves on)."""
        return sql, repeats, catalog

    def get(self, key: tuple[str, int, Hashable], is_empty: IsEmpty) -> Plan | None:
        """The plan to reuse for ``key``, or None (plan afresh)."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        if entry.uses >= self.replan_every or not all(
                is_empty(engine, physical) for engine, physical in entry.plan.pruned):
            del self.entries[key]
            return None
        entry.uses += 1
        return entry.plan

    def put(self, key: tuple[str, int, Hashable], plan: Plan) -> None:
        self.entries[key] = _Entry(plan, 1)
        while len(self.entries) > 256:  # oldest first
            del self.entries[next(iter(self.entries))]
