"""Measure the cost model's constants on this machine (``sstore polystore calibrate``).

Each constant is timed through the connector code the executor uses, on the rows the caller
passes (``sstore polystore calibrate`` and ``benchmarks.union_plans`` pass TPC-C ORDERS from
``sstore.workloads.tpcc.orders``: the polystore knows no workload, it sits below them): a
scratch streaming engine in a temporary directory and scratch tables in PostgreSQL's
``sstore_scratch`` schema (dropped afterwards; the connectors write nowhere else). Per-value
constants are (time - fixed) / values, from the median of a few repetitions; a negative
difference (noise on a quiet step) counts as zero. Spark is measured only when asked (it takes
a minute and starts a JVM).
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from sstore.base.errors import TerminalError
from sstore.engine import Engine
from sstore.polystore.connectors import (
    PostgresConnector,
    SparkConnector,
    StreamingConnector,
)
from sstore.polystore.cost import CostModel
from sstore.polystore.executor import run_in_island
from sstore.polystore.plan import ISLAND
from sstore.polystore.scratch import SCRATCH_SCHEMA, SPARK_SCRATCH_PREFIX

Progress = Callable[[str], None]
#: Creates the measuring table in the scratch streaming engine: (engine, table name, rows).
CreateTable = Callable[[Engine, str, pa.Table], None]
SCRATCH = f"{SCRATCH_SCHEMA}.calibration_orders"
SCRATCH_SQL = f'"{SCRATCH_SCHEMA}"."calibration_orders"'
SPARK_ORDERS = SPARK_SCRATCH_PREFIX + "calibration_orders"
SPARK_JDBC = SPARK_SCRATCH_PREFIX + "calibration_jdbc"
# The scan query names the columns unquoted, so that DuckDB, PostgreSQL and Spark SQL (where
# "x" is a string) all read the same columns: only lower-case plain names qualify.
PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def _median(work: Callable[[], object], times: int) -> float:
    samples = []
    for _ in range(times):
        t0 = time.perf_counter()
        work()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _per_value(total: float, fixed: float, values: int) -> float:
    return max(0.0, (total - fixed) / values)


def _per_value_and_row(wide: float, narrow: float, fixed: float, rows: int,
                       columns: int) -> tuple[float, float]:
    """Per value and per row, from fetching the rows whole (``wide``) and one column of them
    (``narrow``): wide - fixed = rows * (row + columns * value), narrow - fixed = rows * (row +
    value). With one column the two cannot be told apart: all of it counts per value."""
    whole = _per_value(wide, fixed, rows)        # seconds per row, all columns
    if columns < 2:
        return whole, 0.0
    one = _per_value(narrow, fixed, rows)        # seconds per row, one column
    value = max(0.0, (whole - one) / (columns - 1))
    return value, max(0.0, one - value)


def _load_rows(engine: Engine, table: str, rows: pa.Table) -> None:
    engine.load_table(table, rows)


def calibrate(url: str, data: pa.Table, repeats: int = 5, spark: bool = False,
              progress: Progress | None = None, create_table: CreateTable = _load_rows
              ) -> CostModel:
    """Measure every constant on ``data``; return the model (``CostModel.write`` stores it).

    ``data``: the measuring rows (a few hundred thousand make steady numbers; every column
    must have a type that ``max`` orders). ``create_table`` makes their table in the scratch
    streaming engine: by default from the rows' types; a workload passes its own DDL (keys,
    NOT NULL) so the engine's constants are measured on the table its queries meet."""
    if data.num_rows == 0 or data.num_columns == 0:
        raise TerminalError("calibration needs rows to measure with; got an empty table")
    odd = [c for c in data.column_names if not PLAIN_NAME.fullmatch(c)]
    if odd:
        raise TerminalError(f"calibration rows need lower-case plain column names "
                            f"([a-z_][a-z0-9_]*); these are not: {odd}")
    say = progress or (lambda _msg: None)
    values = data.num_rows * data.num_columns
    columns = data.column_names
    model = CostModel()
    folder = tempfile.mkdtemp(prefix="sstore-calibrate-")
    engine = Engine(os.path.join(folder, "calibrate.duckdb"))
    stream = StreamingConnector("streaming", engine)
    pg = PostgresConnector("postgres", url)
    try:
        say("streaming engine")
        create_table(engine, "orders", data)
        _measure_kind(model, "streaming", stream.fetch, stream.fingerprint,
                      lambda: stream.store(f"{SCRATCH_SCHEMA}.orders_copy", data),
                      lambda: stream.store(f"{SCRATCH_SCHEMA}.orders_tiny", data.slice(0, 1),
                                           note="calibration"),
                      "orders", columns, values, repeats)
        say("PostgreSQL")
        pg.store(SCRATCH, data)
        _measure_kind(model, "postgres", pg.fetch, pg.fingerprint,
                      lambda: pg.store(SCRATCH + "_copy", data),
                      lambda: pg.store(SCRATCH + "_tiny", data.slice(0, 1), note="calibration"),
                      SCRATCH_SQL, columns, values, repeats)
        say("island")
        _measure_island(model, data, values, repeats)
        say("parallel fetches")
        model.parallel_overlap = _overlap(stream, pg, repeats)
        if spark:
            say("Spark (starts a JVM)")
            _measure_spark(model, url, data, values)
    finally:
        for table in (SCRATCH, SCRATCH + "_copy", SCRATCH + "_tiny"):
            pg.drop(table)
        pg.close()
        engine.close()
        shutil.rmtree(folder, ignore_errors=True)
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    model.measured = (f"calibrated {when} on {platform.node()} ({os.cpu_count()} cpus), "
                      f"{data.num_rows:,} rows x {data.num_columns} columns"
                      + ("" if spark else "; Spark constants are defaults"))
    return model


