"""DimTrade on Spark Structured Streaming: the five steps written the way a Spark user would.

``benchmarks.tpcdi`` compares the engine's streaming DimTrade with the streaming system a user
would pick instead. This is that user's job, kept to what the Spark documentation teaches:

- **Input (the arrival)**: each batch of trade events is one text file dropped into a watched
  directory (written in a staging directory, fsync'd, renamed in: the file source must never
  list half a file). A line is ``line_no|tpcdi_batch|<the Trade.txt CDC line>``: the very lines
  the engine ingests (``streaming.events``), with the two columns the engine gets beside them.
  ``spark.readStream.text`` with ``maxFilesPerTrigger=1``, so one batch is one micro-batch.
- **foreachBatch(df, batch_id)** does the five steps as DataFrame work: (1) split and type the
  fields, with a reason for every bad line (``streaming.parse.FIELDS`` says which fields are
  required and how each parses); (2)-(5) the DimTrade rules of ``dimtrade_spark_rules``
  (``evaluate``, ``dimtrade_rows``, ``alerts``: status and type names, the slowly-changing
  security and account lookups, which events apply, one row per trade, alerts). Those rules
  are the bulk pipeline's, reused, not rewritten. The trades of the micro-batch that are
  already in the warehouse are read back from PostgreSQL over JDBC (the rules need them; the
  state lives in PostgreSQL). The dimensions are read over JDBC once per TPC-DI batch and
  cached (``load_dimensions``, called after that batch's dimension changes, the counterpart
  of the engine's ``refresh_lookups``).
- **Output, exactly once by batchId**: one PostgreSQL transaction per micro-batch: lock the
  watermark row (``sstore.watermarks``, source ``SOURCE``), skip the batch if its id is
  already there (a replay after a restart), else binary COPY the DimTrade rows into a stage
  table and ``INSERT ... ON CONFLICT (tradeid) DO UPDATE`` (``migrators.postgres.merge_rows``),
  COPY the alerts and rejects, advance the watermark, COMMIT.
- **Latency**: from just before the batch's file is written to just after that COMMIT (the
  driver waits for it before writing the next file: closed loop).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from benchmarks.common import percentile
from benchmarks.sss_batches import BatchBoard
from migrators import delivery
from migrators.postgres import Session, copy_arrow, merge_rows
from migrators.spark import postgres_to_dataframe
from sstore.sql import ident
from sstore.workloads.tpcdi import dimtrade_spark
from sstore.workloads.tpcdi.dimtrade_spark_events import EVENT_COLUMNS, empty_rows
from sstore.workloads.tpcdi.dimtrade_spark_rules import (
    DIMESSAGES,
    DIMTRADE,
    Dimensions,
    alerts,
    dimtrade_rows,
    evaluate,
)
from sstore.workloads.tpcdi.sources import REJECT_SCHEMA
from sstore.workloads.tpcdi.streaming.parse import FIELDS, Field

SOURCE = "tpcdi DimTrade (spark structured streaming)"
WAIT_SECONDS = 900.0  # a micro-batch slower than this means the query is stuck
_TYPES = {"VARCHAR": "string", "BIGINT": "bigint", "INTEGER": "int", "BOOLEAN": "boolean",
          "TIMESTAMP": "timestamp_ntz"}


def _spark_type(field: Field) -> str:
    return _TYPES.get(field.sql_type) or field.sql_type.lower()  # DECIMAL(8,2) -> decimal(8,2)


def _value(raw: Column, field: Field) -> Column:
    if field.parse == "timestamp":
        return F.try_to_timestamp(raw, F.lit("yyyy-MM-dd HH:mm:ss")).cast("timestamp_ntz")
    if field.parse == "bool01":
        return F.when(raw == "1", F.lit(True)).when(raw == "0", F.lit(False))
    if field.parse == "flag":
        return F.when(raw.isin("I", "U"), raw)
    if field.parse in ("int", "decimal"):
        return raw.try_cast(_spark_type(field))
    return raw


def parse_lines(df: DataFrame) -> DataFrame:
    """Step 1: ``value`` lines -> eid (line number), tpcdi_batch, line, the typed fields and
    ``reason`` (NULL if the line parsed). try_* functions throughout: Spark 4 runs in ANSI mode,
    where a plain cast of a bad number fails the whole micro-batch."""
    head = F.split(F.col("value"), r"\|", 3)
    fields = F.split(F.element_at(head, 3), r"\|")
    n = len(FIELDS)
    columns: dict[str, Column] = {}
    checks: list[Column] = []
    for i, fld in enumerate(FIELDS):
        raw = F.nullif(F.trim(F.try_element_at(fields, F.lit(i + 1))), F.lit(""))
        value = _value(raw, fld)
        columns[fld.name] = F.when(F.size(fields) == n, value).cast(_spark_type(fld))
        label = fld.name.upper()
        if fld.required:
            checks.append(F.when(raw.isNull(), F.lit(f"missing {label}")))
        if fld.parse != "text":
            checks.append(F.when(raw.isNotNull() & value.isNull(),
                                 F.concat(F.lit(f"bad {label}: "), raw)))
    reason = F.when(F.size(fields) != n, F.concat(F.lit(f"expected {n} fields, found "),
                                                  F.size(fields).cast("string")))
    return df.select(F.element_at(head, 1).cast("long").alias("eid"),
                     F.element_at(head, 2).cast("int").alias("tpcdi_batch"),
                     F.element_at(head, 3).alias("line"),
                     *[c.alias(name) for name, c in columns.items()],
                     F.coalesce(reason, *checks).alias("reason"))


def trade_events(parsed: DataFrame) -> DataFrame:
    """The rules' event rows: ``k`` is an event's position among its trade's, in CDC_DSN
    order (as ``dimtrade_spark_events.incremental_events`` numbers them)."""
    order = Window.partitionBy("t_id").orderBy("cdc_dsn", "eid")
    return parsed.withColumn("k", F.row_number().over(order)).select(*EVENT_COLUMNS)


@dataclasses.dataclass
class BatchTimes:
    """Where one micro-batch's time went, in seconds."""

    arrival: float
    visible: float = 0.0
    parse_and_ids: float = 0.0
    rules_to_arrow: float = 0.0
    postgres_commit: float = 0.0


