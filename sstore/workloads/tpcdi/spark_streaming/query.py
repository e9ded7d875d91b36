"""The streaming query: a watched directory of event files in, the warehouse ``schema`` out.

- **Input**: each file is a batch of event lines (``parse.event_line``), written in a staging
  directory, fsync'd and renamed in (the file source must never list half a file).
  ``spark.readStream.text`` with ``maxFilesPerTrigger=1``: one file is one micro-batch.
- **foreachBatch(df, batchId)** does the five steps as DataFrame work: (1) ``parse.
  parse_lines``; (2)-(5) the DimTrade rules of ``dimtrade_spark_rules`` (``evaluate``,
  ``dimtrade_rows``, ``alerts``), the bulk pipeline's, reused. The micro-batch's trades that
  are already in the warehouse are read back from PostgreSQL over JDBC (the state lives in
  PostgreSQL). The dimensions are read over JDBC once per TPC-DI batch and cached
  (``load_dimensions``, the counterpart of the engine's ``refresh_lookups``).
- **Exactly once**: one PostgreSQL transaction per micro-batch through the project's one
  delivery protocol (``migrators.delivery``): the watermark row of (``SOURCE`` + this
  checkpoint's sink id, ``BATCH_STREAM``, ``<schema>.dimtrade``) is locked, the batch skipped
  if its batchId is already there, else the DimTrade rows are merged (binary COPY into a stage
  table, ``INSERT ... ON CONFLICT (tradeid) DO UPDATE``), alerts and rejects appended, the
  watermark advanced to the batchId, COMMIT. Spark re-runs a micro-batch after a restart
  when the sink committed but the checkpoint's commit log did not: same batchId, skipped.
  The sink id is made once with the checkpoint directory (file ``sink-id``), as an engine's
  id with its state file: a second checkpoint (batchIds from 0 again) writing into the same
  table is refused by the protocol (``TargetClaimedError``) instead of being taken for a replay.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sstore.base.extras import needs

with needs("spark"):
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

from migrators import delivery, watermarks
from migrators.postgres import Session, copy_arrow, merge_rows
from migrators.spark import postgres_to_dataframe
from sstore.base.errors import TerminalError
from sstore.base.files import write_atomically
from sstore.base.sql import ident
from sstore.workloads.tpcdi import dimtrade_spark
from sstore.workloads.tpcdi.dimtrade_spark_events import empty_rows
from sstore.workloads.tpcdi.dimtrade_spark_rules import (
    DIMESSAGES,
    DIMTRADE,
    Dimensions,
    alerts,
    dimtrade_rows,
    evaluate,
)
from sstore.workloads.tpcdi.sources import REJECT_SCHEMA
from sstore.workloads.tpcdi.spark_streaming.board import BatchBoard
from sstore.workloads.tpcdi.spark_streaming.parse import (
    event_line,
    parse_lines,
    trade_events,
)

SOURCE = "tpcdi DimTrade (spark structured streaming)"
BATCH_STREAM = "foreachBatch batchId"
FILE_REJECTS_STREAM = "file rejects"
WAIT_SECONDS = 900.0  # a micro-batch slower than this means the query is stuck


class StreamingQueryFailed(TerminalError):
    """The query stopped on an error (foreachBatch raised, Spark failed); what the warehouse
    committed stays, the checkpoint knows where to resume."""


@dataclasses.dataclass
class BatchTimes:
    """Where one micro-batch's time went, in seconds."""

    arrival: float
    visible: float = 0.0
    parse_and_ids: float = 0.0
    rules_to_arrow: float = 0.0
    postgres_commit: float = 0.0


