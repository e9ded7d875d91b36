"""The chain on Spark Structured Streaming: what a Spark user would write for the same job.

The alternative a user would pick for a streaming job is Spark Structured Streaming, so
``benchmarks.engine`` runs the same 3-step chain on it, over the same input batches, in the same
closed loop, and checks that it ends with the same per-user totals as the engine.

How it is written, and why:

- **Input**: one Parquet file per batch, dropped into a directory that a file source reads with
  ``maxFilesPerTrigger=1``, so one input batch is one micro-batch. Each file is written in a
  staging directory, fsync'd and renamed in (the file source must never list half a file; the
  fsync is what the engine's durable ingest pays too). Files, not a rate or memory source:
  batches arrive from outside the JVM with exact boundaries, and the part of Spark a real
  pipeline pays for (listing, reading, the offset log) is measured.
- **Trigger**: the default (``ProcessingTime(0)``): a micro-batch starts as soon as a new file is
  listed; an idle source is polled every ``spark.sql.streaming.pollingDelay`` (10 ms).
- **foreachBatch** does the three steps: validate (the same predicate as the engine), enrich (a
  broadcast join with the lookup table, cached in Spark once per run), aggregate per user in
  Spark. The per-user deltas (at most one row per input row) come back to the driver as Arrow
  and are upserted into a **DuckDB state file**, with the batch's per-region summary and its
  batch id, in one DuckDB transaction. That is the documented foreachBatch idiom (upsert each
  micro-batch into a table, use the batch id to make replays no-ops: exactly once), it leaves
  the state as a queryable table as in the engine, and its durability is the engine's full
  mode (a DuckDB file, fsync at COMMIT). Spark's own state store (a streaming ``groupBy`` in
  update mode) would keep the totals in checkpoint files nobody can query, still need such a
  sink for them, and add a shuffle and a state-store commit per partition per micro-batch.
- **Latency**: from just before the batch's file is written (the engine's starts just before
  ``ingest``) to the end of foreachBatch, after the DuckDB COMMIT. Spark writes its commit log
  after that, overlapping the next batch. ``file_write_ms_p50`` is the file's share.
- **CPU**: ``cpu_per_wall`` counts this process and the Spark JVM (from ``/proc``).

Spark starts once per run (``migrators.spark_session.get_spark("local[2]")``); each batch size
runs its own query, with a fresh input directory, checkpoint and state file.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from benchmarks.common import percentile
from benchmarks.engine_driver import Budget, LatencyProbe, Measurement, measure, slices
from benchmarks.engine_workloads import (
    STATE_DDL,
    TOTALS_SQL,
    VALID_PREDICATE,
    chain_totals,
    lookup_rows,
)
from benchmarks.sss_batches import BatchBoard
from sstore.base.files import parquet_bytes, write_atomically

MASTER = "local[2]"
RAW_SCHEMA = "event_id BIGINT, user_id BIGINT, amount DOUBLE, kind STRING"
WAIT_SECONDS = 120.0  # a micro-batch slower than this means the query is stuck

SUMMARY_DDL = ("CREATE TABLE region_summary (batch_id BIGINT NOT NULL, region VARCHAR, "
               "n BIGINT, total DOUBLE)")
BATCHES_DDL = "CREATE TABLE spark_batches (batch_id BIGINT PRIMARY KEY)"
UPSERT_SQL = ("INSERT INTO user_totals SELECT user_id, n, total FROM per_user "
              "ON CONFLICT (user_id) DO UPDATE "
              "SET n = n + excluded.n, total = total + excluded.total")
SUMMARY_SQL = ("INSERT INTO region_summary SELECT ?, region, sum(n)::BIGINT, sum(total) "
               "FROM per_user GROUP BY region")

warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")


class SparkUnavailable(Exception):
    """pyspark, Java or the session helper is missing: the run goes on without Spark."""


class SparkRun:
    """The run's one SparkSession and what every query shares: the cached lookup table."""

    def __init__(self, master: str = MASTER) -> None:
        try:
            from migrators.spark_session import get_spark
            self.spark = get_spark(master)
        except Exception as exc:
            raise SparkUnavailable(f"{type(exc).__name__}: {exc}") from exc
        self.version = self.spark.version
        self.users = self.spark.createDataFrame(lookup_rows()).cache()
        self.users.count()  # materialise the cache now, not in the first measured batch
        self.jvm_pid = _child_jvm()

    def warm_up(self, source: pa.Table, state_dir: str, batches: int) -> None:
        """Run a throwaway query: the JVM compiles the file source, the plan and the broadcast
        over its first micro-batches (the first takes ~10 s), which would otherwise land in the
        first configuration's numbers."""
        chain = SparkChain(self, state_dir, "sstore_bench_warm_up")
        try:
            for batch_id, table in enumerate(slices(source, 100, batches), 1):
                chain.step(batch_id, table)
        finally:
            chain.close()

    def cpu_seconds(self) -> float:
        """CPU time of this process and the Spark JVM."""
        return time.process_time() + _process_cpu(self.jvm_pid)

    def close(self) -> None:
        from migrators.spark_session import stop_spark
        self.users.unpersist()
        stop_spark()


