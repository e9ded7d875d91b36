"""Streaming DimTrade end to end: dimensions, lookup copies, the dataflow, the warehouse sinks.

1. The dimensions are built in PySpark (``sstore.workloads.tpcdi.dimensions``), the same code the
   Spark pipeline uses, so both pipelines look trades up in identical dimension rows.
2. The lookups the procedures need are replicated from PostgreSQL into the engine.
3. Sinks attach to the dataflow's outputs: DimTrade changes merge into ``<schema>.dimtrade`` by
   trade id, alerts append to ``<schema>.dimessages``, rejects to ``<schema>.rejects``; each
   exactly once (binary COPY + watermark per PostgreSQL transaction).
4. Batch1 streams as time-ordered trade events in engine batches of ``batch_size``; then, per
   incremental batch, the dimension changes are applied, the lookups refreshed, and the batch's
   Trade.txt streams through.

Engine batch-ids are derived from the data (Batch1 chunk k is batch k; the incremental batches
follow), so running again on the same state file re-sends only no-ops: exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from migrators.engine_to_postgres import StreamToPostgres
from migrators.postgres import Session, copy_arrow
from migrators.registry import cast
from sstore.engine import Engine
from sstore.sql import qualified
from sstore.workloads.tpcdi.streaming.events import BatchEvents, batch1_events, \
    incremental_events
from sstore.workloads.tpcdi.streaming.procedures import LOOKUPS, declare

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass
class StreamingReport:
    batch_size: int
    events: int = 0
    engine_batches: int = 0
    file_rejects: int = 0
    phases: dict[str, float] = field(default_factory=dict)
    batch_latencies: list[float] = field(default_factory=list)  # ingest -> in PostgreSQL

    @property
    def seconds(self) -> float:
        return sum(self.phases.values())


class StreamingDimTrade:
    """One streaming run over a data set into one warehouse schema."""

    def __init__(self, data_dir: str | Path, url: str, state_path: str, schema: str = "tpcdi",
                 batch_size: int = 1000, progress: Progress | None = None,
                 wait_each_batch: bool = False) -> None:
        """``wait_each_batch``: after each engine batch, wait until the warehouse has it (to
        measure latency ingest -> visible in PostgreSQL); otherwise the sinks catch up while
        the next batches run, and the run waits once per TPC-DI batch."""
        self.data_dir = Path(data_dir)
        self.url = url
        self.schema = schema
        self.batch_size = batch_size
        self.progress = progress
        self.wait_each_batch = wait_each_batch
        self.engine = Engine(state_path)
        declare(self.engine)
        self.sinks = [
            StreamToPostgres(self.engine, "dimtrade_changes", url, f"{schema}.dimtrade",
                             mode="merge", key=("tradeid",), ack_every=0.0),
            StreamToPostgres(self.engine, "dimessages_out", url, f"{schema}.dimessages",
                             ack_every=0.0),
            StreamToPostgres(self.engine, "trade_rejects", url, f"{schema}.rejects",
                             ack_every=0.0),
        ]
        self.report = StreamingReport(batch_size)
        self._next_batch = 0

    def refresh_lookups(self) -> None:
        """Copy the dimension rows the procedures look up from PostgreSQL into the engine."""
        for table, columns in LOOKUPS.items():
            cast(self.url, self.engine, query=f"SELECT {columns} FROM "
                                              f"{qualified(self.schema + '.' + table)}",
                 into=table, mode="replace")

    def stream(self, events: BatchEvents, phase: str) -> None:
        """Send one TPC-DI batch through the dataflow in engine batches; wait until the
        warehouse has it. Latency per engine batch: ingest to visible in PostgreSQL."""
        began = time.perf_counter()
        self._keep_file_rejects(events)
        total, done = events.lines.num_rows, 0
        for chunk in events.chunks(self.batch_size):
            self._next_batch += 1
            t0 = time.perf_counter()
            self.engine.ingest("trade_lines", chunk, batch_id=self._next_batch)
            self.engine.run_until_idle()
            if self.wait_each_batch:
                self._flush()
                self.report.batch_latencies.append(time.perf_counter() - t0)
            done += chunk.num_rows
            if self.progress is not None:
                self.progress(phase, done, total)
        self._flush()
        self.report.events += total
        self.report.engine_batches = self._next_batch
        self.report.phases[phase] = time.perf_counter() - began

    def _flush(self) -> None:
        for sink in self.sinks:
            if not sink.flush(timeout=600):
                raise TimeoutError(f"sink to {sink.table} did not catch up: {sink.last_error}")

    def _keep_file_rejects(self, events: BatchEvents) -> None:
        """Rows the file readers rejected (before the stream) go to the reject table too."""
        if events.rejects.num_rows == 0:
            return
        rows = events.rejects.select(["source_file", "batch_id", "line_number", "raw_line",
                                      "reason"])
        session = Session(self.url)

        def load(con: object) -> int:
            with con.cursor() as cur:  # type: ignore[attr-defined]
                copy_arrow(cur, f"{self.schema}.rejects", rows)
            con.commit()  # type: ignore[attr-defined]
            return rows.num_rows

        try:
            self.report.file_rejects += session.run(load, "store file rejects")
        finally:
            session.close()

    def run(self) -> StreamingReport:
        """Dimensions, Batch1, then Batch2 and Batch3 (see the module docstring)."""
        from migrators.spark_session import get_spark
        from sstore.workloads.tpcdi import dimensions

        spark = get_spark()
        t0 = time.perf_counter()
        dimensions.build_historical(spark, self.data_dir, self.url, self.schema)
        self.refresh_lookups()
        self.report.phases["dimensions (Spark)"] = time.perf_counter() - t0
        for sink in self.sinks:
            sink.attach()
        try:
            self.stream(batch1_events(self.data_dir), "historical (Batch1)")
            for batch in (2, 3):
                t0 = time.perf_counter()
                dimensions.apply_batch(spark, self.data_dir, self.url, self.schema, batch)
                self.refresh_lookups()
                self.report.phases[f"dimensions Batch{batch}"] = time.perf_counter() - t0
                self.stream(incremental_events(self.data_dir, batch), f"incremental (Batch{batch})")
        finally:
            for sink in self.sinks:
                sink.detach()
        return self.report

    def close(self) -> None:
        self.engine.close()