def _p50(values: list[float]) -> float:
    """Nearest-rank median, as ``benchmarks.common.percentile(values, 0.5)``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.5 * len(ordered)) - 1)]


def sink_id(workdir: str) -> str:
    """The id of the sink whose checkpoint is in ``workdir``: made with it, kept with it."""
    path = os.path.join(workdir, "sink-id")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except FileNotFoundError:
        made = str(uuid.uuid4())
        write_atomically(path, made)
        return made


class StructuredStreamingDimTrade:
    """One streaming query over ``workdir`` (inbox, staging, checkpoint, sink id): reopening
    the same ``workdir`` resumes where the checkpoint stands."""

    def __init__(self, spark: SparkSession, data_dir: str | Path, url: str, schema: str,
                 workdir: str, name: str, sources: Mapping[int, str] | None = None) -> None:
        """``sources``: the source file named by the rejects of each TPC-DI batch (a
        restarted query may re-run a micro-batch before the driver says anything)."""
        self.spark, self.data_dir, self.url, self.schema = spark, Path(data_dir), url, schema
        self.target = f"{schema}.dimtrade"
        self.inbox, self.staging = (os.path.join(workdir, d) for d in ("inbox", "staging"))
        os.makedirs(self.inbox, exist_ok=True)
        os.makedirs(self.staging, exist_ok=True)
        self.key = delivery.SinkKey(f"{SOURCE} {sink_id(workdir)}", BATCH_STREAM, self.target)
        self.session = Session(url)
        self.session.run(watermarks.ensure_watermarks, "create the watermark table")
        self.dims: Dimensions | None = None
        self.dims_batch = 0
        self.sources: dict[int, str] = dict(sources or {})
        self.times: dict[int, BatchTimes] = {}
        self.replays = 0
        self.delivered = 0
        self._sent = 0
        self._board = BatchBoard(WAIT_SECONDS)
        self.query = (spark.readStream.format("text").option("maxFilesPerTrigger", 1)
                      .load(self.inbox).writeStream.queryName(name)
                      .foreachBatch(self._on_batch)
                      .option("checkpointLocation", os.path.join(workdir, "checkpoint"))
                      .start())

    @property
    def sent(self) -> int:
        """Batches sent so far; the last one's micro-batch id (``send`` numbers them 1, 2, ...)."""
        return self._sent

    # -- foreachBatch --------------------------------------------------------------------------
    def load_dimensions(self, tpcdi_batch: int) -> None:
        """Read and cache what the lookups need, as the bulk pipeline reads it (Batch1: every
        version, by date; later batches: the current versions)."""
        self._drop_dimensions()
        dims = dimtrade_spark.read_dimensions(self.spark, self.data_dir, self.url, self.schema,
                                              current=tpcdi_batch > 1)
        dims = dataclasses.replace(dims, securities=dims.securities.cache(),
                                   accounts=dims.accounts.cache())
        dims.securities.count()
        dims.accounts.count()
        self.dims, self.dims_batch = dims, tpcdi_batch

    def _on_batch(self, df: DataFrame, spark_batch_id: int) -> None:
        batch_id = spark_batch_id + 1  # Spark counts from 0, watermarks from 1
        try:
            self._process(df, batch_id)
        except BaseException as exc:
            self._board.failed(exc)
            raise
        self._board.done(batch_id)

    def _process(self, df: DataFrame, batch_id: int) -> None:
        times = self.times.setdefault(batch_id, BatchTimes(time.perf_counter()))
        done = self.session.run(lambda con: delivery.claim(con, self.key).batch_id,
                                "read the watermark")
        if done >= batch_id:  # a replay after a restart: the warehouse has it
            self.replays += 1
            times.visible = time.perf_counter()
            return
        t0 = time.perf_counter()
        parsed = parse_lines(df).cache()
        try:
            keys = parsed.select("tpcdi_batch", "t_id").toArrow()  # no shuffle: dedup in Arrow
            tpcdi_batch = int(pc.max(keys["tpcdi_batch"]).as_py() or 0)
            if tpcdi_batch < 1:
                raise ValueError(f"micro-batch {batch_id}: no event line names its TPC-DI "
                                 f"batch (empty or malformed file)")
            if tpcdi_batch != self.dims_batch:
                self.load_dimensions(tpcdi_batch)
            assert self.dims is not None
            ids = pc.unique(keys["t_id"].drop_null()).to_pylist()
            t1 = time.perf_counter()
            existing = self._existing(ids).cache()  # read on first use, once
            evaluated = evaluate(trade_events(parsed), existing, self.dims).cache()
            try:
                rows = dimtrade_rows(evaluated, existing, tpcdi_batch).toArrow()
                messages = alerts(evaluated, tpcdi_batch).toArrow()
                refused = (evaluated.where(~F.col("applied")).select("eid", "reason")
                           .join(parsed.select("eid", "line"), "eid").toArrow())
            finally:
                evaluated.unpersist()
                existing.unpersist()
        finally:
            parsed.unpersist()
        refused = refused.sort_by("eid")
        t3 = time.perf_counter()
        rejects = pa.table([[self.sources.get(tpcdi_batch, "")] * refused.num_rows,
                            [tpcdi_batch] * refused.num_rows, refused["eid"], refused["line"],
                            refused["reason"]], schema=REJECT_SCHEMA)
        if self.session.run(lambda con: self._write(con, batch_id, rows, messages, rejects),
                            f"write micro-batch {batch_id}"):
            self.delivered += 1
        else:
            self.replays += 1
        t4 = time.perf_counter()
        times.parse_and_ids, times.rules_to_arrow, times.postgres_commit = t1 - t0, t3 - t1, \
            t4 - t3
        times.visible = t4

    def _existing(self, ids: list[int]) -> DataFrame:
        """The DimTrade rows of the micro-batch's trades, read back from PostgreSQL."""
        if not ids:
            return empty_rows(self.spark, DIMTRADE)
        columns = ", ".join(DIMTRADE.names)
        array = "{" + ",".join(str(int(i)) for i in ids) + "}"
        return postgres_to_dataframe(self.url, spark=self.spark, query=(
            f"SELECT {columns} FROM {ident(self.schema)}.dimtrade "
            f"WHERE tradeid = ANY('{array}'::bigint[])"))

    def _write(self, con: Any, batch_id: int, rows: pa.Table, messages: pa.Table,
               rejects: pa.Table) -> bool:
        """One delivery (``migrators.delivery``): watermark locked and checked, rows merged,
        alerts and rejects appended, watermark advanced, commit. False (nothing written) for
        a batch id already there."""
        out = rows.select(DIMTRADE.names).cast(DIMTRADE)

        def write(cur: Any, _watermark: int) -> int:
            merge_rows(cur, self.target, out, ["tradeid"])
            copy_arrow(cur, f"{self.schema}.dimessages",
                       messages.select(DIMESSAGES.names).cast(DIMESSAGES))
            copy_arrow(cur, f"{self.schema}.rejects", rejects)
            return int(out.num_rows)

        return not delivery.deliver(con, self.key, batch_id, batch_id, write, after=None).skipped

    # -- the driver's side ---------------------------------------------------------------------
    def store_file_rejects(self, rejects: pa.Table, tpcdi_batch: int, source: str) -> None:
        """Lines the file readers refused before any event was made (as the engine's run
        stores them), once per TPC-DI batch; and the source file name this TPC-DI batch's
        rejects carry."""
        self.sources[tpcdi_batch] = source
        if rejects.num_rows:
            rows = rejects.select(REJECT_SCHEMA.names)
            key = delivery.SinkKey(SOURCE, FILE_REJECTS_STREAM, f"{self.schema}.rejects")
            self.session.run(lambda con: delivery.deliver(
                con, key, tpcdi_batch, tpcdi_batch,
                lambda cur, _watermark: copy_arrow(cur, key.target, rows), after=None),
                "store file rejects")

    def drop(self, lines: pa.Table, name: str) -> bool:
        """Put one file of event lines (``streaming.events.LINE_SCHEMA``) into the watched
        directory, unless a file of that name is there already (a resumed run): False then.
        The file is complete when it appears (staged, fsync'd, renamed)."""
        final = os.path.join(self.inbox, name)
        if os.path.exists(final):
            return False
        text = "".join(event_line(n, b, line) for n, b, line in zip(
            lines["line_no"].to_pylist(), lines["tpcdi_batch"].to_pylist(),
            lines["line"].to_pylist(), strict=True))
        write_atomically(final, text, staging_dir=self.staging)
        return True

    def send(self, lines: pa.Table) -> BatchTimes:
        """Closed loop (the benchmark, on a fresh checkpoint): drop one batch of event lines
        and return when its micro-batch has committed in PostgreSQL."""
        self._sent += 1
        batch_id = self._sent
        times = self.times.setdefault(batch_id, BatchTimes(time.perf_counter()))
        self.drop(lines, f"batch-{batch_id:08d}.txt")
        self._board.wait(batch_id, self.query)
        return times

    def wait_all(self) -> None:
        """Block until every file in the watched directory is processed and committed in
        PostgreSQL; raise what stopped the query if it failed."""
        try:
            self.query.processAllAvailable()
        except Exception as exc:
            raise StreamingQueryFailed(f"the Spark streaming query failed (run again to "
                                       f"resume from its checkpoint): {exc}") from exc

    def breakdown(self, batch_ids: Callable[[int], bool]) -> dict[str, float]:
        """Median milliseconds per micro-batch of the batches ``batch_ids`` accepts: the three
        parts of foreachBatch and Spark's own trigger phases (its progress reports)."""
        parts: dict[str, list[float]] = {}
        for batch_id, t in self.times.items():
            if batch_ids(batch_id) and t.visible:
                for label, seconds in (("parse + trade ids (Spark job)", t.parse_and_ids),
                                       ("JDBC read of existing rows, rules, toArrow",
                                        t.rules_to_arrow),
                                       ("PostgreSQL merge + COMMIT", t.postgres_commit)):
                    parts.setdefault(label, []).append(seconds * 1000)
        for progress in self.query.recentProgress:
            if batch_ids(progress.batchId + 1):
                for phase, ms in progress.durationMs.items():
                    parts.setdefault(f"trigger: {phase}", []).append(float(ms))
        return {label: round(_p50(v), 1) for label, v in parts.items()}

    def _drop_dimensions(self) -> None:
        if self.dims is not None:
            self.dims.securities.unpersist()
            self.dims.accounts.unpersist()
            self.dims = None

    def close(self) -> None:
        try:
            self.query.stop()
        finally:
            self._drop_dimensions()
            self.session.close()
