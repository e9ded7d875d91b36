"""Chosen plans kept for repeated queries: a dashboard's query is planned once every few runs.

Planning asks every engine about every fragment (sizes, caches) and prices every candidate: on
a query that runs in a few milliseconds that costs about as much as the query. A repeated
query (same SQL, same catalog, same ``repeats``) reuses the plan chosen last time for up to
``replan_every`` runs, then is planned afresh (sizes and measured costs have moved on).

How often it is planned afresh adapts to what re-planning finds:

- a re-planning that picks the same plan again doubles the reuse interval, up to
  ``replan_every * max_backoff`` runs (a stable choice stops paying for confirmations); one
  that picks another plan resets it to ``replan_every``;
- a run of the reused plan that takes more than ``diverge`` times its fastest run since it was
  chosen (and at least ``diverge_floor_seconds`` more) sends the next run back to the planner
  at once: the data or the machine changed under the plan, and the learner (``learning``) has
  seen that run, so the next planning prices with what it measured.

Reusing a plan never serves stale rows: its moves refresh their caches when they run (they ask
the sources what they hold then), and its fetches read the fragments as they are. The one
thing a plan fixes is which fragments it reads: a fragment left out because it was empty
(``prune_empty_fragments``) is checked to be empty still before each reuse (one row read at
most, ``Connector.is_empty``); one that has gained rows sends the query back to the planner.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from sstore.polystore.plan import Plan

IsEmpty = Callable[[str, str], bool]  # (engine, physical) -> still empty?
Key = tuple[str, int, Hashable]


@dataclass
class _Entry:
    plan: Plan
    interval: int          # runs this plan is reused for before a re-planning
    uses: int = 0
    fastest: float | None = None  # its fastest measured run since it was chosen, seconds


@dataclass
class PlanCache:
    replan_every: int = 10
    max_backoff: int = 8
    diverge: float = 2.0
    diverge_floor_seconds: float = 0.001
    entries: dict[Key, _Entry] = field(default_factory=dict)
    #: what the last re-planning of a key replaced: (plan name, its interval)
    _previous: dict[Key, tuple[str, int]] = field(default_factory=dict)
    replans: int = 0  # plannings asked for by ``get`` (tests and profiles)

    @staticmethod
    def key(sql: str, repeats: int, catalog: Hashable) -> Key:
        """``catalog``: what identifies the catalog's state (``Polystore`` passes the catalog
        object (by identity) and ``Catalog.version``, which every change moves on)."""
        return sql, repeats, catalog

    def get(self, key: Key, is_empty: IsEmpty) -> Plan | None:
        """The plan to reuse for ``key``, or None (plan afresh, then ``put``)."""
        entry = self.entries.get(key)
        if entry is None:
            self.replans += 1
            return None
        due = entry.uses >= entry.interval
        if due or not all(is_empty(engine, physical) for engine, physical in entry.plan.pruned):
            del self.entries[key]
            # a fragment that gained rows is not a confirmation: the interval starts over
            self._previous[key] = (entry.plan.name, entry.interval if due else 0)
            self.replans += 1
            return None
        entry.uses += 1
        return entry.plan

    def put(self, key: Key, plan: Plan) -> None:
        """``plan`` was just chosen for ``key`` (and runs once now)."""
        name, interval = self._previous.pop(key, ("", 0))
        if name == plan.name and interval and self.replan_every > 1:  # 1: always afresh
            interval = min(2 * interval, self.replan_every * self.max_backoff)
        else:
            interval = self.replan_every
        self.entries[key] = _Entry(plan, interval, 1)
        while len(self.entries) > 256:  # oldest first
            del self.entries[next(iter(self.entries))]
        while len(self._previous) > 256:
            del self._previous[next(iter(self._previous))]

    def observe(self, plan: Plan, seconds: float) -> None:
        """A run of ``plan`` took ``seconds``: a kept plan whose run diverges from its fastest
        (see the module docstring) is due for a re-planning at its next run."""
        for entry in self.entries.values():
            if entry.plan is not plan:
                continue
            if (entry.fastest is not None and seconds > self.diverge * entry.fastest
                    and seconds - entry.fastest >= self.diverge_floor_seconds):
                entry.interval = self.replan_every  # a confirmation doubles from the start
                entry.uses = entry.interval
            entry.fastest = seconds if entry.fastest is None else min(entry.fastest, seconds)
            return
