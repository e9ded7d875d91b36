"""The demo: a whole TPC-DI DimTrade run, streaming, then the polystore over what it left.

1. Generate a small TPC-DI data set and build the dimensions (Spark) into a fresh warehouse
   schema.
2. Stream Batch1 and Batch2 through the five stored procedures into PostgreSQL (exactly once).
3. Stream Batch3 through the dataflow but keep its results in the engine: the freshest trades
   and alerts are where S-Store keeps them before migration.
4. Two cross-island queries: alerts per batch over ``alerts`` (split: the engine's fresh rows
   UNION ALL the warehouse's), and Batch3's commissions per broker (the engine's trade
   changes joined with the warehouse's DimBroker). The planner picks where each runs.
5. Migrate Batch3; the same UNION now runs in PostgreSQL alone; the TPC-DI audit passes.

Everything the demo shows comes from the library (``StreamingDimTrade``, ``Polystore``,
``run_audit``); this module only orders the steps and prints.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from sstore.engine import Engine
from sstore.polystore import Polystore

Say = Callable[[str], None]
Progress = Callable[[str, int, int], None]

ALERTS_PER_BATCH = ("SELECT batchid, messagetype, count(*) AS alerts FROM alerts "
                    "GROUP BY batchid, messagetype ORDER BY batchid, messagetype")
FRESH_COMMISSIONS = (
    "SELECT b.firstname || ' ' || b.lastname AS broker, count(*) AS trades, "
    "sum(t.commission) AS commission FROM fresh_trades AS t JOIN dimbroker AS b "
    "ON t.sk_brokerid = b.sk_brokerid WHERE t.status = 'Completed' "
    "GROUP BY b.firstname, b.lastname ORDER BY commission DESC, broker LIMIT 5")

QUESTIONS = (
    ("Alerts per batch: the engine's fresh rows UNION ALL the warehouse's", ALERTS_PER_BATCH),
    ("Batch3 commissions per broker: the engine's trades JOIN the warehouse's DimBroker",
     FRESH_COMMISSIONS),
)


@dataclass
class QueryShown:
    title: str
    sql: str
    plan: str
    rows: pa.Table
    seconds: float


@dataclass
class DemoReport:
    phases: dict[str, float] = field(default_factory=dict)
    queries: list[QueryShown] = field(default_factory=list)
    audit: object | None = None


@contextmanager
def _timed(report: DemoReport, phase: str) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    report.phases[phase] = time.perf_counter() - t0


def run_demo(url: str, workdir: str | None = None, scale_factor: float = 0.03,
             batch_size: int = 500, schema: str = "tpcdi_demo",
             progress: Progress | None = None, say: Say | None = None,
             show: Callable[[QueryShown], None] | None = None,
             on_engine: Callable[[Engine], object] | None = None) -> DemoReport:
    """Run the demo against the PostgreSQL at ``url`` (schema ``schema`` is rebuilt).
    ``on_engine`` is called with the streaming engine once it exists (``sstore tpcdi demo
    --serve`` serves it from there)."""
    from migrators.spark_session import get_spark
    from sstore.workloads.tpcdi import dimensions
    from sstore.workloads.tpcdi.audit import run_audit
    from sstore.workloads.tpcdi.generator.build import generate
    from sstore.workloads.tpcdi.streaming.events import (
        batch1_events,
        incremental_events,
    )
    from sstore.workloads.tpcdi.streaming.pipeline import StreamingDimTrade
    from sstore.workloads.tpcdi.warehouse import create_warehouse, drop_warehouse

    tell = say or (lambda _msg: None)
    folder = Path(workdir or tempfile.mkdtemp(prefix="sstore-demo-"))
    data = folder / "data"
    report = DemoReport()
    with _timed(report, "generate"):
        tell(f"Generating TPC-DI source files, scale factor {scale_factor}, into {data}")
        if not (data / "Batch1").exists():
            generate(scale_factor, data)
        drop_warehouse(url, schema)
        create_warehouse(url, schema)
    state = str(folder / "engine.duckdb")
    for stale in (state, state + ".wal"):
        if os.path.exists(stale):
            os.remove(stale)
    run = StreamingDimTrade(data, url, state, schema, batch_size, progress)
    try:
        if on_engine is not None:
            on_engine(run.engine)
        spark = get_spark()
        with _timed(report, "dimensions (Spark)"):
            tell("Building the dimensions with Spark (the first job starts a JVM)")
            dimensions.build_historical(spark, data, url, schema)
            run.refresh_lookups()
        with _timed(report, "Batch1 + Batch2 streamed into the warehouse"):
            tell("Streaming Batch1 (historical) and Batch2 through the five procedures")
            with run.attached():
                run.stream(batch1_events(data), "Batch1 trades")
            run.run_incremental(2, spark)
        with _timed(report, "Batch3 streamed, kept in the engine"):
            tell("Streaming Batch3, keeping its results in the engine (not migrated yet)")
            dimensions.apply_batch(spark, data, url, schema, 3)
            run.refresh_lookups()
            run.stream(incremental_events(data, 3), "Batch3 trades", migrate=False)
            run.engine.collect_garbage()
        with _timed(report, "cross-island queries"):
            ps = _polystore(folder, run, url, schema)
            for title, sql in QUESTIONS:
                report.queries.append(_ask(ps, title, sql, show))
        with _timed(report, "Batch3 migrated, audit"):
            tell("Migrating Batch3 into the warehouse, exactly once")
            with run.attached():
                run.flush()
            run.engine.collect_garbage()
            report.queries.append(_ask(ps, "The same UNION after the migration",
                                       ALERTS_PER_BATCH, show))
            ps.close()
            report.audit = run_audit(url, schema, data)
    finally:
        run.close()
    return report


def _polystore(folder: Path, run: object, url: str, schema: str) -> Polystore:
    """The warehouse first (its names are the canonical ones), then the live engine: its
    lookup replicas keep to engine-qualified names, its streams register."""
    catalog = folder / "catalog.json"
    if catalog.exists():
        catalog.unlink()
    engine = run.engine  # type: ignore[attr-defined]
    ps = Polystore(str(catalog))
    ps.add_postgres("warehouse", url, schema)
    ps.attach_engine("engine", engine)
    ps.split("alerts", {"engine": "dimessages_out", "warehouse": f"{schema}.dimessages"})
    ps.catalog.register("fresh_trades", "engine", "dimtrade_changes")
    return ps


def _ask(ps: Polystore, title: str, sql: str, show: Callable[[QueryShown], None] | None
         ) -> QueryShown:
    chosen = ps.plans(sql)[0]
    t0 = time.perf_counter()
    rows = ps.run_plan(chosen)
    shown = QueryShown(title, sql, f"{chosen.name} (estimated {chosen.cost * 1000:.0f} ms)",
                       rows, time.perf_counter() - t0)
    if show is not None:
        show(shown)
    return shown
