"""One measured run of a system over one data set: the sstore engine, Spark bulk, or Spark
Structured Streaming (``benchmarks.tpcdi_sss``), each into its own fresh warehouse schema.

Every run does the same three TPC-DI batches in the same order: dimensions of Batch1 (copied
from the scale factor's snapshot, ``tpcdi_setup``), Batch1's trades (the historical phase),
then for Batch2 and Batch3 their dimension versions and their trades (the incremental phase).
Only the trade phases are in the throughput; dimension phases are recorded apart.

Streaming runs are fed closed loop by default: a batch of ``batch_events`` trade events is
sent, the next one as soon as the system has taken it (the engine: its five procedures
committed, while its sinks, one group, move earlier batches into PostgreSQL in their thread;
Spark: its micro-batch committed in PostgreSQL). A phase ends when everything sent is visible
in PostgreSQL. A closed loop measures a system at its saturation, where latency is mostly
queueing (Little's law: the batches in flight / the throughput). ``Budget.rate_trades`` feeds
open loop instead, as a source that does not wait for its consumer does: batch ``i`` of a
phase is due ``i * batch_trades / rate_trades`` seconds after the phase's first, is sent then
(or at once, if the system is behind), and its latency is taken from when it was due, so a
system that cannot keep up shows its growing backlog instead of hiding it (no coordinated
omission).

Latency, arrival -> visible in PostgreSQL, per batch and without slowing the run down:

- engine: arrival is just before ``Engine.ingest``; visibility is the COMMIT of the sink
  transaction that carries the batch's rows, for each of the three sinks that got rows from
  it (the latest of them). The commit times come from the sinks' public ``on_delivered`` hook
  (``migrators.engine_to_postgres.Delivered``). The run is the normal pipelined run, not
  ``wait_each_batch``.
- Spark Structured Streaming: see ``tpcdi_sss`` (file written -> COMMIT in foreachBatch).
- Spark bulk: a batch is a whole TPC-DI batch (files present -> its transaction committed).

Budget: a phase is measured for at most ``Budget.phase_seconds``; if that runs out, the rest of
the phase's events go in large batches (``CATCH_UP_EVENTS``) that are not measured, so the
warehouse still ends complete and can be checked against the other systems, and the phase is
marked ``capped``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from benchmarks.common import percentile
from benchmarks.tpcdi_coalescing import CoalescingFeed
from benchmarks.tpcdi_feed import EngineFeed
from benchmarks.tpcdi_profile import EngineProfile
from benchmarks.tpcdi_setup import (
    TPCDI_BATCHES,
    DataSet,
    event_source,
    fingerprint,
    fresh_warehouse,
    install_dimensions,
)
from sstore.workloads.tpcdi.streaming.events import BatchEvents

Tick = Callable[[int], None]  # events just sent
CATCH_UP_EVENTS = 1_000_000  # the unmeasured rest of a capped phase goes in batches this large
SERIES_POINTS = 400  # per-batch series in the JSON are medians of at most this many buckets


@dataclass(frozen=True)
class Budget:
    phase_seconds: float  # measured part of one TPC-DI batch's trades, per run
    rate_trades: float = 0.0  # offered trades/s, open loop (module docstring); 0: closed loop

    def interval(self, batch_trades: int) -> float:
        """Seconds between two batches' due times; 0.0 in a closed loop."""
        return batch_trades / self.rate_trades if self.rate_trades > 0 and batch_trades else 0.0


@dataclass
class Phase:
    """One TPC-DI batch's trades. ``seconds`` is the measured part: from the first batch's
    arrival to the last measured batch being visible in PostgreSQL."""

    name: str
    tpcdi_batch: int
    events: int
    seconds: float
    measured_events: int
    batches: int
    capped: bool = False
    catch_up_seconds: float = 0.0


@dataclass
class Run:
    system: str  # "spark-bulk", "sstore", "reference", "spark-sss"
    scale_factor: float
    batch_trades: int | None
    batch_events: int | None
    phases: list[Phase]
    dimension_seconds: dict[str, float]
    latencies_ms: dict[int, list[float]]  # per TPC-DI batch, its measured batches in order
    result: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    offered_trades_per_s: float | None = None  # open loop (Budget.rate_trades); None: closed


class Feed(Protocol):
    def begin(self, events: BatchEvents) -> None: ...

    def send(self, chunk: pa.Table, measured: bool, due: float | None = None) -> None:
        """``due``: open loop, when the batch was due (``perf_counter``), its latency's start;
        None: closed loop, the feed takes its own arrival time."""

    def finish(self) -> None: ...


