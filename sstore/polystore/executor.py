"""Runs a plan: parallel fetches into the island, moves between engines, the final query.

The island is a fresh in-memory DuckDB per query: the fetched Arrow tables are registered in it
under the names the plan gave them and the final SQL runs over them, so the rows of the
fragments never leave Arrow. Its database has external access off (no files, no extensions)
and the final SQL is checked to be a plain query like every other read. Moves that are not caches
(Spark's temporary views) are dropped
when the query is done.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import duckdb
import pyarrow as pa

from sstore.base.duck import arrow, connect
from sstore.base.readonly import check_query
from sstore.base.sql import literal
from sstore.polystore import cache, delivered
from sstore.polystore.connectors import Connector, PostgresConnector, SparkConnector
from sstore.polystore.plan import ISLAND, Fetch, Move, Plan


def execute(plan: Plan, connectors: Mapping[str, Connector],
            refreshes: list[tuple[str, cache.Refresh]] | None = None) -> pa.Table:
    """Run ``plan``; ``refreshes`` (if given) receives (table, what its move did) per move.
    A plan with guards (a stream a sink delivers into another fragment) runs with the sinks'
    watermarks bound, again if a delivery committed while it ran (``delivered``); one that
    reads a sink's target without its stream first checks the target was not emptied."""
    if plan.checks:
        delivered.check_targets(plan, connectors)
    if plan.guards:
        return delivered.run_guarded(plan, connectors,
                                     lambda bound: _execute(bound, connectors, refreshes))
    return _execute(plan, connectors, refreshes)


def _execute(plan: Plan, connectors: Mapping[str, Connector],
             refreshes: list[tuple[str, cache.Refresh]] | None) -> pa.Table:
    fetches = [s for s in plan.steps if isinstance(s, Fetch)]
    moves = [s for s in plan.steps if isinstance(s, Move)]
    fetched: dict[str, pa.Table] = {}
    try:
        if fetches:
            with ThreadPoolExecutor(max_workers=len(fetches)) as pool:
                futures = {f.into: pool.submit(connectors[f.engine].fetch, f.sql)
                           for f in fetches}
                fetched = {name: fut.result() for name, fut in futures.items()}
        for move in moves:
            done = _move(move, connectors)
            if refreshes is not None:
                refreshes.append((move.table, done))
        if plan.final.engine == ISLAND:
            return run_in_island(plan.final.sql, fetched, plan.time_zone)
        if plan.time_zone:
            return connectors[plan.final.engine].fetch(plan.final.sql, time_zone=plan.time_zone)
        return connectors[plan.final.engine].fetch(plan.final.sql)
    finally:
        for move in moves:
            if move.cache_key is None:
                connectors[move.target].drop(move.table)


def _move(move: Move, connectors: Mapping[str, Connector]) -> cache.Refresh:
    """One move; a cached one is refreshed (incrementally where it can), never served as it
    was: the refresh asks the source what it holds now."""
    source, target = connectors[move.source], connectors[move.target]
    if move.cache_key is not None:
        return cache.refresh(move, source, target)
    if isinstance(target, SparkConnector) and isinstance(source, PostgresConnector):
        target.store_from_postgres(move.table, source.url, move.sql)  # Spark reads by JDBC
        return cache.Refresh(move.rows, True)
    return cache.Refresh(target.store(move.table, source.fetch(move.sql), mode="replace"), True)


_island: duckdb.DuckDBPyConnection | None = None
_island_lock = threading.Lock()


def run_in_island(sql: str, tables: Mapping[str, pa.Table], time_zone: str | None = None
                  ) -> pa.Table:
    """The final query over the fetched tables, on a cursor of its own: the names registered
    on it are this query's only. The in-memory database is opened once per process (opening
    one costs ~30 ms; a cursor, a fraction of a millisecond). ``time_zone``: the cursor's
    session zone (PostgreSQL's, from the plan)."""
    global _island
    check_query(sql, "duckdb")
    with _island_lock:
        if _island is None:
            _island = connect(":memory:", external_access=False)
        cursor = _island.cursor()
    try:
        if time_zone:
            cursor.execute(f"SET TimeZone = {literal(time_zone)}")
        for name, table in tables.items():
            cursor.register(name, table)
        return arrow(cursor, sql, large=True)
    finally:
        cursor.close()
