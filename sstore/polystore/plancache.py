"""Chosen plans kept for repeated queries: a dashboard's query is planned once every few runs.

Planning asks every engine about every fragment (sizes, caches) and prices every candidate: on
a query that runs in a few milliseconds that costs about as much as the query. A repeated
query (same SQL, same catalog, same ``repeats``) reuses the plan chosen last time for up to
``replan_every`` runs, then is planned afresh (sizes and measured costs have moved on).

How often it is planned afresh adapts to what re-planning finds:

- a re-planning that picks the same plan again doubles the reuse interval, up to
  ``replan_every * max_backoff`` runs (a stable choice stops paying for confirmations); one
  that picks another plan resets it to ``replan_every``;
- ``diverge_runs`` runs of the reused plan in a row (2) that each take more than ``diverge``
  times its fastest run since it was chosen (and at least ``diverge_floor_seconds`` more) send
  the next run back to the planner: the data or the machine changed under the plan, and the
  learner (``learning``) has seen those runs, so the next planning prices with what it
  measured. One such run is not enough: on a shared 2-core machine at load 6, one run in ten
  took twice its plan's fastest with nothing changed (benchmarks.plans: 29 re-plannings
  after the first in 440 runs, 26 of them choosing the same plan again, ~10-25 ms each, 2-15%
  of the queries' time); data that grew under the plan slows every run;
- a run after which the chosen plan, priced again with what the learner now knows of it
  (``sstore.polystore.corrections``: its measured runs against its price), costs more than
  ``surpass`` times the runner-up (the cheapest other feasible plan when it was chosen, priced
  the same way) sends the next run back to the planner too: the choice was probably wrong,
  and the runner-up gets tried; its own runs then teach its correction. Priced with the
  learnt corrections (a median of recent runs, relative to the machine's load), not the one
  run: a slow moment of a loaded machine is not a wrong choice. Without this, a plan that was
  always slow (never twice its own fastest) was reused for ``replan_every`` runs and more
  however wrong the choice, and the plans not chosen were never measured at all.

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
Estimate = Callable[[Plan], float]    # a plan -> its estimated seconds with what is known now
Key = tuple[str, int, Hashable]


@dataclass
class _Entry:
    plan: Plan
    interval: int          # runs this plan is reused for before a re-planning
    uses: int = 0
    fastest: float | None = None  # its fastest measured run since it was chosen, seconds
    runner_up: Plan | None = None  # the next-cheapest feasible plan when it was chosen
    slow_runs: int = 0             # runs in a row that diverged from its fastest


@dataclass
class PlanCache:
    replan_every: int = 10
    max_backoff: int = 8
    diverge: float = 2.0
    diverge_floor_seconds: float = 0.001
    diverge_runs: int = 2
    surpass: float = 1.1
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

    def put(self, key: Key, plan: Plan, runner_up: Plan | None = None) -> None:
        """``plan`` was just chosen for ``key`` (and runs once now); ``runner_up``: the
        cheapest other feasible plan (None: there was none)."""
        name, interval = self._previous.pop(key, ("", 0))
        if name == plan.name and interval and self.replan_every > 1:  # 1: always afresh
            interval = min(2 * interval, self.replan_every * self.max_backoff)
        else:
            interval = self.replan_every
        self.entries[key] = _Entry(plan, interval, 1, runner_up=runner_up)
        while len(self.entries) > 256:  # oldest first
            del self.entries[next(iter(self.entries))]
        while len(self._previous) > 256:
            del self._previous[next(iter(self._previous))]

    def forget(self, plan: Plan) -> None:
        """A run of kept ``plan`` refused because what it was planned with is gone (a sink's
        watermark reset: ``delivered.DeliveryLostError``): the next run of its query plans
        afresh, as the error tells the user to, instead of reusing it up to its interval."""
        for key in [k for k, entry in self.entries.items() if entry.plan is plan]:
            del self.entries[key]

    def observe(self, plan: Plan, seconds: float, estimate: Estimate | None = None) -> None:
        """A run of ``plan`` took ``seconds``: a kept plan whose run diverges from its fastest,
        or which ``estimate`` (what is known now, this run included) prices above its
        runner-up, is due for a re-planning at its next run (see the module docstring)."""
        for entry in self.entries.values():
            if entry.plan is not plan:
                continue
            slow = (entry.fastest is not None and seconds > self.diverge * entry.fastest
                    and seconds - entry.fastest >= self.diverge_floor_seconds)
            entry.slow_runs = entry.slow_runs + 1 if slow else 0
            diverged = entry.slow_runs >= self.diverge_runs
            surpassed = (entry.runner_up is not None and estimate is not None
                         and estimate(plan) > self.surpass * estimate(entry.runner_up))
            if diverged or surpassed:
                entry.interval = self.replan_every  # a confirmation doubles from the start
                entry.uses = entry.interval
            entry.fastest = seconds if entry.fastest is None else min(entry.fastest, seconds)
            return