def feed_phase(feed: Feed, events: BatchEvents, batch_events: int, budget: Budget,
               tick: Tick, service_ms: list[float] | None = None,
               batch_trades: int = 0) -> Phase:
    """Send one TPC-DI batch's events in batches of ``batch_events`` (``batch_trades``
    trades), closed loop or at ``budget.rate_trades`` (module docstring). ``service_ms``: gets
    the wall time of each measured ``send`` (the per-batch cost, to see whether it stays flat
    as the state grows)."""
    lines, name = events.lines, _phase_name(events.tpcdi_batch)
    began = time.perf_counter()
    feed.begin(events)
    interval = budget.interval(batch_trades)
    first = time.perf_counter()
    done = batches = 0
    while done < lines.num_rows and time.perf_counter() - began < budget.phase_seconds:
        chunk = lines.slice(done, batch_events)
        due = None
        if interval:
            due = first + batches * interval
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        t0 = time.perf_counter()
        feed.send(chunk, measured=True, due=due)
        if service_ms is not None:
            service_ms.append((time.perf_counter() - t0) * 1000)
        done, batches = done + chunk.num_rows, batches + 1
        tick(chunk.num_rows)
    feed.finish()
    phase = Phase(name, events.tpcdi_batch, lines.num_rows, time.perf_counter() - began, done,
                  batches)
    if done < lines.num_rows:
        t0 = time.perf_counter()
        step = max(batch_events, CATCH_UP_EVENTS)
        for start in range(done, lines.num_rows, step):
            chunk = lines.slice(start, step)
            feed.send(chunk, measured=False)
            tick(chunk.num_rows)
        feed.finish()
        phase.capped, phase.catch_up_seconds = True, time.perf_counter() - t0
    return phase


