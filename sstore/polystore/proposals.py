"""Proposals kept by query shape: a repeated query runs the rule pipeline once, then only its
row counts are brought up to date.

Why: the rules print every candidate's SQL (sqlglot copies, rewrites and prints trees), a few
milliseconds per query, as much as a small query costs to run; a dashboard query replanned every
few runs paid it every time. What the rules propose depends on the fragments' row counts only
through the steps' ``rows``, the final query's input and output rows and the island's memory
check (``pull_into_island.island_fit``). Everything else (which plans, their SQL, cache keys)
is a function of the *shape* (``shape_key``): the query text and dialect, the catalog entries
it names, the fragments' columns and growing columns, which fragments are left (an empty one is
pruned before the rules run), which engines are read-only and the memory budget. So the
proposals are kept by shape and, on a hit, re-stamped with the new counts (``with_rows``): the
plans the rules would propose from the new input. tests/polystore/test_planner_golden.py checks
that for every fixture; a step ``with_rows`` cannot trace to its fragment is a miss (the rules run).

Nothing needs invalidating: a catalog change, a re-split object or a changed column gives
another key. The rules stay pure; this is memoisation of a pure function, keyed by all it reads.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, replace

from sstore.polystore.catalog import Fragment
from sstore.polystore.plan import Fetch, Move, Plan, Step
from sstore.polystore.planning import PlanningInput, cache_key
from sstore.polystore.rules import CHECKS, RULES
from sstore.polystore.rules.common import fragment_name
from sstore.polystore.rules.pull_into_island import island_fit
from sstore.polystore.scratch import SPARK_SCRATCH_PREFIX
from sstore.polystore.sqltext import QueryError, output_rows

ShapeKey = tuple[Hashable, ...]


def shape_key(query: str, inp: PlanningInput) -> ShapeKey:
    """Everything the rules read but the row counts (and ``cached``, which the planner sets
    after proposing: ``with_cached``). ``query``: the query text with its island
    and dialect (``inp.tree`` is parsed from it)."""
    objects = tuple((o.name, tuple(o.fragments), tuple(o.columns.items()), o.disjoint)
                    for o in inp.objects)
    stats = tuple((f, tuple(inp.stats[f].columns), inp.stats[f].growing_column,
                   inp.stats[f].rows == 0)
                  for _o, _i, f in inp.fragments() if f in inp.stats)
    engines = tuple(sorted((n, e.kind.value, e.location) for n, e in inp.engines.items()))
    delivered = tuple(sorted((f.engine, f.physical, d.placeholder, d.engine, d.target)
                             for f, d in inp.delivered.items()))
    return (query, objects, stats, engines, tuple(sorted(inp.read_only)),
            inp.memory_budget_bytes, delivered, tuple(sorted(inp.kept_columns.items())))


def with_rows(plan: Plan, inp: PlanningInput) -> Plan | None:
    """``plan`` (proposed from an input of the same shape) with the row counts of ``inp``; None
    when a step cannot be traced to its fragment."""
    by_name = _fragments_by_name(inp)
    steps: list[Step] = []
    for step in plan.steps:
        if isinstance(step, Move) and step.cache_key is not None:
            fragment = by_name.get(("cache", step.cache_key))
        else:
            fragment = by_name.get(("name", step.into if isinstance(step, Fetch) else step.table))
        if fragment is None or fragment not in inp.stats:
            return None
        steps.append(replace(step, rows=inp.stats[fragment].rows))
    rows = inp.input_rows()
    final = replace(plan.final, input_rows=rows, output_rows=output_rows(inp.tree, rows))
    feasible, why_not = plan.feasible, plan.why_not
    if plan.rule == "pull_into_island":
        feasible, why_not = island_fit([s for s in steps if isinstance(s, Fetch)],
                                       inp.memory_budget_bytes)
    return Plan(plan.name, plan.rule, tuple(steps), final, feasible=feasible, why_not=why_not)


def _fragments_by_name(inp: PlanningInput) -> dict[tuple[str, str], Fragment]:
    """Each fragment by the names the rules give its steps: its cache key in every engine, and
    the name it is fetched or moved under (``fragment_name``, with and without Spark's prefix)."""
    found: dict[tuple[str, str], Fragment] = {}
    for obj, i, fragment in inp.fragments():
        for prefix in ("", SPARK_SCRATCH_PREFIX):
            found[("name", fragment_name(obj, i, prefix))] = fragment
        for target in inp.engines:
            found[("cache", cache_key(obj, fragment, target))] = fragment
    return found


def pristine(plan: Plan) -> Plan:
    """A copy of a freshly proposed plan that shares no mutable state with it (pricing and
    ``pruned`` are set on the copies handed out, never on the kept one)."""
    return Plan(plan.name, plan.rule, plan.steps, plan.final, feasible=plan.feasible,
                why_not=plan.why_not)


@dataclass
class ProposalCache:
    """Proposals by shape (``shape_key``), at most ``size`` of them, oldest dropped first."""

    size: int = 256
    entries: dict[ShapeKey, list[Plan]] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0

    def get(self, key: ShapeKey, inp: PlanningInput) -> list[Plan] | None:
        kept = self.entries.get(key)
        if kept is not None:
            fresh = [with_rows(plan, inp) for plan in kept]
            if all(p is not None for p in fresh):
                self.hits += 1
                return [p for p in fresh if p is not None]
        self.misses += 1
        return None

    def put(self, key: ShapeKey, plans: list[Plan]) -> None:
        self.entries[key] = [pristine(p) for p in plans]
        while len(self.entries) > self.size:
            del self.entries[next(iter(self.entries))]

    def clear(self) -> None:
        self.entries.clear()


def runner_up(plans: list[Plan], chosen: Plan) -> Plan | None:
    """The cheapest feasible plan other than ``chosen`` (``plans`` cheapest first), or None:
    what the plan cache compares the chosen plan with as its runs are learnt."""
    for plan in plans:
        if plan is not chosen and plan.feasible and not math.isinf(plan.cost):
            return plan
    return None


def propose(inp: PlanningInput) -> list[Plan]:
    """Every plan the rules propose for ``inp``, through the checks (``rules.CHECKS``)."""
    plans: list[Plan] = []
    for rule in RULES:
        plans.extend(rule(inp))
    if not plans:
        raise QueryError("no rule could plan this query")
    for check in CHECKS:
        plans = check(inp, plans)
    return plans


def with_cached(plan: Plan, cached: Mapping[str, int]) -> Plan:
    """``plan`` with each cached move's ``cached_rows`` set: the same plan the rules propose
    from a ``PlanningInput`` whose ``cached`` is ``cached`` (rule ``migrate_then_run`` reads
    it for that field only; tests/polystore/test_planner_golden.py checks the two agree), without
    printing every plan's SQL again."""
    steps = tuple(replace(s, cached_rows=cached.get(s.cache_key, 0))
                  if isinstance(s, Move) and s.cache_key else s for s in plan.steps)
    return replace(plan, steps=steps)
