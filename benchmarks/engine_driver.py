"""The closed-loop driver of ``benchmarks.engine``: push batches through one system, time them.

One round is: hand the system one batch, wait until the batch's last transaction has
committed, next batch. That is how a single-threaded application uses the engine and it makes
the latency honest (no queueing), at the price of measuring throughput without pipelining.
Each configuration is bounded by batches, rows and seconds (``Budget``).

A system is a ``Step``: ``step(batch_id, rows) -> transactions committed``, which records the
batch's latency in a ``LatencyProbe`` itself (only the system knows when a batch is done). For
the engine the end of a batch is the COMMIT of its last transaction execution, as reported by
``Engine.observe``; for the baseline, the return of its one transaction.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from benchmarks.common import percentile
from benchmarks.engine_workloads import (
    InputLogFile,
    Workload,
    create_chain_tables,
    run_chain_by_hand,
)
from sstore import CommitEvent, Engine

SYSTEMS = {"baseline": "duckdb-by-hand", "spark": "spark-structured-streaming"}


@dataclass(frozen=True)
class Budget:
    """Bounds of one configuration, by batches, rows and seconds, so that the batch-size-1 runs
    do not take forever and the 10,000-row runs do not eat all the memory. Spark gets its own
    warm-up (its first micro-batches compile code) and time bound (a batch costs ~1 s)."""

    max_batches: int
    max_rows: int
    max_seconds: float
    warmup_batches: int
    profile_batches: int
    passes: int
    spark_warmup_batches: int
    spark_max_seconds: float

    def batches_for(self, batch_size: int) -> int:
        """Measured batches for ``batch_size`` (at least 3, so a percentile means something)."""
        return max(3, min(self.max_batches, self.max_rows // batch_size))

    def rows_needed(self, batch_sizes: Sequence[int]) -> int:
        """Input rows to generate once per workload: enough for the largest configuration."""
        warmup = max(self.warmup_batches, self.spark_warmup_batches)
        return max((self.batches_for(b) + warmup) * b for b in batch_sizes)


FULL_BUDGET = Budget(max_batches=400, max_rows=1_000_000, max_seconds=7.0, warmup_batches=3,
                     profile_batches=200, passes=2, spark_warmup_batches=4,
                     spark_max_seconds=8.0)
QUICK_BUDGET = Budget(max_batches=40, max_rows=30_000, max_seconds=0.6, warmup_batches=1,
                      profile_batches=30, passes=1, spark_warmup_batches=2,
                      spark_max_seconds=2.0)


@dataclass(frozen=True)
class Config:
    workload: str  # "chain", "voter", "baseline" (the chain by hand) or "spark" (the chain)
    mode: str
    batch_size: int


Step = Callable[[int, pa.Table], int]  # (batch_id, rows) -> transactions executed


class LatencyProbe:
    """Per-batch latency: from just before the system gets the batch to the commit of the
    batch's last transaction."""

    def __init__(self) -> None:
        self.latencies: dict[int, float] = {}

    def record(self, batch_id: int, started: float, committed: float) -> None:
        if committed < started:
            raise RuntimeError(f"batch {batch_id}: no transaction committed after its ingest "
                               f"(a procedure halted?)")
        self.latencies[batch_id] = (committed - started) * 1000

    def latencies_ms(self, batch_ids: Sequence[int]) -> list[float]:
        return [self.latencies[b] for b in batch_ids]


@dataclass
class Measurement:
    batches: int
    rows: int
    seconds: float
    transactions: int
    cpu_seconds: float  # CPU time of the system's processes: far below ``seconds`` = waiting
    latencies_ms: list[float] = field(repr=False)
    warmup: int = 0  # batches before the measured ones (batch-ids 1..warmup)
    extra: dict[str, Any] = field(default_factory=dict)  # system-specific facts for the record


def slices(table: pa.Table, batch_size: int, count: int) -> Iterator[pa.Table]:
    """``count`` consecutive zero-copy batches of ``batch_size`` rows."""
    for i in range(count):
        yield table.slice(i * batch_size, batch_size)


def measure(step: Step, source: pa.Table, batch_size: int, budget: Budget, probe: LatencyProbe,
            tick: Callable[[], None], *, warmup: int | None = None,
            max_seconds: float | None = None,
            cpu_clock: Callable[[], float] = time.process_time) -> Measurement:
    """Warm up, then push batches through ``step`` until the batch or time budget runs out."""
    warm = budget.warmup_batches if warmup is None else warmup
    limit = budget.max_seconds if max_seconds is None else max_seconds
    batches = slices(source, batch_size, warm + budget.batches_for(batch_size))
    for batch_id in range(1, warm + 1):
        step(batch_id, next(batches))
        tick()
    ids: list[int] = []
    rows = transactions = 0
    cpu_start = cpu_clock()
    start = time.perf_counter()
    for batch_id, table in enumerate(batches, start=warm + 1):
        transactions += step(batch_id, table)
        rows += table.num_rows
        ids.append(batch_id)
        tick()
        if time.perf_counter() - start > limit and len(ids) >= 3:
            break
    seconds = time.perf_counter() - start
    cpu = cpu_clock() - cpu_start
    return Measurement(len(ids), rows, seconds, transactions, cpu, probe.latencies_ms(ids), warm)