def series(values: list[float], points: int = SERIES_POINTS) -> list[list[float]]:
    """``values`` (one per batch, in order) as at most ``points`` pairs [index of the first
    batch of a bucket, median ms of the bucket's consecutive batches]: small enough for the
    JSON, fine enough for a chart of per-batch cost over a run."""
    if not values:
        return []
    step = max(1, -(-len(values) // points))
    return [[i, round(percentile(values[i:i + step], 0.5), 3)]
            for i in range(0, len(values), step)]


def phase_service(service: dict[int, list[float]]) -> dict[str, Any]:
    """Run.extra fields from the per-batch ``send`` times of each TPC-DI batch."""
    hist = service.get(1, [])
    return {"service_ms_p50": round(percentile(hist, 0.5), 3),
            "service_series_ms": series(hist)}


def whole_batch_events(data: DataSet) -> int:
    """A batch size at which every TPC-DI batch is one chunk (``batch_trades`` 0)."""
    return max(e.lines.num_rows for e in data.events.values())


def _phase_name(tpcdi_batch: int) -> str:
    return "historical (Batch1)" if tpcdi_batch == 1 else f"incremental (Batch{tpcdi_batch})"


# -- the engine -------------------------------------------------------------------------------


def run_engine(data: DataSet, url: str, schema: str, state_dir: str, batch_trades: int,
               batch_events: int, budget: Budget, tick: Tick, profile: bool = False,
               coalesce_events: int = 0) -> Run:
    """``profile``: also time every batch by phase (``tpcdi_profile``; a little slower).
    ``coalesce_events`` > 0: the ``sstore-coalescing`` system (``benchmarks.tpcdi_coalescing``),
    at most that many events per engine batch."""
    from sstore.workloads.tpcdi.streaming.pipeline import StreamingDimTrade

    fresh_warehouse(url, schema)
    dims = {"copy Batch1": install_dimensions(url, schema, 1)}
    pipeline = StreamingDimTrade(data.path, url, os.path.join(state_dir, "state.duckdb"), schema,
                                 batch_size=batch_events)
    phases: list[Phase] = []
    service: dict[int, list[float]] = {}
    profiler = EngineProfile() if profile else None
    try:
        t0 = time.perf_counter()
        pipeline.refresh_lookups()
        dims["lookups Batch1"] = time.perf_counter() - t0
        feed = CoalescingFeed(pipeline, profiler, coalesce_events) if coalesce_events \
            else EngineFeed(pipeline, profiler)
        pipeline.sink_group.attach()
        try:
            with profiler.installed() if profiler else contextlib.nullcontext():
                for batch in TPCDI_BATCHES:
                    if batch > 1:
                        dims[f"copy Batch{batch}"] = install_dimensions(url, schema, batch)
                        t0 = time.perf_counter()
                        pipeline.refresh_lookups()
                        dims[f"lookups Batch{batch}"] = time.perf_counter() - t0
                    service[batch] = []
                    phases.append(feed_phase(feed, data.events[batch], batch_events, budget,
                                             tick, service[batch], batch_trades))
        finally:
            try:
                feed.close()  # a coalescer that failed raises here, after its phase did
            finally:
                pipeline.sink_group.detach()
    finally:
        pipeline.close()
    if isinstance(feed, CoalescingFeed):  # per engine batch, not per offer
        service = feed.service
    extra: dict[str, Any] = {"breakdown_ms_p50": feed.breakdown(), "engine_batches": feed._batch,
                             **({"coalesce_events": coalesce_events} if coalesce_events else {}),
                             **phase_service(service)}
    if profiler is not None:
        extra["profile"] = feed.profile_summary()
    system = "sstore-coalescing" if coalesce_events else "sstore"
    return Run(system, data.scale_factor, batch_trades, batch_events, phases, dims,
               feed.latencies_ms(), fingerprint(url, schema), extra)


# -- Spark Structured Streaming -------------------------------------------------------------------
class SparkStreamingFeed:
    """Feeds ``tpcdi_sss.StructuredStreamingDimTrade`` (closed loop, one file per batch)."""

    def __init__(self, job: Any, data: DataSet) -> None:
        self.job, self.data = job, data
        self.latencies: dict[int, list[float]] = {b: [] for b in TPCDI_BATCHES}
        self.measured: set[int] = set()
        self._tpcdi_batch = 0

    def begin(self, events: BatchEvents) -> None:
        self._tpcdi_batch = events.tpcdi_batch
        self.job.store_file_rejects(events.rejects, events.tpcdi_batch,
                                    event_source(self.data, events.tpcdi_batch))

    def send(self, chunk: pa.Table, measured: bool, due: float | None = None) -> None:
        times = self.job.send(chunk)
        if measured:
            arrival = times.arrival if due is None else due
            self.latencies[self._tpcdi_batch].append((times.visible - arrival) * 1000)
            self.measured.add(self.job.sent)

    def finish(self) -> None:
        pass  # each batch is in PostgreSQL when send returns


def run_spark_streaming(spark: Any, data: DataSet, url: str, schema: str, workdir: str,
                        batch_trades: int, batch_events: int, budget: Budget, tick: Tick) -> Run:
    from benchmarks.tpcdi_sss import StructuredStreamingDimTrade

    fresh_warehouse(url, schema)
    dims = {"copy Batch1": install_dimensions(url, schema, 1)}
    job = StructuredStreamingDimTrade(spark, data.path, url, schema, workdir,
                                      f"tpcdi_sss_{schema}")
    feed = SparkStreamingFeed(job, data)
    phases: list[Phase] = []
    service: dict[int, list[float]] = {}
    try:
        t0 = time.perf_counter()
        job.load_dimensions(1)
        dims["lookups Batch1"] = time.perf_counter() - t0
        for batch in TPCDI_BATCHES:
            if batch > 1:
                dims[f"copy Batch{batch}"] = install_dimensions(url, schema, batch)
                t0 = time.perf_counter()
                job.load_dimensions(batch)
                dims[f"lookups Batch{batch}"] = time.perf_counter() - t0
            service[batch] = []
            phases.append(feed_phase(feed, data.events[batch], batch_events, budget, tick,
                                     service[batch], batch_trades))
        extra = {"breakdown_ms_p50": job.breakdown(lambda b: b in feed.measured),
                 "micro_batches": job.sent, "replayed_batches": job.replays,
                 "spark_version": spark.version, **phase_service(service)}
    finally:
        job.close()
    return Run("spark-sss", data.scale_factor, batch_trades, batch_events, phases, dims,
               feed.latencies, fingerprint(url, schema), extra)


# -- Spark bulk ------------------------------------------------------------------------------------
def run_spark_bulk(spark: Any, data: DataSet, url: str, schema: str, tick: Tick) -> Run:
    """``spark_pipeline.run_spark``'s trade steps, with the dimensions copied in between."""
    from sstore.workloads.tpcdi import dimtrade_spark

    fresh_warehouse(url, schema)
    dims: dict[str, float] = {}
    phases: list[Phase] = []
    latencies: dict[int, list[float]] = {}
    reports = []
    for batch in TPCDI_BATCHES:
        dims[f"copy Batch{batch}"] = install_dimensions(url, schema, batch)
        t0 = time.perf_counter()
        if batch == 1:
            report = dimtrade_spark.load_historical(spark, data.path, url, schema)
        else:
            report = dimtrade_spark.apply_batch(spark, data.path, url, schema, batch)
        seconds = time.perf_counter() - t0
        events = data.events[batch].lines.num_rows
        phases.append(Phase(_phase_name(batch), batch, events, seconds, events, 1))
        latencies[batch] = [seconds * 1000]
        reports.append({"batch": batch, "rows_in": report.rows_in,
                        "rows_loaded": report.rows_loaded, "rejected": report.rows_rejected,
                        "inserted": report.trades_inserted, "updated": report.trades_updated})
        tick(events)
    return Run("spark-bulk", data.scale_factor, None, None, phases, dims, latencies,
               fingerprint(url, schema), {"trade_reports": reports})
