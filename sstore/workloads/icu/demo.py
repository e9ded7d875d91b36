"""``sstore icu demo``'s library side: generate, stream, alert, migrate, check.

The command (``sstore.cli.icu``) only shows what this reports: each alert as the engine
commits it (pushed by ``Engine.subscribe``), then the counts and the verdict against the
generator's ground truth.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from migrators.sink_runner import SinkGroup
from sstore.base.sql import one_value
from sstore.engine import Engine
from sstore.workloads.icu import dataflow, run
from sstore.workloads.icu.generator import Generated, generate
from sstore.workloads.tpcdi.warehouse import drop_warehouse

DEMO_RATE = 12.0  # episodes per patient per hour: a demo should show a few


@dataclass
class DemoReport:
    generated: Generated
    counts: dict[str, int]
    verdict: run.Verdict
    alerts: list[dict[str, Any]]
    warehouse_rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def run_demo(url: str, patients: int, seconds: int, *, seed: int = 0, speed: float = 60.0,
             schema: str = "icu_demo", state: str | None = None,
             on_alert: Callable[[dict[str, Any]], None] | None = None,
             on_batch: Callable[[int, int], None] | None = None,
             on_engine: Callable[[Engine], object] | None = None) -> DemoReport:
    """Stream ``patients`` x ``seconds`` of vital signs at ``speed`` times real time (0: as
    fast as it goes) into the warehouse ``schema``. Without ``state`` the engine's state is a
    temporary file and the schema is dropped and built anew; with one, a run resumes."""
    gen = generate(patients, seconds, seed=seed, rate_per_hour=DEMO_RATE)
    with tempfile.TemporaryDirectory(prefix="sstore-icu-") as tmp:
        if state is None:
            drop_warehouse(url, schema)
        engine = Engine(state or os.path.join(tmp, "icu.duckdb"))
        try:
            dataflow.declare(engine)
            sinks = run.make_sinks(engine, url, schema)
            if on_alert is not None:
                tell = on_alert

                def tell_rows(_batch: int, rows: Any) -> None:
                    for row in rows.to_pylist():
                        tell(row)
                engine.subscribe(dataflow.ALERTS, tell_rows)
            if on_engine is not None:
                on_engine(engine)
            began = time.perf_counter()
            group = SinkGroup(sinks)  # a batch's rows of the four tables arrive together
            group.attach()
            try:
                run.feed(engine, gen.batches, on_batch,
                         pace=None if speed <= 0 else 1.0 / speed)
                if not group.flush(timeout=120):
                    late = [f"{s.table}: {s.last_error}" for s in sinks if s.last_error]
                    raise TimeoutError(f"the sinks did not catch up: {late}")
            finally:
                group.detach()
            alerts = run.alert_rows(engine)
            report = DemoReport(gen, run.counts(engine), run.match(alerts, gen.episodes),
                                alerts, seconds=time.perf_counter() - began)
        finally:
            engine.close()
    with psycopg.connect(url) as con:
        for t in run.targets(schema):
            schema_name, table = t.table.split(".")
            report.warehouse_rows[t.table] = int(one_value(con.execute(
                f'SELECT count(*) FROM "{schema_name}"."{table}"').fetchone()))
    return report
