"""The engine's live numbers: counted on each commit, the rest read from memory when asked.

Two paths, kept apart on purpose:

1. The commit path (``on_commit``, an ``Engine.observe`` observer, run under the engine's
   lock after each ingest and transaction execution): a few integer additions, one histogram
   observation, and for streams that a sink reads the batch's commit time. No SQL, no I/O.
2. The read path (``snapshot``, when ``/metrics`` or ``/status`` is read, in the server's
   thread): the counters under this object's own mutex; then the engine's ledger (pending
   batches, retained batches and rows, holders, halted procedures, sink lags), in memory too,
   under the engine's lock taken with a short timeout. A reader never waits behind a long
   transaction: when the lock is busy it reuses the last ledger view and says so (``stale``).
   The only SQL is a point lookup of a commit time that memory does not have (a batch
   committed before this process started), under that same lock.
"""

from __future__ import annotations

import bisect
import datetime
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram

from sstore.execution.runtime import CommitEvent, Runtime
from sstore.execution.sink_view import ObservableSink, SinkSnapshot
from sstore.observe.rates import RateMeter

if TYPE_CHECKING:
    from sstore.engine_view import EngineView

LOCK_TIMEOUT = 0.25  # seconds a reader waits for the engine's lock before using its last view
KEEP_TIMES = 100_000  # commit times kept per stream a sink reads (older ones: looked up)
TE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
              30.0, 60.0)


def iso(wall: float | None) -> str | None:
    """Epoch seconds as an ISO time in UTC (None stays None)."""
    if wall is None:
        return None
    return datetime.datetime.fromtimestamp(wall, datetime.UTC).isoformat()


@dataclass
class Counters:
    """What this process committed for one procedure (or ingested into one border stream)."""

    batches: int = 0
    rows_in: int = 0
    rows_out: int = 0
    seconds: float = 0.0  # transaction time, summed
    last_batch: int = 0
    last_commit: float | None = None  # epoch seconds


