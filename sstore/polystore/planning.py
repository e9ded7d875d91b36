"""What the planner's rules see: the query tree, the catalog entries it names, their sizes and
what is already cached. Rules are pure functions of a ``PlanningInput``; everything that needs an
engine (counting rows, checking caches) happens before, in ``Polystore``.

Engine differences the rules need are declared in ``TRAITS`` (one row per engine kind), not
tested for in the rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from sstore.polystore.catalog import CatalogObject, EngineEntry, EngineKind, Fragment
from sstore.polystore.plan import Delivered
from sstore.polystore.scratch import CACHE_SCHEMA, SPARK_CACHE_PREFIX
from sstore.polystore.sqltext import DIALECTS


@dataclass(frozen=True)
class KindTraits:
    accepts_moves: bool       # may a plan copy other engines' rows into it (a cast target)?
    cache_prefix: str         # where cached copies live in it (sstore's own: see scratch)
    executes_plans: bool      # may a plan run its final query there over moved inputs?


TRAITS: Mapping[EngineKind, KindTraits] = {
    EngineKind.STREAMING: KindTraits(accepts_moves=True, cache_prefix=f"{CACHE_SCHEMA}.",
                                     executes_plans=True),
    EngineKind.POSTGRES: KindTraits(accepts_moves=True, cache_prefix=f"{CACHE_SCHEMA}.",
                                    executes_plans=True),
    EngineKind.SPARK: KindTraits(accepts_moves=True, cache_prefix=SPARK_CACHE_PREFIX,
                                 executes_plans=True),
}


@dataclass(frozen=True)
class FragmentStats:
    rows: int
    columns: list[str]
    growing_column: str | None = None   # ``_batch_id`` for an engine stream: append-only


@dataclass(frozen=True)
class PlanningInput:
    tree: exp.Expression
    objects: tuple[CatalogObject, ...]
    engines: Mapping[str, EngineEntry]
    stats: Mapping[Fragment, FragmentStats]
    cached: Mapping[str, int] = field(default_factory=dict)  # cache key -> rows still valid
    read_only: frozenset[str] = frozenset()  # engines no plan may write to
    memory_budget_bytes: int = 4 << 30   # what the island may hold in this process
    #: an engine stream a sink delivers into another fragment of its object -> where: its
    #: reads compare ``_batch_id`` with the guard's placeholder (the sink's watermark, bound
    #: when the plan runs: ``sstore.polystore.delivered``)
    delivered: Mapping[Fragment, Delivered] = field(default_factory=dict)
    #: column name -> why another engine would change its values' meaning (a ``char(n)``
    #: of a PostgreSQL fragment: ``meaning.kept_types``); plans that run a query naming it
    #: outside PostgreSQL are not proposed (``rules.keep_meaning``)
    kept_columns: Mapping[str, str] = field(default_factory=dict)

    def dialect(self, engine: str) -> str:
        return DIALECTS[self.engines[engine].kind]

    def kind(self, engine: str) -> EngineKind:
        return self.engines[engine].kind

    def fragments(self) -> list[tuple[CatalogObject, int, Fragment]]:
        return [(obj, i, frag) for obj in self.objects for i, frag in enumerate(obj.fragments)]

    def engines_used(self) -> list[str]:
        used: list[str] = []
        for _, _, frag in self.fragments():
            if frag.engine not in used:
                used.append(frag.engine)
        return used

    def input_rows(self) -> int:
        return sum(max(0, self.stats[f].rows) for _, _, f in self.fragments())

    def columns_of(self, obj: CatalogObject) -> list[str]:
        """The object's columns: those every fragment has, in the first fragment's order (an
        engine stream's ``_batch_id`` is bookkeeping its PostgreSQL part need not have)."""
        lists = [self.stats[f].columns for f in obj.fragments if f in self.stats]
        if not lists:
            return list(obj.columns)
        return [c for c in lists[0] if all(c in other for other in lists[1:])]


def cache_key(obj: CatalogObject, fragment: Fragment, target: str) -> str:
    """Names the cached copy of one fragment in one target engine."""
    return f"{obj.name}__{fragment.engine}__to__{target}"


def cache_table(kind: EngineKind, key: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in key.lower())
    return TRAITS[kind].cache_prefix + safe