class SparkChain:
    """One streaming query: a directory of Parquet files in, per-user totals in DuckDB out."""

    def __init__(self, run: SparkRun, state_dir: str, name: str) -> None:
        from pyspark.sql import functions as F
        self._F = F
        self._users = run.users
        self.inbox, self.staging = (os.path.join(state_dir, d) for d in ("inbox", "staging"))
        os.makedirs(self.inbox)
        os.makedirs(self.staging)
        self.state = duckdb.connect(os.path.join(state_dir, "spark_state.duckdb"))
        for ddl in (STATE_DDL, SUMMARY_DDL, BATCHES_DDL):
            self.state.execute(ddl)
        self.probe = LatencyProbe()
        self.write_ms: list[float] = []
        self.replays = 0
        self._inside: dict[int, tuple[float, float]] = {}  # seconds in Spark jobs, in DuckDB
        self._board = BatchBoard(WAIT_SECONDS)
        self.query = (run.spark.readStream.schema(RAW_SCHEMA)
                      .option("maxFilesPerTrigger", 1).parquet(self.inbox)
                      .writeStream.queryName(name).foreachBatch(self._on_batch)
                      .option("checkpointLocation", os.path.join(state_dir, "checkpoint"))
                      .start())

    # -- the user's code: what runs in foreachBatch ------------------------------------------
    def _on_batch(self, df: Any, spark_batch_id: int) -> None:
        batch_id = spark_batch_id + 1  # Spark counts micro-batches from 0, batch-ids from 1
        try:
            F = self._F
            started = time.perf_counter()
            per_user = (df.where(VALID_PREDICATE)
                        .join(F.broadcast(self._users), "user_id")
                        .groupBy("user_id", "region")
                        .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
                        .toArrow())
            collected = time.perf_counter()
            self._commit(batch_id, per_user)
            self._inside[batch_id] = (collected - started, time.perf_counter() - collected)
        except BaseException as exc:
            self._board.failed(exc)
            raise
        self._board.done(batch_id)

    def _commit(self, batch_id: int, per_user: pa.Table) -> None:
        """Upsert the batch's per-user deltas, its region summary and its id, atomically; a
        batch id already recorded is a replay after a restart and changes nothing."""
        con = self.state
        con.begin()
        try:
            if con.execute("SELECT count(*) FROM spark_batches WHERE batch_id = ?",
                           [batch_id]).fetchall()[0][0]:
                con.rollback()
                self.replays += 1
                return
            con.register("per_user", per_user)
            con.execute(UPSERT_SQL)
            con.execute(SUMMARY_SQL, [batch_id])
            con.execute("INSERT INTO spark_batches VALUES (?)", [batch_id])
            con.commit()
        except BaseException:
            con.rollback()
            raise

    # -- the driver's side ---------------------------------------------------------------------
    def step(self, batch_id: int, table: pa.Table) -> int:
        """Drop the batch's file into the input directory; wait for its foreachBatch."""
        started = time.perf_counter()
        name = f"batch-{batch_id:08d}.parquet"
        write_atomically(os.path.join(self.inbox, name), parquet_bytes(table),
                         staging_dir=self.staging)
        self.write_ms.append((time.perf_counter() - started) * 1000)
        self.probe.record(batch_id, started, self._board.wait(batch_id, self.query))
        return 1

    def breakdown(self, first: int) -> dict[str, float]:
        """Median milliseconds per batch from batch-id ``first`` on: Spark's own trigger phases
        (its progress reports) and the two halves of foreachBatch."""
        phases: dict[str, list[float]] = {}
        for progress in self.query.recentProgress:
            if progress.batchId + 1 >= first:
                for phase, ms in progress.durationMs.items():
                    phases.setdefault(f"trigger: {phase}", []).append(float(ms))
        for batch_id, (in_spark, in_duckdb) in self._inside.items():
            if batch_id >= first:
                phases.setdefault("foreachBatch: Spark jobs (validate, broadcast join, "
                                  "aggregate, toArrow)", []).append(in_spark * 1000)
                phases.setdefault("foreachBatch: DuckDB upsert + COMMIT", []).append(
                    in_duckdb * 1000)
        return {phase: round(percentile(values, 0.5), 1) for phase, values in phases.items()}

    def totals(self) -> pa.Table:
        return self.state.sql(TOTALS_SQL).to_arrow_table()

    def close(self) -> None:
        try:
            self.query.stop()
        finally:
            self.state.close()
            # py4j keeps the foreachBatch callback (so this object) until the JVM collects its
            # proxy: let go of the DuckDB objects now, or nanobind reports them leaked at exit
            del self.state