class CommitTimes:
    """When recent batches of the streams that sinks read committed (epoch seconds), for the
    lag in seconds. Batches of a stream commit in increasing batch-id order, so each stream
    keeps two parallel ascending lists; the oldest half goes when ``keep`` is exceeded."""

    def __init__(self, keep: int = KEEP_TIMES) -> None:
        self.keep = keep
        self._ids: dict[str, list[int]] = {}
        self._times: dict[str, list[float]] = {}

    def track(self, stream: str) -> None:
        self._ids.setdefault(stream, [])
        self._times.setdefault(stream, [])

    def record(self, stream: str, batch_id: int, wall: float) -> None:
        ids = self._ids.get(stream)
        if ids is None:
            return
        times = self._times[stream]
        ids.append(batch_id)
        times.append(wall)
        if len(ids) > self.keep:
            del ids[:self.keep // 2], times[:self.keep // 2]

    def at(self, stream: str, batch_id: int) -> float | None:
        ids = self._ids.get(stream, [])
        i = bisect.bisect_left(ids, batch_id)
        return self._times[stream][i] if i < len(ids) and ids[i] == batch_id else None

    def forget_through(self, stream: str, batch_id: int) -> None:
        ids = self._ids.get(stream)
        if ids:
            cut = bisect.bisect_right(ids, batch_id)
            del ids[:cut], self._times[stream][:cut]


@dataclass
class ProcedureLive:
    name: str
    last_batch: int
    pending: int
    halted: str | None
    batches_committed: int  # by this process
    rows_in: int
    rows_out: int
    batches_per_s: float
    rows_per_s: float  # input rows
    te_ms_avg: float | None  # over the rate window
    last_commit_at: str | None


@dataclass
class StreamLive:
    name: str
    kind: str  # "border", "derived", "window"
    last_batch: int
    retained_batches: int
    retained_rows: int | None  # None for windows (their rows are counted by status)
    holders: list[str]
    batches_ingested: int  # by this process, border streams
    rows_per_s: float  # ingested rows, border streams


@dataclass
class SinkLive:
    name: str
    stream: str
    target: str
    watermark: int
    lag_batches: int
    lag_seconds: float | None
    rows: int
    rows_per_s: float
    retries: int
    last_error: str | None
    halted: str | None
    running: bool


@dataclass
class Live:
    """One snapshot. ``stale`` when the engine's lock was busy: ``ledger_at`` says how old the
    ledger-derived numbers are, ``note`` why."""

    taken_at: str
    uptime_seconds: float
    started: bool
    stale: bool
    ledger_at: str | None
    note: str | None
    procedures: list[ProcedureLive] = field(default_factory=list)
    streams: list[StreamLive] = field(default_factory=list)
    sinks: list[SinkLive] = field(default_factory=list)
    #: readers' lag against their bounds and ingests waiting on them
    #: (``sstore.execution.backpressure.PressureReport.to_dict``), read with the ledger
    backpressure: dict[str, Any] | None = None


@dataclass
class _SinkLag:
    watermark: int
    lag_batches: int
    oldest_pending: float | None  # epoch seconds its oldest undelivered batch committed


@dataclass
class _LedgerView:
    """What was read under the engine's lock (kept for readers that find it busy)."""

    at: float
    procedures: dict[str, tuple[int, int, str | None]]  # last batch, pending, halted
    streams: dict[str, tuple[str, int, int, int | None, list[str]]]
    sinks: dict[str, _SinkLag]
    pressure: dict[str, Any] | None = None


class EngineMetrics:
    """Counters, a TE latency histogram and live snapshots of one engine (see the module
    docstring), read through the engine's read-only view (``Engine.view()``). Created by
    ``sstore.observe.metrics_of(engine)``; one ``CollectorRegistry`` per engine, so several
    engines in one process never mix their numbers."""

    def __init__(self, view: EngineView, lock_timeout: float = LOCK_TIMEOUT) -> None:
        from sstore.observe.prometheus import EngineCollector

        self.engine: EngineView = view  # the engine is reached only through its view
        self.lock_timeout = lock_timeout
        self.registry = CollectorRegistry(auto_describe=False)
        self.te_seconds = Histogram("sstore_procedure_te_seconds",
                                    "Transaction execution time, BEGIN to COMMIT",
                                    ["procedure"], registry=self.registry, buckets=TE_BUCKETS)
        self.counters: dict[str, Counters] = {}
        self.times = CommitTimes()
        self.rates = RateMeter(time.monotonic())
        self.started_wall = time.time()
        self._wall_offset = time.time() - time.perf_counter()
        self._mutex = threading.Lock()
        self._histograms: dict[str, object] = {}
        self._outputs: dict[str, tuple[str, ...]] = {}
        self._view: _LedgerView | None = None
        self.registry.register(EngineCollector(self))
        with view.lock:  # no sink registered between the two
            for sink in view.sinks():
                self.track_sink(sink)
            view.on_sink(self.track_sink)
        view.observe(self.on_commit)

    # ------------------------------------------------------------------ commit path
    def track_sink(self, sink: ObservableSink) -> None:
        """Keep commit times of the stream ``sink`` reads (for its lag in seconds)."""
        snap = sink.metrics_snapshot()
        with self._mutex:
            self.times.track(snap.stream)

    def on_commit(self, event: CommitEvent) -> None:
        """The observer: runs under the engine's lock after every commit; no SQL."""
        wall = event.at + self._wall_offset
        with self._mutex:
            counters = self.counters.get(event.node)
            if counters is None:
                counters = self.counters[event.node] = Counters()
            counters.batches += 1
            counters.rows_in += event.rows_in
            counters.rows_out += event.rows
            counters.seconds += event.seconds
            counters.last_batch = event.batch_id
            counters.last_commit = wall
            if event.kind == "ingest":
                self.times.record(event.node, event.batch_id, wall)
            else:
                for stream in self._outputs_of(event.node):
                    self.times.record(stream, event.batch_id, wall)
        if event.kind == "te":
            child = self._histograms.get(event.node)
            if child is None:
                child = self._histograms[event.node] = self.te_seconds.labels(event.node)
            # a grouped TE's latency includes the COMMIT it waited for
            child.observe(event.seconds + event.commit_seconds)  # type: ignore[attr-defined]

    def _outputs_of(self, procedure: str) -> tuple[str, ...]:
        outputs = self._outputs.get(procedure)
        if outputs is None:
            decl = self.engine.graph.procedures.get(procedure)
            outputs = self._outputs[procedure] = decl.outputs if decl is not None else ()
        return outputs

    # ------------------------------------------------------------------ read path
    def snapshot(self) -> Live:
        """The live numbers now (see the module docstring for what may be stale)."""
        now_wall, now = time.time(), time.monotonic()
        rt = self.engine.runtime
        live = Live(iso(now_wall) or "", round(now_wall - self.started_wall, 3),
                    rt is not None, False, None, None)
        if rt is None:
            live.note = "the engine has not started yet (its program is still declaring)"
            return live
        view = self._read_ledger(rt)
        if view is None:
            view = self._view
            live.stale = True
            live.note = (f"the engine's lock was busy for more than {self.lock_timeout:g} s "
                         f"(a long transaction): pending batches, retained rows, holders and "
                         f"sink lags are as of the last read")
        live.ledger_at = iso(view.at) if view is not None else None
        with self._mutex:
            counters = {name: Counters(**vars(c)) for name, c in self.counters.items()}
        self._procedures(live, rt, view, counters, now)
        self._streams(live, rt, view, counters, now)
        self._sinks(live, view, now, now_wall)
        live.backpressure = view.pressure if view is not None else None
        return live

    def _read_ledger(self, rt: Runtime) -> _LedgerView | None:
        """Ledger numbers under the engine's lock, or None if it stayed busy."""
        if not rt.lock.acquire(timeout=self.lock_timeout):
            return None
        try:
            view = _LedgerView(time.time(), {}, {}, {})
            ledger, graph = rt.ledger, rt.graph
            for name in rt.scheduler.order:
                done = ledger.progress.get(name, 0)
                waiting: set[int] = set()
                for node in graph.procedures[name].inputs:
                    ids = _ids(rt, node)
                    waiting.update(ids[bisect.bisect_right(ids, done):])
                view.procedures[name] = (done, len(waiting), rt.scheduler.halted.get(name))
            for name in list(graph.streams) + list(graph.windows):
                nb = ledger.batches.get(name)
                kind = ("window" if name in graph.windows
                        else "border" if graph.is_border(name) else "derived")
                rows = None if kind == "window" else sum(nb.numbers) if nb is not None else 0
                holders = graph.consumers_of(name) + sorted(ledger.holders.get(name, ()))
                view.streams[name] = (kind, ledger.frontier(name),
                                      len(nb.ids) if nb is not None else 0, rows, holders)
            delivered: dict[str, int] = {}  # stream -> lowest watermark of its sinks
            for sink in self.engine.sinks():
                snap = sink.metrics_snapshot()
                view.sinks[snap.name] = lag = self._lag(rt, snap)
                delivered[snap.stream] = min(delivered.get(snap.stream, lag.watermark),
                                             lag.watermark)
            with self._mutex:  # every sink of the stream has these: their times can go
                for stream, mark in delivered.items():
                    self.times.forget_through(stream, mark)
            view.pressure = self.engine.pressure(rt).to_dict()
        finally:
            rt.lock.release()
        self._view = view
        return view

    def _lag(self, rt: Runtime, snap: SinkSnapshot) -> _SinkLag:
        """How far a sink is behind its stream (caller holds the engine's lock)."""
        mark = snap.watermark if snap.watermark is not None else \
            rt.ledger.progress.get(snap.name, 0)
        ids = _ids(rt, snap.stream)
        first = bisect.bisect_right(ids, mark)
        with self._mutex:
            oldest = self.times.at(snap.stream, ids[first]) if first < len(ids) else None
        if first < len(ids) and oldest is None:
            oldest = _committed_at(rt, snap.stream, ids[first])
        return _SinkLag(mark, len(ids) - first, oldest)

    def _procedures(self, live: Live, rt: Runtime, view: _LedgerView | None,
                    counters: dict[str, Counters], now: float) -> None:
        for name in rt.scheduler.order:
            c = counters.get(name, Counters())
            last, pending, halted = view.procedures.get(name, (c.last_batch, 0, None)) \
                if view is not None else (c.last_batch, 0, None)
            batches_per_s = self.rates.rate(f"p:{name}:batches", c.batches, now)
            busy_per_s = self.rates.rate(f"p:{name}:seconds", c.seconds, now)
            live.procedures.append(ProcedureLive(
                name, max(last, c.last_batch), pending, halted, c.batches, c.rows_in,
                c.rows_out, round(batches_per_s, 3),
                round(self.rates.rate(f"p:{name}:rows", c.rows_in, now), 3),
                round(busy_per_s / batches_per_s * 1000, 3) if batches_per_s else None,
                iso(c.last_commit)))

    def _streams(self, live: Live, rt: Runtime, view: _LedgerView | None,
                 counters: dict[str, Counters], now: float) -> None:
        for name in list(rt.graph.streams) + list(rt.graph.windows):
            c = counters.get(name, Counters())
            kind, last, batches, rows, holders = view.streams.get(
                name, ("", 0, 0, None, [])) if view is not None else ("", 0, 0, None, [])
            live.streams.append(StreamLive(
                name, kind or ("window" if name in rt.graph.windows else "stream"), last,
                batches, rows, holders, c.batches,
                round(self.rates.rate(f"s:{name}:rows", c.rows_out, now), 3)))

    def _sinks(self, live: Live, view: _LedgerView | None, now: float,
               now_wall: float) -> None:
        for sink in self.engine.sinks():
            snap = sink.metrics_snapshot()
            lag = view.sinks.get(snap.name) if view is not None else None
            if lag is None:
                lag = _SinkLag(snap.watermark or 0, 0, None)
            lag_seconds = round(max(0.0, now_wall - lag.oldest_pending), 3) \
                if lag.oldest_pending is not None else (0.0 if lag.lag_batches == 0 else None)
            rows_per_s = self.rates.rate(f"k:{snap.name}:rows", snap.rows, now,
                                         from_zero=False)  # the sink may predate the metrics
            live.sinks.append(SinkLive(
                snap.name, snap.stream, snap.target, lag.watermark, lag.lag_batches,
                lag_seconds, snap.rows, round(rows_per_s, 3), snap.retries, snap.last_error,
                snap.halted, snap.running))


def _ids(rt: Runtime, node: str) -> list[int]:
    nb = rt.ledger.batches.get(node)
    return nb.ids if nb is not None else []


def _committed_at(rt: Runtime, node: str, batch_id: int) -> float | None:
    """The commit time of a batch memory does not know (caller holds the engine's lock; the
    engine added ``committed_at`` when it opened the file)."""
    rows = rt.con.execute("SELECT epoch(committed_at) FROM sstore_sys.commits "
                          "WHERE node = ? AND batch_id = ?", [node, batch_id]).fetchall()
    return float(rows[0][0]) if rows and rows[0][0] is not None else None
