"""Streaming DimTrade end to end: dimensions, lookup copies, the dataflow, the warehouse sinks.

1. The dimensions are built in PySpark (``sstore.workloads.tpcdi.dimensions``), the same code the
   Spark pipeline uses, so both pipelines look trades up in identical dimension rows.
2. The lookups the procedures need are replicated from PostgreSQL into the engine.
3. Sinks attach to the dataflow's outputs: DimTrade changes merge into ``<schema>.dimtrade`` by
   trade id, alerts append to ``<schema>.dimessages``, rejects to ``<schema>.rejects``; each
   exactly once (binary COPY + watermark per PostgreSQL transaction).
4. Batch1 streams as time-ordered trade events in engine batches of ``batch_size``; then, per
   incremental batch (``run_incremental``), the dimension changes are applied, the lookups
   refreshed, and the batch's Trade.txt streams through.

Engine batch-ids are derived from the data: an engine batch of TPC-DI batch ``b`` whose last
line is line ``n`` of the batch's events has id ``b * ID_STRIDE + n`` (``engine_batch_id``).
Before streaming a TPC-DI batch, the lines the state file already took are left out (the
engine keeps the commit records of a border stream for good), so running again on the same
state file, even with another ``batch_size``, sends nothing twice: exactly once. Lines are
counted, not compared, so the state file records a digest of each TPC-DI batch's lines and a
run over changed files is refused before it sends anything (``source_check``). The rows the
file readers refused (Batch1) are stored once too, guarded by a watermark row. The incremental
batches can also run on their own, after a Spark historical load (``dimtrade_spark``): the
engine's DimTrade state is then seeded from the warehouse first (``seed_dimtrade``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pyarrow.compute as pc

from migrators import delivery, watermarks
from migrators.engine_to_postgres import StreamToPostgres
from migrators.postgres import Session, connect, copy_arrow
from migrators.registry import cast
from migrators.sink_runner import SinkGroup
from sstore.base.errors import TerminalError
from sstore.base.sql import ident, qualified
from sstore.engine import Engine
from sstore.maintenance import StreamTarget
from sstore.workloads.tpcdi.backfill import seal_batch
from sstore.workloads.tpcdi.streaming import source_check
from sstore.workloads.tpcdi.streaming.batch_ids import ID_STRIDE, engine_batch_id
from sstore.workloads.tpcdi.streaming.events import (
    BatchEvents,
    batch1_events,
    incremental_events,
)
from sstore.workloads.tpcdi.streaming.procedures import LOOKUPS, declare
from sstore.workloads.tpcdi.warehouse import dimensions_applied

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Progress = Callable[[str, int, int], None]  # (phase, done, total)

#: The border stream the trade event lines enter by.
INPUT_STREAM = "trade_lines"
#: Watermark stream of the file readers' rejects (source: the engine, target
#: ``<schema>.rejects``); its batches are TPC-DI batch numbers.
FILE_REJECTS_STREAM = "tpcdi file rejects"


def sinks(schema: str = "tpcdi") -> tuple[StreamTarget, ...]:
    """Where the dataflow's outputs go in the warehouse ``schema``: DimTrade changes merge by
    trade id, alerts and rejects append."""
    return (StreamTarget("dimtrade_changes", f"{schema}.dimtrade", "merge", ("tradeid",)),
            StreamTarget("dimessages_out", f"{schema}.dimessages"),
            StreamTarget("trade_rejects", f"{schema}.rejects"))


class StreamingSetupError(TerminalError):
    """An incremental batch cannot stream: the warehouse has no Batch1 DimTrade to build on."""


class BatchOrderError(StreamingSetupError):
    """An incremental TPC-DI batch was asked for before the one it builds on was fully
    applied (``run_incremental(3)`` before ``run_incremental(2)``, or after a Batch2 that
    stopped halfway). Refused before anything is sent: its dimension changes would be
    applied first, after which the warehouse counts Batch2's as applied too
    (``dimensions_applied`` asks for rows of that batch *or above*) and never applies them,
    and Batch3's updates of trades Batch2 creates would be rejected as unknown trades; the
    engine would then refuse Batch2's lines as out of order, but only after all that."""


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
        source_check.declare(self.engine)
        self.sinks = [StreamToPostgres(self.engine, t.stream, url, t.table, mode=t.mode,
                                       key=t.key, ack_every=0.0) for t in sinks(schema)]
        #: the three sinks deliver a batch's rows in one PostgreSQL transaction
        #: (``migrators.sink_runner``): its trades, alerts and rejects appear together
        self.sink_group = SinkGroup(self.sinks)
        self.report = StreamingReport(batch_size)

    def refresh_lookups(self) -> None:
        """Copy the dimension rows the procedures look up from PostgreSQL into the engine."""
        for table, columns in LOOKUPS.items():
            cast(self.url, self.engine, query=f"SELECT {columns} FROM "
                                              f"{qualified(self.schema + '.' + table)}",
                 into=table, mode="replace")

    def stream(self, events: BatchEvents, phase: str, migrate: bool = True) -> None:
        """Send one TPC-DI batch through the dataflow in engine batches; wait until the
        warehouse has it. Latency per engine batch: ingest to visible in PostgreSQL. Lines the
        state file already took are skipped (see the module docstring), once ``source_check``
        has found the files to be the ones they came from; the sinks must be
        attached. ``migrate=False``: do not wait for the warehouse (the results stay in the
        engine until attached sinks, ``flush`` or a migration move them). Once the warehouse
        has the whole batch, it is sealed (``backfill.seal_batch``): a backfill may replace it
        from then on, not before."""
        began = time.perf_counter()
        self.engine.run_until_idle()  # whatever a crash left between ingest and procedures
        self.store_file_rejects(events)
        already = self.lines_ingested(events.tpcdi_batch)
        source_check.check_and_record(self.engine, events, already)  # never mix two versions
        lines = events.lines
        if already:
            lines = lines.filter(pc.greater(lines["line_no"], already))
        total = events.lines.num_rows
        done = total - lines.num_rows
        for start in range(0, lines.num_rows, self.batch_size):
            chunk = lines.slice(start, self.batch_size)
            batch_id = engine_batch_id(events.tpcdi_batch, chunk["line_no"][-1].as_py())
            t0 = time.perf_counter()
            # the batch and its five TEs commit as one transaction (same guarantees as
            # ingest + run_until_idle; the event lines are not stored: only SP1 reads them)
            self.engine.ingest_and_run(INPUT_STREAM, chunk, batch_id=batch_id)
            self.report.engine_batches += 1
            if self.wait_each_batch and migrate:
                self.flush()
                self.report.batch_latencies.append(time.perf_counter() - t0)
            done += chunk.num_rows
            if self.progress is not None:
                self.progress(phase, done, total)
        if migrate:
            self.flush()
            # every row of the batch is in the warehouse: from now on it may be backfilled
            seal_batch(self.url, self.schema, events.tpcdi_batch)
        self.report.events += lines.num_rows
        self.report.phases[phase] = time.perf_counter() - began

    def lines_ingested(self, tpcdi_batch: int) -> int:
        """The last event line of TPC-DI batch ``tpcdi_batch`` that the engine has taken (0:
        none). A border stream keeps its batch-ids for good (commit records, and the runs GC
        compacts old ones into, ``sstore.execution.gc``), so this survives restarts."""
        low = tpcdi_batch * ID_STRIDE
        got = self.engine.query(
            "SELECT max(last) AS last FROM (SELECT max(batch_id) AS last FROM "
            "sstore_sys.commits WHERE node = $1 AND batch_id > $2 AND batch_id < $3 "
            "UNION ALL SELECT max(least(last_batch, $3 - 1)) FROM sstore_sys.ingested_runs "
            "WHERE stream = $1 AND last_batch > $2 AND first_batch < $3)",
            INPUT_STREAM, low, low + ID_STRIDE)
        last = got.column("last")[0].as_py()
        return int(last) - low if last is not None else 0

    def seed_dimtrade(self) -> int:
        """Before the first trade event of a state file: copy the warehouse's DimTrade into the
        engine's DimTrade state, so that the updates of an incremental batch find the trades a
        Spark historical load (``dimtrade_spark.load_historical``) put there. Does nothing (0)
        once the engine has taken any event; refuses when the warehouse has no DimTrade of
        Batch1 either. Returns the rows copied."""
        taken = self.engine.query("SELECT count(*) AS n FROM sstore_sys.commits WHERE node = ?",
                                  INPUT_STREAM).column("n")[0].as_py()
        if taken:
            return 0
        with connect(self.url) as con:
            row = con.execute(f"SELECT count(*) FILTER (WHERE batchid = 1), count(*) FROM "
                              f"{ident(self.schema)}.dimtrade").fetchone()
        batch1, rows = (int(row[0]), int(row[1])) if row else (0, 0)
        if batch1 == 0:
            raise StreamingSetupError(
                f"{self.schema}.dimtrade has no Batch1 trades: load Batch1 first (the Spark "
                f"historical load, or StreamingDimTrade.run)")
        if rows:
            # version 0 of each trade (the column's default): SP5's versions come after it
            cast(self.url, self.engine, table=f"{self.schema}.dimtrade",
                 into="dimtrade_versions", mode="replace")
        return rows

    def dimensions_applied(self, batch: int) -> bool:
        """Whether the warehouse has the dimension changes of ``batch`` (or of a later batch,
        which builds on them): DimCustomer or DimAccount rows of that batch-id or above."""
        return dimensions_applied(self.url, self.schema, batch)

    def flush(self) -> None:
        """Wait until the warehouse has every batch the engine has committed (the sinks must
        be attached)."""
        for sink in self.sinks:
            if not sink.flush(timeout=600):
                raise TimeoutError(f"sink to {sink.table} did not catch up: {sink.last_error}")

    def store_file_rejects(self, events: BatchEvents) -> None:
        """Rows the file readers rejected (before the stream) go to the reject table too, once,
        through the one delivery protocol (``migrators.delivery``): source this engine, stream
        ``FILE_REJECTS_STREAM``, batch = the TPC-DI batch. ``stream`` calls it before a batch's
        events; whoever feeds the events another way (the benchmarks) calls it likewise.
        Calling it again for the same batch stores nothing twice."""
        if events.rejects.num_rows == 0:
            return
        rows = events.rejects.select(["source_file", "batch_id", "line_number", "raw_line",
                                      "reason"])
        key = delivery.SinkKey(self.engine.engine_id, FILE_REJECTS_STREAM,
                               f"{self.schema}.rejects")
        batch = events.tpcdi_batch

        def load(con: psycopg.Connection) -> int:
            watermarks.ensure_watermarks(con)
            return delivery.deliver(con, key, batch, batch,
                                    lambda cur, _watermark: copy_arrow(cur, key.target, rows),
                                    after=None).rows

        session = Session(self.url)
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
        with self.attached():
            self.stream(batch1_events(self.data_dir), "historical (Batch1)")
        for batch in (2, 3):
            self.run_incremental(batch, spark)
        return self.report

    def run_incremental(self, batch: int, spark: SparkSession | None = None
                        ) -> StreamingReport:
        """One incremental TPC-DI batch (2, 3, ...): its dimension changes (``dimensions.
        apply_batch``, skipped when the warehouse has them), fresh lookups, then its Trade.txt
        through the dataflow into the warehouse. Batch1 must be in the warehouse (streamed
        here, or loaded by Spark: then the engine's DimTrade is seeded from it), and batch - 1
        fully applied (``check_batch_order``: ``BatchOrderError`` before anything is sent).
        Running it again changes nothing. ``spark``: a session for the dimension job (default:
        ``get_spark()``)."""
        from sstore.workloads.tpcdi import dimensions

        if batch < 2:
            raise ValueError(f"incremental batches are 2, 3, ...; got {batch}")
        self.check_batch_order(batch)  # before anything is sent, Spark's dimensions included
        t0 = time.perf_counter()
        if not self.dimensions_applied(batch):
            if spark is None:
                from migrators.spark_session import get_spark
                spark = get_spark()
            dimensions.apply_batch(spark, self.data_dir, self.url, self.schema, batch)
        self.refresh_lookups()
        self.seed_dimtrade()
        self.report.phases[f"dimensions Batch{batch}"] = time.perf_counter() - t0
        with self.attached():
            self.stream(incremental_events(self.data_dir, batch), f"incremental (Batch{batch})")
        return self.report

    def check_batch_order(self, batch: int) -> None:
        """Refuse incremental ``batch`` (``BatchOrderError``) unless ``batch - 1`` is fully
        applied: its dimension changes are in the warehouse and this state file has taken
        every one of its event lines (their count: the ``tpcdi_sources`` record made before
        its first line was sent, else the files). A state file that has taken no event at
        all is seeded from the warehouse (``seed_dimtrade``), so there the warehouse's
        DimTrade must hold rows of ``batch - 1`` or later instead. Batch2 builds on Batch1,
        which ``seed_dimtrade`` checks. Running a batch again is allowed (its predecessor is
        still applied); reads only, nothing is sent."""
        previous = batch - 1
        if previous < 2:
            return
        todo = f"run_incremental({previous}) first (sstore tpcdi run does the batches in order)"
        if not self.dimensions_applied(previous):
            raise BatchOrderError(
                f"TPC-DI Batch{batch} builds on Batch{previous}, whose dimension changes are "
                f"not in {self.schema}: nothing of Batch{batch} was sent; {todo}")
        taken = self.lines_ingested(previous)
        if not taken and not self._events_taken():
            if self._warehouse_has_trades_of(previous):
                return
            raise BatchOrderError(
                f"TPC-DI Batch{batch} builds on Batch{previous}, but neither this state file "
                f"nor {self.schema}.dimtrade has its trades: nothing of Batch{batch} was "
                f"sent; {todo}")
        record = source_check.recorded(self.engine, previous)
        total = (record.lines if record is not None
                 else incremental_events(self.data_dir, previous).lines.num_rows)
        if taken < total:
            raise BatchOrderError(
                f"TPC-DI Batch{batch} builds on Batch{previous}, of which this state file has "
                f"taken {taken} of {total} event lines: nothing of Batch{batch} was sent; "
                f"{todo} (it resumes where it stopped)")

    def _events_taken(self) -> bool:
        """Whether this state file has taken any trade event (else it is seeded from the
        warehouse, ``seed_dimtrade``)."""
        return bool(self.engine.query(
            "SELECT EXISTS (SELECT 1 FROM sstore_sys.commits WHERE node = $1) OR EXISTS "
            "(SELECT 1 FROM sstore_sys.ingested_runs WHERE stream = $1) AS taken",
            INPUT_STREAM).column("taken")[0].as_py())

    def _warehouse_has_trades_of(self, batch: int) -> bool:
        with connect(self.url) as con:
            row = con.execute(f"SELECT EXISTS (SELECT 1 FROM {ident(self.schema)}.dimtrade "
                              f"WHERE batchid >= %s)", (batch,)).fetchone()
        return bool(row and row[0])

    @contextmanager
    def attached(self) -> Iterator[None]:
        """The sinks feed the warehouse while the block runs (as one group)."""
        self.sink_group.attach()
        try:
            yield
        finally:
            self.sink_group.detach()

    def close(self) -> None:
        self.engine.close()
