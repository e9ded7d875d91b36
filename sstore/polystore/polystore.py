"""``Polystore``: one SQL entry point over the streaming engine, PostgreSQL and Spark.

How a query is answered:

1. The island syntax is taken apart (``syntax``): casts to run first, the SQL that remains.
2. The SQL is parsed (sqlglot) and the objects it names are looked up in the catalog; a name
   the catalog does not know is an error that lists the names it does.
3. If more than one engine is involved, each fragment's size is asked of its engine.
4. The planner rules (``rules.RULES``, in order) propose plans; moves that would reuse a cached
   copy are checked against their source (``cache.changes``: by what changed since the copy)
   and learn how many rows the copy already holds. A repeated query reuses its chosen plan
   for a few runs (``plancache``).
5. The cost model prices every plan; the cheapest feasible one runs (``executor``).

Read paths cannot write: every SQL part is checked to be a plain query before planning
(``sstore.base.readonly``) and again by each connector's ``fetch``; the only writes are casts and
cached moves, into sstore's own schemas (``scratch``), and a cast never replaces an existing
table unless the caller says ``replace=True``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Self

import pyarrow as pa
from sqlglot import exp

from sstore.engine import Engine
from sstore.polystore import cache, corrections, delivered, executor
from sstore.polystore.casts import Casts
from sstore.polystore.catalog import (
    Catalog,
    CatalogObject,
    EngineKind,
    Fragment,
    resolve_location,
)
from sstore.polystore.connectors import (
    Connector,
    PostgresConnector,
    SparkConnector,
    StreamingConnector,
)
from sstore.polystore.corrections import plan_key
from sstore.polystore.cost import CostModel
from sstore.polystore.learning import Learner, learned_path, learner_for
from sstore.polystore.meaning import kept_types
from sstore.polystore.plan import ISLAND, Move, Plan
from sstore.polystore.plancache import PlanCache
from sstore.polystore.planning import FragmentStats, PlanningInput
from sstore.polystore.probes import Probes
from sstore.polystore.proposals import ProposalCache, propose, runner_up, shape_key, with_cached
from sstore.polystore.rules import REWRITES
from sstore.polystore.rules.keep_meaning import runs_outside_postgres, without_tables
from sstore.polystore.sqltext import (
    QueryError,
    parse_shared,
    table_names,
)
from sstore.polystore.syntax import IslandQuery, parse_island
from sstore.storage.statefile import StateFileReader
from sstore.storage.streams import BATCH_COLUMN

GROWING_COLUMN = BATCH_COLUMN  # engine streams only grow; their copies can be topped up
UNKNOWN_ROWS = -1  # one engine: nothing to choose, so nothing is counted


class Polystore(Casts):
    """Queries over every engine of a catalog.

    ``catalog``: a ``Catalog`` or the path of its JSON file. ``engines``: live engines of this
    process by catalog name (a streaming engine that is running here must be passed, since its
    state file is locked while it runs; one opened here from its state file is opened
    read-only, with external access off: nothing is written into it). ``costs``: a
    ``CostModel`` or the path of calibrated constants (default: ``costs.json`` beside the
    catalog). ``replan_every``: a repeated query reuses its chosen plan for this many runs
    (1: plan every query afresh), doubled up to 8 times while re-planning confirms the choice
    (``plancache``). ``learn``: refit the constants from the measured times of the queries this
    polystore runs (``sstore.polystore.learning``): kept in ``costs.learned.json`` beside the
    constants file, so the next process starts from them (the constants file is not changed).
    """

    def __init__(self, catalog: Catalog | str | None = None, *,
                 engines: Mapping[str, Engine] | None = None,
                 costs: CostModel | str | None = None, dialect: str = "postgres",
                 memory_budget_bytes: int = 4 << 30, learn: bool = True,
                 replan_every: int = 10) -> None:
        self.catalog = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
        self.dialect = dialect
        self.memory_budget_bytes = memory_budget_bytes
        costs_path = None if isinstance(costs, CostModel) else (
            costs or self.default_costs_path())
        self.costs = costs if isinstance(costs, CostModel) else CostModel.read(costs_path)
        #: refits ``costs`` from the measured times of the plans ``query`` runs (None: off)
        self.learner: Learner | None = learner_for(self.costs) if learn else None
        #: where the learner's equations are kept between processes: beside calibrated
        #: constants read from a file (none with the defaults: nothing is written then)
        self.learned_path = (learned_path(costs_path) if learn and costs_path
                             and os.path.exists(costs_path) else None)
        self._unsaved = 0
        if self.learner is not None and self.learned_path is not None:
            self.learner.restore(self.learned_path, self.costs)
        self._measured: dict[tuple[str, str], float] = {}  # (sql, plan) -> last run, seconds
        #: chosen plans of repeated queries, reused for up to ``replan_every`` runs
        self.plan_cache = PlanCache(replan_every)
        #: the rules' proposals by query shape, re-stamped with fresh row counts (``proposals``)
        self.proposals = ProposalCache()
        self._connectors: dict[str, Connector] = {}
        for name, engine in (engines or {}).items():
            self._connectors[name] = StreamingConnector(name, engine)

    def default_costs_path(self) -> str | None:
        if self.catalog.path is None:
            return os.environ.get("SSTORE_COSTS")
        return os.environ.get("SSTORE_COSTS") or os.path.join(
            os.path.dirname(os.path.abspath(self.catalog.path)), "costs.json")

    # ------------------------------------------------------------------ registration
    def attach_engine(self, name: str, engine: Engine, discover: bool = True) -> list[str]:
        """Add a live streaming engine; register its tables and streams as objects."""
        self.catalog.add_engine(name, EngineKind.STREAMING, engine.path)
        self._connectors[name] = StreamingConnector(name, engine)
        return self.discover(name) if discover else []

    def add_state_file(self, name: str, path: str, discover: bool = True) -> list[str]:
        """Add a streaming engine that does not run in this process, by its state file; it is
        opened read-only (external access off) and never written. Registers its tables and
        streams."""
        self.catalog.add_engine(name, EngineKind.STREAMING, path)
        old = self._connectors.pop(name, None)
        if old is not None:
            old.close()
        return self.discover(name) if discover else []

    def add_postgres(self, name: str, url: str, schema: str | None = "public") -> list[str]:
        """Add a PostgreSQL database (``url`` or ``env:VAR``); register the tables of
        ``schema`` (None: register none now)."""
        self.catalog.add_engine(name, EngineKind.POSTGRES, url)
        self._connectors.pop(name, None)
        return self.discover(name, schema) if schema is not None else []

    def add_spark(self, name: str = "spark", master: str = "") -> None:
        """Make Spark available as an engine (its master URL; empty: ``SSTORE_SPARK_MASTER`` or
        ``local[*]``)."""
        self.catalog.add_engine(name, EngineKind.SPARK, master)

    def discover(self, engine: str, schema: str = "public") -> list[str]:
        """Register every table of ``engine`` (for PostgreSQL: of ``schema``) as an object."""
        connector = self.connector(engine)
        if isinstance(connector, PostgresConnector):
            found = connector.discover(schema)
        else:
            found = connector.discover()
        return self.catalog.register_many(engine, found)

    def split(self, name: str, fragments: Mapping[str, str], *, disjoint: bool = False
              ) -> CatalogObject:
        """Declare an object split across engines: ``{engine: physical name}``; the object is
        their UNION ALL, each row counted once. An engine stream that a sink delivers into a
        PostgreSQL fragment is read past the sink's watermark (found in ``sstore.watermarks``:
        ``delivered``); a stream and a PostgreSQL table that no watermark links are refused
        at query time unless ``disjoint=True``: the caller's word that no rows ever move
        between the fragments."""
        for i, (engine, physical) in enumerate(fragments.items()):
            columns = dict.fromkeys(self.connector(engine).columns(physical), "")
            self.catalog.register(name, engine, physical, columns, replace=(i == 0),
                                  disjoint=disjoint if i == 0 else None)
        return self.catalog.lookup(name)

    # ------------------------------------------------------------------ connectors
    def connector(self, name: str) -> Connector:
        if name in self._connectors:
            return self._connectors[name]
        entry = self.catalog.engine(name)
        connector: Connector
        if entry.kind is EngineKind.POSTGRES:
            connector = PostgresConnector(name, resolve_location(entry))
        elif entry.kind is EngineKind.SPARK:
            connector = SparkConnector(name, entry.location)
        else:
            connector = StreamingConnector(name, StateFileReader(entry.location))
        self._connectors[name] = connector
        return connector

    def close(self) -> None:
        self.save_learned()
        for connector in self._connectors.values():
            connector.close()
        self._connectors.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ queries
    def query(self, sql: str, *, plan: str | None = None, repeats: int = 1,
              replace: bool = False) -> pa.Table:
        """Answer ``sql`` (plain SQL over catalog names, or island syntax) as Arrow.

        ``plan`` forces a plan by name (as ``explain`` lists them) instead of the cheapest;
        ``repeats`` says how often this query is expected to run, so a cached migration may be
        worth its first cost. ``replace=True`` lets a ``bdcast`` replace the table an earlier
        cast of the same name made (without it, that is a ``CastExistsError``). ``EXPLAIN ...``
        returns the plans as one text column. Anything but a query is a
        ``ReadOnlyQueryError``."""
        stripped = sql.lstrip()
        if stripped[:8].lower() == "explain ":
            return pa.table({"plan": self.explain(stripped[8:], repeats=repeats).splitlines()})
        parsed = parse_island(sql)
        self._check_before_running(parsed)
        self._run_casts(parsed, replace)
        if parsed.call is not None:
            return self._call_procedure(*parsed.call)
        chosen = (self.choose(parsed, repeats) if plan is None
                  else self._choose(self.plans(parsed, repeats=repeats), plan))
        started = time.perf_counter()
        try:
            answer = executor.execute(chosen, self._connectors_for(chosen))
        except delivered.DeliveryLostError:
            self.plan_cache.forget(chosen)  # planned again at the next query (the error says)
            raise
        self.observe(chosen, time.perf_counter() - started, parsed.sql)
        return answer

    def choose(self, parsed: IslandQuery | str, repeats: int = 1) -> Plan:
        """The plan ``query`` runs for this query: the cheapest feasible one, or the one chosen
        for the same query a few runs ago (``plancache``: a repeated query is planned afresh
        every ``replan_every`` runs, less often while re-planning keeps confirming the choice,
        at once when a run diverges from the plan's earlier runs (``observe``) or a fragment
        left out as empty has rows)."""
        if isinstance(parsed, str):
            parsed = parse_island(parsed)
        key = PlanCache.key(f"{parsed.island}:{parsed.sql}", repeats,
                            (self.catalog, self.catalog.version))
        chosen = self.plan_cache.get(key, self._still_empty)
        if chosen is None:
            plans = self.plans(parsed, repeats=repeats)
            chosen = self._choose(plans, None)
            self.plan_cache.put(key, chosen, runner_up(plans, chosen))
        return chosen

    def _postgres_time_zone(self, engines: Mapping[str, object]) -> str | None:
        """The session time zone of the first PostgreSQL engine the query reads (None: it
        reads none): plans that run it elsewhere run it in that zone."""
        for name, entry in engines.items():
            if getattr(entry, "kind", None) is EngineKind.POSTGRES:
                connector = self.connector(name)
                if isinstance(connector, PostgresConnector):
                    return connector.time_zone()
        return None

    def _still_empty(self, engine: str, physical: str) -> bool:
        return self.connector(engine).is_empty(physical)

    def observe(self, plan: Plan, seconds: float, sql: str | None = None) -> None:
        """A run of ``plan`` took ``seconds``: remember it for ``explain`` (by ``sql``), let
        the learner refit the constants and this plan's correction from it, then tell the
        plan cache, which re-plans the next run if the choice now looks wrong (``plancache``:
        it prices the plan and its runner-up with what was just learnt)."""
        plan.measured = seconds
        if sql is not None:
            self._measured[(sql, plan.name)] = seconds
        if self.learner is None:
            self.plan_cache.observe(plan, seconds)
            return
        refitted = self.learner.observe(plan.cost_terms, seconds, self.costs,
                                        key=plan.learn_key or None)
        self._unsaved += 1
        if refitted:
            self.save_learned()
        self.plan_cache.observe(plan, seconds, self.estimate_now)  # with this run learnt

    def estimate_now(self, plan: Plan) -> float:
        """``plan``'s estimated seconds with the constants and corrections as they are now
        (its counts as when it was priced)."""
        seconds = corrections.modelled(plan.cost_terms, self.costs)
        if self.learner is not None and plan.learn_key:
            seconds *= self.learner.corrections(self.costs).factor(plan.learn_key)
        return seconds

    def save_learned(self) -> None:
        """Keep what the learner has measured for the next process (``learning``): after each
        refit and when the polystore closes. Nothing without a constants file."""
        if self.learner is not None and self.learned_path is not None and self._unsaved:
            self.learner.save(self.learned_path)
            self._unsaved = 0

    def explain(self, sql: str, repeats: int = 1) -> str:
        """Every plan the rules propose, cheapest first, with estimated costs and SQL."""
        parsed = parse_island(sql)
        self._check_before_running(parsed)
        lines = []
        for cast in parsed.casts:
            lines.append(f"first: bdcast into {cast.engine} as {cast.name} (runs before "
                         f"planning the rest)")
        if parsed.casts:
            return "\n".join(lines + ["(plan the remaining query after the casts have run)"])
        if parsed.call is not None:
            return f"call procedure {parsed.call[0]} in the streaming engine"
        plans = self.plans(parsed, repeats=repeats)
        chosen = self._choose(plans, None)
        lines.append(f"cost model: {self.costs.measured}")
        for plan in plans:
            plan.measured = self._measured.get((parsed.sql, plan.name))
            mark = "* chosen" if plan is chosen else "  "
            lines.append(f"{mark} {plan.describe()}")
        return "\n".join(lines)

    def plans(self, parsed: IslandQuery | str, repeats: int = 1, rewrite: bool = True
              ) -> list[Plan]:
        """The priced candidate plans, cheapest first. ``rewrite=False`` skips the rewrites
        (benchmarks use it to time every plan even where a rewrite makes them moot)."""
        if isinstance(parsed, str):
            parsed = parse_island(parsed)
        self._check_sql(parsed.sql)
        tree = parse_shared(parsed.sql, self.dialect)
        if not table_names(tree):  # SELECT 1, now(): nothing to fetch, the island answers
            return [self._without_tables(tree)]
        objects = self._objects(tree, parsed.island)
        engines = {name: self.catalog.engine(name)
                   for obj in objects for name in obj.engines()}
        for entry in self.catalog.engines.values():
            if entry.kind is EngineKind.SPARK:
                engines.setdefault(entry.name, entry)
        probes = Probes(self.connector)
        stats = self._stats(objects, probes)
        read_only = frozenset(name for name, c in self._connectors.items()
                              if isinstance(c, StreamingConnector) and c.read_only)
        inp = PlanningInput(tree, tuple(objects), engines, stats, read_only=read_only,
                            memory_budget_bytes=self.memory_budget_bytes,
                            kept_columns=kept_types(probes.types))
        links = delivered.links(inp, self.connector)  # streams a sink delivers: read past it
        if links:
            inp = replace(inp, delivered=links)
        if rewrite:
            for step in REWRITES:
                inp = step(inp)
        kept = {f for _obj, _i, f in inp.fragments()}
        pruned = tuple((f.engine, f.physical) for obj in objects for f in obj.fragments
                       if f not in kept)
        shape = shape_key(f"{parsed.island}:{self.dialect}:{parsed.sql}", inp)
        candidates = self.proposals.get(shape, inp)
        if candidates is None:
            candidates = propose(inp)
            self.proposals.put(shape, candidates)
        zone = self._postgres_time_zone(engines)
        for plan in candidates:
            plan.time_zone = zone if runs_outside_postgres(plan, engines) else None
            plan.pruned = pruned
            plan.guards = tuple(g for g in links.values() if delivered.uses(plan, g))
            plan.checks = tuple(  # the target read without its stream: is it still whole?
                g for g in links.values() if g not in plan.guards
                and Fragment(g.engine, g.target) in kept)
        cached = self._cached(candidates, probes)
        if cached:  # what the rules would propose knowing it (they read only cached_rows)
            candidates = [with_cached(plan, cached) for plan in candidates]
        kinds = {name: entry.kind.value for name, entry in engines.items()}
        kinds[ISLAND] = ISLAND
        from migrators.spark_session import is_running
        running = is_running()
        query = f"{parsed.island}:{parsed.sql}"
        for plan in candidates:
            self.costs.price(plan, kinds, spark_running=running, repeats=repeats)
            plan.learn_key = plan_key(query, plan.name)
        if self.learner is not None:  # what each plan of this query measured against its price
            corrections.apply(candidates, self.learner.corrections(self.costs))
        return sorted(candidates, key=lambda p: (p.cost, p.name))

    def _without_tables(self, tree: exp.Expression) -> Plan:
        """The priced plan of a query that reads no table (``rules.keep_meaning``)."""
        plan = without_tables(tree, self.catalog.engines)
        engine = plan.final.engine
        kind = ISLAND if engine == ISLAND else self.catalog.engine(engine).kind.value
        return self.costs.price(plan, {engine: kind})

    def run_plan(self, plan: Plan, refreshes: list[Any] | None = None) -> pa.Table:
        """Execute a plan from ``plans`` (benchmarks time each plan this way); ``refreshes``
        receives (cache table, ``cache.Refresh``) for each move it made."""
        return executor.execute(plan, self._connectors_for(plan), refreshes)

    # ------------------------------------------------------------------ internals
    def _objects(self, tree: exp.Expression, island: str) -> list[CatalogObject]:
        names = table_names(tree)
        if any(self.catalog.find(n) is None for n in names):
            self._rediscover()  # a table a procedure created since the engine was attached
        objects = [self.catalog.lookup(name) for name in names]
        if island != "streaming":
            return objects
        streaming = []
        for obj in objects:
            frags = [f for f in obj.fragments
                     if self.catalog.engine(f.engine).kind is EngineKind.STREAMING]
            if not frags:
                raise QueryError(f"bdstream: {obj.name!r} has no part in a streaming engine")
            streaming.append(CatalogObject(obj.name, frags, obj.columns))
        return streaming

    def _rediscover(self) -> None:
        """Register the tables and streams that live streaming engines have gained."""
        for name, connector in self._connectors.items():
            if isinstance(connector, StreamingConnector) and name in self.catalog.engines:
                self.catalog.register_many(name, connector.discover())

    def _stats(self, objects: list[CatalogObject], probes: Probes
               ) -> dict[Fragment, FragmentStats]:
        """Each fragment's columns; over several engines also its rows and whether it grows by
        batch (an engine stream, or a PostgreSQL table a sink appends to: its copies are topped
        up by batch and their freshness is priced by what changed), one question per fragment
        (``probes``)."""
        engines = {f.engine for obj in objects for f in obj.fragments}
        stats = {}
        # PostgreSQL first: its notes carry the watermarks an engine stream's probe asks about
        fragments = [frag for obj in objects for frag in obj.fragments]
        owners = {frag: obj for obj in objects for frag in obj.fragments}
        for frag in sorted(fragments, key=lambda f: self.catalog.engine(f.engine).kind
                           is not EngineKind.POSTGRES):
            if len(engines) > 1:
                columns, rows, grows = self._describe(probes, owners[frag], frag)
                stats[frag] = FragmentStats(rows, columns, GROWING_COLUMN if grows else None)
                continue
            columns = self.connector(frag.engine).columns(frag.physical)
            stats[frag] = FragmentStats(UNKNOWN_ROWS, columns, None)
        return {frag: stats[frag] for frag in fragments}

    def _describe(self, probes: Probes, obj: CatalogObject, frag: Fragment
                  ) -> tuple[list[str], int, bool]:
        """``probes.describe`` of one fragment; a sink's target that no longer exists is
        ``TargetDroppedError`` (naming the sink and the lost batches), not PostgreSQL's
        ``UndefinedTable``."""
        try:
            return probes.describe(frag.engine, frag.physical, GROWING_COLUMN)
        except Exception as exc:
            import psycopg  # loaded where PostgreSQL is asked anyway
            if isinstance(exc, psycopg.errors.UndefinedTable):
                delivered.refuse_dropped_fragment(obj, frag,
                                                  lambda e: self.catalog.engine(e).kind,
                                                  self.connector)
            raise

    def _cached(self, plans: list[Plan], probes: Probes) -> dict[str, int]:
        """Cache key -> rows its copy already holds, up to date (asked of both engines: a
        note and a watermark, or a fingerprint of a source that is not growing; the notes of
        one engine in one question, see ``probes``)."""
        found: dict[str, int] = {}
        for plan in plans:
            for step in plan.steps:
                if isinstance(step, Move) and step.cache_key and step.cache_key not in found:
                    found[step.cache_key] = cache.changes(
                        step, probes.view(step.source), probes.view(step.target)
                    ).cached_rows
        return {k: v for k, v in found.items() if v}

    def _choose(self, plans: list[Plan], name: str | None) -> Plan:
        if name is not None:
            for plan in plans:
                if plan.name == name:
                    return plan
            raise QueryError(f"no plan named {name!r}; the plans are: "
                             f"{', '.join(p.name for p in plans)}")
        feasible = [p for p in plans if p.feasible and not math.isinf(p.cost)]
        if not feasible:
            raise QueryError("no feasible plan: " + "; ".join(f"{p.name}: {p.why_not}"
                                                               for p in plans))
        return feasible[0]

    def _connectors_for(self, plan: Plan) -> dict[str, Connector]:
        linked = plan.guards + plan.checks  # their watermarks and their streams' GC marks
        names = plan.engines() | {g.engine for g in linked} | {g.stream_engine for g in linked}
        return {name: self.connector(name) for name in names if name != ISLAND}

    def _answer(self, parsed: IslandQuery) -> pa.Table:
        chosen = self._choose(self.plans(parsed), None)
        return executor.execute(chosen, self._connectors_for(chosen))