# ---------------------------------------------------------------------------------------------
# the engine


def open_engine(mode: str, state_dir: str) -> Engine:
    """Full durability: a DuckDB file. Weak: memory plus an fsync'd input log."""
    if mode == "full":
        return Engine(os.path.join(state_dir, "state.duckdb"))
    return Engine(":memory:", input_log=os.path.join(state_dir, "input.log"))


class LastCommits:
    """An ``Engine.observe`` callback: when each batch's last transaction execution committed."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}

    def __call__(self, event: CommitEvent) -> None:
        if event.kind == "te":
            self.at[event.batch_id] = event.at


def start_engine(workload: Workload, mode: str, state_dir: str) -> tuple[Engine, LastCommits]:
    """Open and declare an engine, and observe its commits (which starts it)."""
    eng = open_engine(mode, state_dir)
    workload.declare(eng)
    commits = LastCommits()
    eng.observe(commits)
    return eng, commits


def engine_step(eng: Engine, stream: str, commits: LastCommits, probe: LatencyProbe) -> Step:
    """One closed-loop round: ingest the batch, run everything it made runnable
    (``Engine.ingest_and_run``: one transaction with the batch's TEs)."""
    def step(batch_id: int, table: pa.Table) -> int:
        started = time.perf_counter()
        tes = eng.ingest_and_run(stream, table, batch_id=batch_id).executions
        probe.record(batch_id, started, commits.at.get(batch_id, 0.0))
        return tes
    return step


def run_engine(workload: Workload, mode: str, batch_size: int, budget: Budget, source: pa.Table,
               state_dir: str, tick: Callable[[], None]) -> Measurement:
    eng, commits = start_engine(workload, mode, state_dir)
    try:
        probe = LatencyProbe()
        step = engine_step(eng, workload.input_stream, commits, probe)
        result = measure(step, source, batch_size, budget, probe, tick)
    finally:
        eng.close()
    expected = workload.tes_per_batch
    if expected is not None and result.transactions != expected * result.batches:
        raise RuntimeError(f"{workload.name}/{mode}/{batch_size}: {result.transactions} TEs for "
                           f"{result.batches} batches, expected {expected} per batch")
    return result


# ---------------------------------------------------------------------------------------------
# the chain by hand


def baseline_step(con: duckdb.DuckDBPyConnection, log: InputLogFile | None,
                  probe: LatencyProbe) -> Step:
    def step(batch_id: int, table: pa.Table) -> int:
        started = time.perf_counter()
        if log is not None:
            log.append(table)
        run_chain_by_hand(con, table)
        probe.record(batch_id, started, time.perf_counter())
        return 1
    return step


def run_baseline(mode: str, batch_size: int, budget: Budget, source: pa.Table, state_dir: str,
                 tick: Callable[[], None]) -> Measurement:
    full = mode == "full"
    con = duckdb.connect(os.path.join(state_dir, "baseline.duckdb") if full else ":memory:")
    log = None if full else InputLogFile(os.path.join(state_dir, "baseline.log"))
    try:
        create_chain_tables(lambda sql: con.execute(sql).fetchall())
        probe = LatencyProbe()
        return measure(baseline_step(con, log, probe), source, batch_size, budget, probe, tick)
    finally:
        if log is not None:
            log.close()
        con.close()


# ---------------------------------------------------------------------------------------------
# records


def to_record(config: Config, m: Measurement) -> dict[str, Any]:
    return {
        "workload": config.workload,
        "system": SYSTEMS.get(config.workload, "sstore"),
        "mode": config.mode,
        "batch_size": config.batch_size,
        "batches": m.batches,
        "rows": m.rows,
        "seconds": round(m.seconds, 4),
        "transactions": m.transactions,
        "te_per_s": round(m.transactions / m.seconds, 1),
        "ms_per_te": round(m.seconds * 1000 / m.transactions, 3),
        "batches_per_s": round(m.batches / m.seconds, 1),
        "rows_per_s": round(m.rows / m.seconds, 1),
        "p50_ms": round(percentile(m.latencies_ms, 0.50), 3),
        "p99_ms": round(percentile(m.latencies_ms, 0.99), 3),
        "max_ms": round(max(m.latencies_ms), 3),
        "cpu_per_wall": round(m.cpu_seconds / m.seconds, 3),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        **m.extra,
    }