def _measure_kind(model: CostModel, kind: str, fetch: Callable[[str], pa.Table],
                  fingerprint: Callable[[str], str],
                  store: Callable[[], int], store_tiny: Callable[[], int], table: str,
                  columns: list[str], values: int, repeats: int) -> None:
    fixed = _median(lambda: fetch("SELECT 1 AS one"), repeats * 4)
    model.fixed[kind] = fixed
    everything = _median(lambda: fetch(f"SELECT * FROM {table}"), repeats)
    narrow = _median(lambda: fetch(f"SELECT {columns[0]} FROM {table}"), repeats)
    model.fetch[kind], model.fetch_row[kind] = _per_value_and_row(
        everything, narrow, fixed, values // len(columns), len(columns))
    scan = _median(lambda: fetch(_scan_sql(columns, table)), repeats)
    model.process[kind] = _per_value(scan, fixed, 2 * values)
    model.fingerprint[kind] = _per_value(
        _median(lambda: fingerprint(f"SELECT * FROM {table}"), repeats), fixed, values)
    model.store_fixed[kind] = _median(store_tiny, repeats)
    model.load[kind] = _per_value(_median(store, max(2, repeats // 2)),
                                  model.store_fixed[kind], values)


def _scan_sql(columns: list[str], table: str, second: str | None = None) -> str:
    """A query that must read every value of two tables (or twice one) and returns one row."""
    aggregates = ", ".join(f"max({c}) AS m_{c}" for c in columns)  # PLAIN_NAME, checked
    return (f"SELECT {aggregates} FROM (SELECT * FROM {table} UNION ALL "
            f"SELECT * FROM {second or table}) AS u")


def _measure_island(model: CostModel, data: pa.Table, values: int, repeats: int) -> None:
    half = data.num_rows // 2
    parts = {"a": data.slice(0, half), "b": data.slice(half)}
    fixed = _median(lambda: run_in_island("SELECT 1 AS one", {}), repeats * 4)
    model.fixed[ISLAND] = fixed
    union = "SELECT * FROM a UNION ALL SELECT * FROM b"
    everything = _median(lambda: run_in_island(union, parts), repeats)
    scan = _median(lambda: run_in_island(_scan_sql(data.column_names, "a", "b"), parts),
                   repeats)
    model.process[ISLAND] = _per_value(scan, fixed, values)
    model.fetch[ISLAND] = _per_value(everything, scan, values)


def _overlap(stream: StreamingConnector, pg: PostgresConnector, repeats: int) -> float:
    """How much two fetches in parallel cost beyond the slower one, as a share of the faster
    one (0: perfect overlap; 1: none)."""
    a = lambda: stream.fetch("SELECT * FROM orders")
    b = lambda: pg.fetch(f"SELECT * FROM {SCRATCH_SQL}")
    ta, tb = _median(a, repeats), _median(b, repeats)

    def both() -> None:
        with ThreadPoolExecutor(max_workers=2) as pool:
            for fut in [pool.submit(a), pool.submit(b)]:
                fut.result()

    together = _median(both, repeats)
    shorter, longer = min(ta, tb), max(ta, tb)
    if shorter <= 0:
        return 0.0
    return min(1.0, max(0.0, (together - longer) / shorter))


def _measure_spark(model: CostModel, url: str, data: pa.Table, values: int) -> None:
    from migrators.spark_session import is_running
    t0 = time.perf_counter()
    running = is_running()
    connector = SparkConnector("spark")
    connector.spark  # noqa: B018 - starts the session
    if not running:
        model.spark_start = time.perf_counter() - t0
    fixed = _median(lambda: connector.fetch("SELECT 1 AS one"), 5)
    model.fixed["spark"] = fixed
    model.load["spark"] = _per_value(
        _median(lambda: (connector.store(SPARK_ORDERS, data), connector.fetch(
            f"SELECT count(*) FROM {SPARK_ORDERS}")), 3), 2 * fixed, values)
    model.fetch["spark"] = _per_value(_median(
        lambda: connector.fetch(f"SELECT * FROM {SPARK_ORDERS}"), 3), fixed, values)
    model.process["spark"] = _per_value(_median(
        lambda: connector.fetch(_scan_sql(data.column_names, SPARK_ORDERS)), 3), fixed,
        2 * values)
    pg = PostgresConnector("postgres", url)
    pg.store(SCRATCH, data)

    def jdbc_round() -> None:
        connector.store_from_postgres(SPARK_JDBC, url, f"SELECT * FROM {SCRATCH_SQL}")
        connector.fetch(f"SELECT count(*) FROM {SPARK_JDBC}")

    model.spark_jdbc = _per_value(_median(jdbc_round, 3), 2 * fixed, values)
    connector.drop(SPARK_ORDERS)
    connector.drop(SPARK_JDBC)