def run_spark(run: SparkRun, batch_size: int, budget: Budget, source: pa.Table, state_dir: str,
              tick: Callable[[], None]) -> Measurement:
    """Measure the chain on Spark at ``batch_size``, then check its per-user totals against
    the engine's over the very same batches."""
    chain = SparkChain(run, state_dir, f"sstore_bench_chain_{batch_size}")
    try:
        m = measure(chain.step, source, batch_size, budget, chain.probe, tick,
                    warmup=budget.spark_warmup_batches, max_seconds=budget.spark_max_seconds,
                    cpu_clock=run.cpu_seconds)
        got = chain.totals()
        breakdown = chain.breakdown(first=m.warmup + 1)
    finally:
        chain.close()
    fed = m.warmup + m.batches
    check_same_totals(got, chain_totals(slices(source, batch_size, fed)),
                      f"Spark vs sstore, batch size {batch_size}, {fed} batches")
    m.extra = {"file_write_ms_p50": round(percentile(chain.write_ms, 0.5), 3),
               "checked_users": got.num_rows, "checked_batches": fed,
               "replayed_batches": chain.replays, "spark_version": run.version,
               "spark_breakdown_ms_p50": breakdown}
    return m


def check_same_totals(got: pa.Table, want: pa.Table, what: str) -> None:
    """The same users with the same counts, and sums equal up to the order of the additions
    (Spark and DuckDB add a user's amounts within a batch in their own order)."""
    problems = []
    if got.num_rows != want.num_rows:
        problems.append(f"{got.num_rows} users, the engine has {want.num_rows}")
    elif not got["user_id"].equals(want["user_id"]):
        problems.append("different user ids")
    elif not got["n"].equals(want["n"]):
        problems.append("different event counts per user")
    elif not np.allclose(got["total"].to_numpy(), want["total"].to_numpy(), rtol=1e-9,
                         atol=1e-6):
        problems.append("different amount totals per user")
    if not want.num_rows:
        problems.append("no user totals at all: nothing was checked")
    if problems:
        raise AssertionError(f"{what}: not the same work: {'; '.join(problems)}")


def _child_jvm() -> int | None:
    """The pid of the JVM pyspark started as a child of this process, if it can be found."""
    me = str(os.getpid())
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/comm", encoding="ascii") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if fields[1] == me and comm == "java":
            return int(entry)
    return None


def _process_cpu(pid: int | None) -> float:
    """User plus system CPU seconds of ``pid`` (0 when unknown or gone)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
