"""The ICU windows and alerts on Spark Structured Streaming, written as a Spark user would.

``benchmarks.icu`` runs the same arrival batches through the engine and through this job, and
checks that both give the same windows and the same alerts.

- **Input (the arrival)**: each arrival batch is one Parquet file dropped into a watched
  directory (written in a staging directory, renamed in), read with ``maxFilesPerTrigger=1``:
  one batch, one micro-batch.
- **Cleaning**: the engine's rejection rules as a filter (``dataflow.REASON_SQL`` as a Spark
  SQL expression). The rejected rows are not written anywhere by this job (a second query
  would be needed: a streaming aggregation's query only outputs the aggregate).
- **Windows**: ``withWatermark("ts", delay + allowed lateness)`` and a 30 s tumbling
  ``window`` per patient in **append** mode, so each window is emitted once, final. Spark has
  no "fire early, then correct" (update mode re-emits open windows on every change): to count
  the same late rows as the engine, its watermark must lag by the engine's delay plus its
  allowed lateness, so a window's alert comes one lateness (60 s of event time) later.
  Readings behind Spark's watermark are dropped silently (the engine lists them).
  Duplicates: the window collects its readings (``collect_list`` of structs) and the
  aggregates are computed over ``array_distinct`` of them: an exact re-send counts once.
- **foreachBatch(df, id)**: the aggregates (the engine's, ``rules.AGGREGATES``, in Spark SQL),
  the abnormal windows (``rules.CHECKS``) and the episode logic, ``rules.assign`` verbatim,
  with the episodes kept in PostgreSQL; then one PostgreSQL transaction per micro-batch
  (``migrators.delivery``: watermark locked and checked by batch id, so a replay writes
  nothing twice): windows merged, alerts and episodes written, COMMIT.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from migrators import delivery, watermarks
from migrators.postgres import Session, copy_arrow, merge_rows
from sstore.base.files import parquet_bytes, write_atomically
from sstore.base.sql import ident
from sstore.workloads.icu import rules
from sstore.workloads.icu.dataflow import REASON_SQL
from sstore.workloads.icu.generator import READING_SCHEMA

SOURCE = "icu windows (spark structured streaming)"
WINDOW_S = int(rules.WINDOW.total_seconds())
WATERMARK_S = int((rules.DELAY + rules.LATENESS).total_seconds())
SPARK_SCHEMA = ("reading_id BIGINT, patient INT, ts TIMESTAMP_NTZ, hr INT, pap_sys DOUBLE, "
                "pap_dia DOUBLE, rr_ms INT")
WINDOW_SCHEMA = pa.schema([("patient", pa.int32()), ("window_start", pa.timestamp("us")),
                           ("window_end", pa.timestamp("us")), ("n", pa.int64()),
                           ("mean_pap", pa.float64()), ("mean_hr", pa.float64()),
                           ("irregularity", pa.float64())])
ALERT_SCHEMA = pa.schema([("alert_id", pa.int64()), ("patient", pa.int32()),
                          ("kind", pa.string()), ("window_start", pa.timestamp("us")),
                          ("window_end", pa.timestamp("us")), ("value", pa.float64()),
                          ("threshold", pa.float64()), ("committed_at", pa.float64())])

# The engine's aggregates over the distinct readings ``d`` (sorted by ts: ts leads the struct).
_AGGREGATES = [
    "size(d) AS n",
    # tenths of mmHg as integers: the engine's exact DECIMAL(12, 1) sum
    ("round(CAST(aggregate(d, 0L, (a, x) -> a + CAST(round((x.pap_sys + 2 * x.pap_dia) * 10) "
    "AS BIGINT)) AS DOUBLE) / 10 / (3 * size(d)), 2) AS mean_pap"),
    "round(aggregate(d, 0L, (a, x) -> a + x.hr) / size(d), 2) AS mean_hr",
    ("CASE WHEN size(d) > 1 THEN round(aggregate(sequence(2, size(d)), 0L, (a, i) -> a + "
    "abs(element_at(d, i).rr_ms - element_at(d, i - 1).rr_ms)) / (size(d) - 1) "
    "/ (aggregate(d, 0L, (a, x) -> a + x.rr_ms) / size(d)), 4) END AS irregularity"),
]


class StructuredStreamingIcu:
    """One streaming query: a directory of reading files in, the warehouse ``schema`` out."""

    def __init__(self, spark: SparkSession, url: str, schema: str, workdir: str,
                 name: str) -> None:
        self.spark, self.url, self.schema = spark, url, schema
        self.inbox, self.staging = (os.path.join(workdir, d) for d in ("inbox", "staging"))
        os.makedirs(self.inbox)
        os.makedirs(self.staging)
        self.session = Session(url)
        self.session.run(self._create, "create the Spark side's tables")
        self.alerts: list[dict] = []  # with committed_at (perf_counter after COMMIT)
        self.windows_emitted = 0
        self.micro_batches = 0
        self._failure: BaseException | None = None
        self._done = threading.Condition()
        self._files_done = 0
        readings = (spark.readStream.schema(SPARK_SCHEMA).option("maxFilesPerTrigger", 1)
                    .parquet(self.inbox))
        # Spark's watermark wants a TIMESTAMP (with time zone): NTZ -> session zone -> back
        clean = (readings.where(F.expr(REASON_SQL).isNull())
                 .withColumn("ts", F.col("ts").cast("timestamp")))
        windows = (clean.withWatermark("ts", f"{WATERMARK_S} seconds")
                   .groupBy("patient", F.window("ts", f"{WINDOW_S} seconds"))
                   .agg(F.collect_list(F.struct("ts", "reading_id", "hr", "pap_sys",
                                                "pap_dia", "rr_ms")).alias("rs")))
        self.query = (windows.writeStream.outputMode("append").queryName(name)
                      .foreachBatch(self._on_batch)
                      .option("checkpointLocation", os.path.join(workdir, "checkpoint"))
                      .start())

    def _create(self, con: Any) -> None:
        watermarks.ensure_watermarks(con)
        s = ident(self.schema)
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        con.execute(f"CREATE TABLE IF NOT EXISTS {s}.patient_windows (patient INTEGER, "
                    "window_start TIMESTAMP, window_end TIMESTAMP, n BIGINT, mean_pap DOUBLE "
                    "PRECISION, mean_hr DOUBLE PRECISION, irregularity DOUBLE PRECISION, "
                    "PRIMARY KEY (patient, window_start))")
        con.execute(f"CREATE TABLE IF NOT EXISTS {s}.alerts (alert_id BIGINT PRIMARY KEY, "
                    "patient INTEGER, kind TEXT, window_start TIMESTAMP, window_end TIMESTAMP, "
                    "value DOUBLE PRECISION, threshold DOUBLE PRECISION, "
                    "committed_at DOUBLE PRECISION)")
        con.execute(f"CREATE TABLE IF NOT EXISTS {s}.episodes (alert_id BIGINT PRIMARY KEY, "
                    "patient INTEGER, kind TEXT, first_start TIMESTAMP, last_end TIMESTAMP)")

    # -- the user's code -----------------------------------------------------------------------
    def _on_batch(self, df: DataFrame, batch_id: int) -> None:
        try:
            self._process(df, batch_id + 1)
        except BaseException as exc:
            with self._done:
                self._failure = exc
                self._done.notify_all()
            raise

    def _process(self, df: DataFrame, batch_id: int) -> None:
        rows = (df.select("patient",
                          F.col("window.start").cast("timestamp_ntz").alias("window_start"),
                          F.col("window.end").cast("timestamp_ntz").alias("window_end"),
                          F.array_sort(F.array_distinct("rs")).alias("d"))
                .selectExpr("patient", "window_start", "window_end", *_AGGREGATES)
                .toArrow())
        rows = rows.cast(WINDOW_SCHEMA) if rows.num_rows else WINDOW_SCHEMA.empty_table()
        flags = _flags(rows)
        self.micro_batches += 1
        written: list[dict] = []

        def write(cur: Any, _watermark: int) -> int:
            if rows.num_rows:
                merge_rows(cur, f"{self.schema}.patient_windows", rows,
                           ["patient", "window_start"])
            if flags:
                written.extend(self._alerts(cur, flags))
            return rows.num_rows

        key = delivery.SinkKey(SOURCE, "foreachBatch batchId", f"{self.schema}.patient_windows")
        self.session.run(lambda con: delivery.deliver(con, key, batch_id, batch_id, write,
                                                      after=None), f"micro-batch {batch_id}")
        now = time.perf_counter()
        for alert in written:
            alert["committed_at"] = now
        self.alerts.extend(written)
        self.windows_emitted += rows.num_rows

    def _alerts(self, cur: Any, flags: list[rules.Flag]) -> list[dict]:
        s = ident(self.schema)
        patients = sorted({f.patient for f in flags})
        known = [rules.Episode(*r) for r in cur.execute(
            f"SELECT alert_id, patient, kind, first_start, last_end FROM {s}.episodes "
            "WHERE patient = ANY(%s) ORDER BY alert_id", (patients,)).fetchall()]
        next_id = cur.execute(f"SELECT coalesce(max(alert_id), 0) + 1 FROM {s}.episodes"
                              ).fetchone()[0]
        # append mode: a window is emitted once, final, so no window is ever flagged twice
        alerts, touched = rules.assign(flags, known, int(next_id))
        for ep in touched:
            cur.execute(f"INSERT INTO {s}.episodes VALUES (%s, %s, %s, %s, %s) ON CONFLICT "
                        "(alert_id) DO UPDATE SET first_start = excluded.first_start, "
                        "last_end = excluded.last_end",
                        (ep.alert_id, ep.patient, ep.kind, ep.first_start, ep.last_end))
        out = [{"alert_id": ep.alert_id, "patient": f.patient, "kind": f.kind,
                "window_start": f.window_start, "window_end": f.window_end, "value": f.value,
                "threshold": rules.threshold_of(f.kind), "committed_at": 0.0}
               for f, ep in alerts]
        if out:
            copy_arrow(cur, f"{self.schema}.alerts", pa.Table.from_pylist(out, ALERT_SCHEMA))
        return out

    # -- the driver's side ---------------------------------------------------------------------
    def send(self, index: int, table: pa.Table) -> float:
        """Drop arrival batch ``index`` into the watched directory; return the time it was
        sent (``perf_counter``), once Spark has processed every file sent so far."""
        name = f"batch-{index:08d}.parquet"
        sent = time.perf_counter()
        write_atomically(os.path.join(self.inbox, name), parquet_bytes(table.cast(READING_SCHEMA)),
                         staging_dir=self.staging)
        self.query.processAllAvailable()
        if self._failure is not None:
            raise RuntimeError(f"Spark foreachBatch failed: {self._failure}") from self._failure
        return sent

    def close(self) -> None:
        try:
            self.query.stop()
        finally:
            self.session.close()


def _flags(rows: pa.Table) -> list[rules.Flag]:
    """``rules.flag_sql`` in Python, in the same order."""
    out = []
    for r in rows.to_pylist():
        if r["n"] < rules.MIN_READINGS:
            continue
        for kind, (column, op, threshold) in rules.CHECKS.items():
            value = r[column]
            if value is not None and (value < threshold if op == "<" else value > threshold):
                out.append(rules.Flag(r["patient"], kind, r["window_start"], r["window_end"],
                                      float(value)))
    out.sort(key=lambda f: (f.window_start, f.patient, f.kind))
    return out