class StructuredStreamingDimTrade:
    """One streaming query: a directory of event files in, the warehouse ``schema`` out."""

    def __init__(self, spark: SparkSession, data_dir: str | Path, url: str, schema: str,
                 workdir: str, name: str) -> None:
        self.spark, self.data_dir, self.url, self.schema = spark, Path(data_dir), url, schema
        self.target = f"{schema}.dimtrade"
        self.inbox, self.staging = (os.path.join(workdir, d) for d in ("inbox", "staging"))
        os.makedirs(self.inbox)
        os.makedirs(self.staging)
        self.session = Session(url)
        self.session.run(_create_watermarks, "create the watermark table")
        self.dims: Dimensions | None = None
        self.dims_batch = 0
        self.sources: dict[int, str] = {}
        self.times: dict[int, BatchTimes] = {}
        self.replays = 0
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

    # -- the user's code -----------------------------------------------------------------------
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
        t0 = time.perf_counter()
        parsed = parse_lines(df).cache()
        keys = parsed.select("tpcdi_batch", "t_id").toArrow()  # no shuffle: dedup in Arrow
        tpcdi_batch = int(pc.max(keys["tpcdi_batch"]).as_py() or 0)
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
            for frame in (evaluated, existing, parsed):
                frame.unpersist()
        refused = refused.sort_by("eid")
        t3 = time.perf_counter()
        rejects = pa.table([[self.sources.get(tpcdi_batch, "")] * refused.num_rows,
                            [tpcdi_batch] * refused.num_rows, refused["eid"], refused["line"],
                            refused["reason"]], schema=REJECT_SCHEMA)
        if not self.session.run(lambda con: self._write(con, batch_id, rows, messages, rejects),
                                f"write micro-batch {batch_id}"):
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
        array = "{" + ",".join(str(i) for i in ids) + "}"
        return postgres_to_dataframe(self.url, spark=self.spark, query=(
            f"SELECT {columns} FROM {ident(self.schema)}.dimtrade "
            f"WHERE tradeid = ANY('{array}'::bigint[])"))

    def _write(self, con: Any, batch_id: int, rows: pa.Table, messages: pa.Table,
               rejects: pa.Table) -> bool:
        """One delivery (``migrators.delivery``, the protocol every exactly-once writer
        uses): watermark locked and checked, rows merged, alerts and rejects appended,
        watermark advanced, commit. False (nothing written) for a batch id already there."""
        out = rows.select(DIMTRADE.names).cast(DIMTRADE)

        def write(cur: Any, _watermark: int) -> int:
            merge_rows(cur, self.target, out, ["tradeid"])
            copy_arrow(cur, f"{self.schema}.dimessages",
                       messages.select(DIMESSAGES.names).cast(DIMESSAGES))
            copy_arrow(cur, f"{self.schema}.rejects", rejects)
            return out.num_rows

        key = delivery.SinkKey(SOURCE, "foreachBatch batchId", self.target)
        return not delivery.deliver(con, key, batch_id, batch_id, write, after=None).skipped

    # -- the driver's side ---------------------------------------------------------------------
    def store_file_rejects(self, rejects: pa.Table, tpcdi_batch: int, source: str) -> None:
        """Lines the file readers refused before any event was made (as the engine's run
        stores them), and the source file name this TPC-DI batch's rejects carry."""
        self.sources[tpcdi_batch] = source
        if rejects.num_rows:
            rows = rejects.select(REJECT_SCHEMA.names)

            key = delivery.SinkKey(SOURCE, "file rejects", f"{self.schema}.rejects")
            self.session.run(lambda con: delivery.deliver(
                con, key, tpcdi_batch, tpcdi_batch,
                lambda cur, _watermark: copy_arrow(cur, key.target, rows), after=None),
                "store file rejects")

    def send(self, lines: pa.Table) -> BatchTimes:
        """Drop one batch of event lines (``streaming.events.LINE_SCHEMA``) into the watched
        directory; return when its micro-batch has committed in PostgreSQL."""
        self._sent += 1
        batch_id = self._sent
        times = self.times.setdefault(batch_id, BatchTimes(time.perf_counter()))
        name = f"batch-{batch_id:08d}.txt"
        text = "".join(f"{n}|{b}|{line}\n" for n, b, line in zip(
            lines["line_no"].to_pylist(), lines["tpcdi_batch"].to_pylist(),
            lines["line"].to_pylist(), strict=True))
        staged = os.path.join(self.staging, name)
        with open(staged, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, os.path.join(self.inbox, name))
        self._board.wait(batch_id, self.query)
        return times

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
        return {label: round(percentile(v, 0.5), 1) for label, v in parts.items()}

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


def _create_watermarks(con: Any) -> None:
    delivery.ensure_watermarks(con)
