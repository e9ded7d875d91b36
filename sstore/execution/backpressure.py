"""Backpressure: a slow reader makes ``ingest`` wait or refuse, never the state grow unbounded.

Every reader of a stream keeps the stream's batches in DuckDB until it has taken them: a
procedure until it has committed them, an external consumer (a sink into PostgreSQL, a
migration) until its target acknowledged them (``sstore.storage.consumers``). A warehouse that is
slow or locked would therefore make the state grow for as long as input keeps coming. Here each
reader has a **bound** (``Bound``: batches and bytes retained for it; an engine-wide default,
overridable per reader) and ``Engine.ingest`` checks it, under the engine's lock, before it
begins its transaction:

- **What counts** for a reader of node ``n`` (a stream, or a procedure's inputs): its *lag*,
  the batches of ``n`` still stored above what the reader took (its acknowledgement or its
  last committed batch), plus the batches on their way to ``n`` (stored in a stream upstream
  of ``n`` above the batch through which ``n`` is complete: they will reach ``n``). Rows are
  exact (the ledger's per-batch counts); bytes are an estimate, the lagging rows times the
  Arrow bytes per row of ``n``'s newest batch. Batches on their way count as batches only.
- **Only readers downstream of the ingested stream count**: a border stream's ingest never
  waits for a reader of another border stream's dataflow.
- **Over the bound** (lag batches >= bound, or lag bytes >= bound): the ingest *waits* if the
  reader can make progress without the calling thread, else it is *refused at once*:

  * A procedure can progress if another thread runs the engine (``Engine.run`` or
    ``run_until_idle``) and it is not halted.
  * A sink can progress if it moves batches on a thread of its own (``SinkSnapshot.
    background``: ``StreamToPostgres.attach()``), or in the runner's thread (attached with
    ``background=False`` on a derived stream while another thread runs the engine), and is
    not halted.
  * A pull subscription (``Engine.subscribe`` without a callback; its batches wait in memory
    for ``poll``, its lag is what waits) can if its latest ``poll`` came from another thread
    that is still alive.
  * Any other declared consumer (``Engine.consumer``/``hold`` with nobody running it, a
    halted sink or procedure, a single-threaded program that ingests without running) cannot:
    waiting would hang until the timeout for nothing. ``ConsumerStalledError`` (terminal)
    says which reader, its lag and bound, and what to do.

  The wait is ``Runtime.wakeup.wait`` on the engine's lock, which *releases* the lock while
  it waits, so the runner and the sink (which need it to commit and to acknowledge) go on;
  every commit and acknowledgement wakes it, and it re-checks at least every ``POLL``
  seconds. Past ``timeout`` it raises ``IngestTimeoutError`` (transient: the reader is
  running, only slow; send the batch again later). Either way the batch was not ingested:
  nothing was written (the check is before BEGIN), so the caller retries the same call. A
  stop (Ctrl-C, SIGTERM, ``Engine.interrupt``) ends a wait with ``Stopped``, and closing the
  engine with ``SStoreError``, the batch not ingested either.
- A re-sent batch-id that was already ingested is a no-op and never waits.
- Weak-durability replay (``recovery.replay``) does not pass here: it re-applies batches that
  were admitted before the crash.

Bounds live in the program (like the dataflow), not in the state file.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from sstore.base.errors import (
    ConsumerStalledError,
    DeclarationError,
    IngestTimeoutError,
    SStoreError,
)
from sstore.execution.interrupts import Stopped
from sstore.execution.lag import Lag, Lags, is_over

if TYPE_CHECKING:
    from sstore.execution.runtime import Runtime
    from sstore.execution.sink_view import ObservableSink
    from sstore.storage.subscriptions import Subscription

DEFAULT_MAX_BATCHES = 10_000
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB (Arrow size estimate)
DEFAULT_TIMEOUT = 60.0  # seconds an ingest waits for a running reader before giving up
POLL = 0.1  # seconds between re-checks of a waiting ingest when nothing wakes it


def _limit(value: int | None, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DeclarationError(f"backpressure bound: {what} must be a positive integer or "
                               f"None (no bound), not {value!r}")
    return value


@dataclass(frozen=True)
class Bound:
    """How much one reader may leave retained before ingest waits or refuses: ``batches``
    and ``bytes`` (an estimate, see the module docstring); None on one of them: no bound on
    it. The default is 10,000 batches and 1 GiB."""

    batches: int | None = DEFAULT_MAX_BATCHES
    bytes: int | None = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        _limit(self.batches, "batches")
        _limit(self.bytes, "bytes")


@dataclass
class Pressure:
    """One reader now: how far behind it is, its bound, whether ingest waits for it."""

    consumer: str
    kind: str  # "procedure", "sink", "consumer" or "subscription"
    streams: list[str]
    lag_batches: int
    lag_rows: int
    lag_bytes: int
    bound_batches: int | None
    bound_bytes: int | None
    over: bool  # at or past its bound: an ingest upstream waits or is refused
    running: bool  # can make progress without the ingesting thread
    halted: str | None
    waiting_ingests: int  # ingests waiting for it now
    blocked_seconds: float  # ingest time spent waiting for it (this process)
    refused: int  # ingests refused because of it (timeouts and stalls)


@dataclass
class PressureReport:
    """The engine's backpressure now (``Engine.status().backpressure``, ``/status``,
    ``/metrics``)."""

    blocked: bool  # an ingest is waiting now
    waiting_ingests: int
    blocked_seconds: float  # total time ingests spent waiting (this process; waits going on
    # included)
    blocked_ingests: int  # ingests that had to wait (this process)
    timeouts: int  # IngestTimeoutError raised
    stalls: int  # ConsumerStalledError raised
    timeout: float
    default_batches: int | None
    default_bytes: int | None
    consumers: list[Pressure] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Backpressure:
    """The bounds of one engine's readers and the ingests waiting on them (see the module
    docstring). ``Engine.backpressure``; ``sinks`` lists the engine's registered sinks."""

    def __init__(self, default: Bound | None = None, timeout: float = DEFAULT_TIMEOUT,
                 sinks: Callable[[], Sequence[ObservableSink]] = list) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise DeclarationError(f"ingest_timeout must be a number of seconds >= 0, not "
                                   f"{timeout!r}")
        self.default = default if default is not None else Bound()
        self.timeout = float(timeout)
        self._sinks = sinks
        self._bounds: dict[str, Bound] = {}
        self._runners: Counter[int] = Counter()  # thread id -> nesting of run/run_until_idle
        self._mutex = threading.Lock()
        self._waiting: Counter[str] = Counter()  # reader -> ingests waiting for it
        self._wait_started: dict[int, float] = {}  # waiting thread -> monotonic start
        self._blocked: dict[str, float] = {}  # reader -> seconds ingests waited for it
        self._refused: Counter[str] = Counter()
        self._blocked_total = 0.0
        self._blocked_ingests = 0
        self._timeouts = 0
        self._stalls = 0
        #: what each reader leaves retained, and its caches (``sstore.execution.lag``)
        self.lags = Lags()

    # ------------------------------------------------------------------ configuration
    def bound(self, consumer: str, bound: Bound) -> None:
        """Give ``consumer`` (a procedure, or an external consumer's name such as
        ``migrator:SCHEMA.TABLE``) its own bound instead of the engine-wide default."""
        if not isinstance(bound, Bound):
            raise DeclarationError(f"bound must be a sstore.Bound, not {bound!r}")
        with self._mutex:
            self._bounds[consumer] = bound

    def bound_of(self, consumer: str) -> Bound:
        with self._mutex:
            return self._bounds.get(consumer, self.default)

    @contextmanager
    def running(self) -> Iterator[None]:
        """Marks the calling thread as a runner of the engine's procedures while inside
        (``Engine.run``, ``run_until_idle``): ingests of other threads may then wait for them."""
        me = threading.get_ident()
        with self._mutex:
            self._runners[me] += 1
        try:
            yield
        finally:
            with self._mutex:
                self._runners[me] -= 1
                if not self._runners[me]:
                    del self._runners[me]

    def _other_runner(self) -> bool:
        me = threading.get_ident()
        with self._mutex:
            return any(t != me for t in self._runners)

    # ------------------------------------------------------------------ the check
    def admit(self, rt: Runtime, stream: str, batch_id: int | None) -> None:
        """Return when ``stream`` may take one more batch; raise ``ConsumerStalledError`` or
        ``IngestTimeoutError`` (nothing ingested) otherwise. Caller holds ``rt.lock``; the
        wait releases it (see the module docstring)."""
        if rt.replaying:
            return
        if batch_id is not None and rt.ledger.was_ingested(stream, batch_id):
            return  # a re-send: a no-op, it adds nothing
        began: float | None = None
        blamed: list[str] = []
        me = threading.get_ident()
        try:
            while True:
                over = self._over(rt, stream)
                if not over:
                    return
                stalled = [p for p in over if not p.running]
                if stalled:
                    waited = time.monotonic() - began if began is not None else 0.0
                    with self._mutex:
                        self._stalls += 1
                        for p in stalled:
                            self._refused[p.consumer] += 1
                    raise ConsumerStalledError(stream, stalled, waited)
                now = time.monotonic()
                if began is None:
                    began = now
                    blamed = [p.consumer for p in over]
                    with self._mutex:
                        self._blocked_ingests += 1
                        self._wait_started[me] = now
                        for name in blamed:
                            self._waiting[name] += 1
                if rt.interrupts.closed:
                    raise SStoreError(f"the engine was closed while an ingest into {stream!r} "
                                      f"waited under backpressure; the batch was not ingested")
                if rt.interrupts.stopping():  # Ctrl-C, SIGTERM, Engine.interrupt: stop waiting
                    raise Stopped(f"stopped while an ingest into {stream!r} waited under "
                                  f"backpressure; the batch was not ingested")
                remaining = began + self.timeout - now
                if remaining <= 0:
                    with self._mutex:
                        self._timeouts += 1
                        for p in over:
                            self._refused[p.consumer] += 1
                    raise IngestTimeoutError(stream, over, now - began)
                step = time.monotonic()
                rt.wakeup.wait(min(remaining, POLL))  # releases the engine's lock meanwhile
                spent = time.monotonic() - step
                with self._mutex:
                    for p in over:
                        self._blocked[p.consumer] = self._blocked.get(p.consumer, 0.0) + spent
        finally:
            if began is not None:
                with self._mutex:
                    self._blocked_total += time.monotonic() - began
                    self._wait_started.pop(me, None)
                    for name in blamed:
                        self._waiting[name] -= 1
                        if not self._waiting[name]:
                            del self._waiting[name]

    def _over(self, rt: Runtime, stream: str) -> list[Pressure]:
        """The readers downstream of ``stream`` at or past their bound (lock held)."""
        reach = self.lags.reach(rt, stream)
        out = []
        for name, kind, nodes in self._readers(rt):
            if not reach.intersection(nodes):
                continue
            bound = self.bound_of(name)
            lag = self._lag_of(rt, name, kind, nodes, bound)
            if is_over(lag, bound):  # counted in full for the error and the report
                out.append(self._pressure(rt, name, kind, nodes,
                                          self._lag_of(rt, name, kind, nodes, None), bound))
        return out

    def _lag_of(self, rt: Runtime, name: str, kind: str, nodes: Sequence[str],
                bound: Bound | None) -> Lag:
        if kind == "subscription":  # what waits in memory for its poll
            sub = self._subscription(rt, name)
            return Lag(*sub.queued()) if sub is not None else Lag(0, 0, 0)
        return self.lags.lag(rt, name, nodes, bound)

    @staticmethod
    def _subscription(rt: Runtime, name: str) -> Subscription | None:
        return next((s for s in rt.subscribers.pulls() if s.name == name), None)


    def _readers(self, rt: Runtime) -> list[tuple[str, str, list[str]]]:
        """(name, kind, nodes it reads) of every procedure and every external consumer."""
        out: list[tuple[str, str, list[str]]] = [
            (p, "procedure", list(rt.graph.procedures[p].inputs)) for p in rt.scheduler.order]
        sinks = {s.metrics_snapshot().name for s in self._sinks()}
        held: dict[str, list[str]] = {}
        for stream, holders in rt.ledger.holders.items():
            for holder in holders:
                held.setdefault(holder, []).append(stream)
        for holder in sorted(held):
            out.append((holder, "sink" if holder in sinks else "consumer", sorted(held[holder])))
        out.extend((s.name, "subscription", [s.stream]) for s in rt.subscribers.pulls())
        return out


    def _pressure(self, rt: Runtime, name: str, kind: str, nodes: list[str], lag: Lag,
                  bound: Bound) -> Pressure:
        halted, running = self._progressing(rt, name, kind, nodes)
        with self._mutex:
            return Pressure(name, kind, nodes, lag.batches, lag.rows, lag.bytes, bound.batches,
                            bound.bytes, is_over(lag, bound), running, halted,
                            self._waiting.get(name, 0), round(self._blocked.get(name, 0.0), 6),
                            self._refused.get(name, 0))

    def _progressing(self, rt: Runtime, name: str, kind: str, nodes: list[str]
                     ) -> tuple[str | None, bool]:
        """(why it is halted, whether it can progress without the calling thread)."""
        if kind == "subscription":  # polled from another thread that is still alive
            sub = self._subscription(rt, name)
            poller = sub.poller if sub is not None else None
            return None, poller is not None and poller.is_alive() and \
                poller is not threading.current_thread()
        if kind == "procedure":
            halted = rt.scheduler.halted.get(name)
            return halted, halted is None and self._other_runner()
        for sink in self._sinks():
            snap = sink.metrics_snapshot()
            if snap.name != name:
                continue
            if snap.halted is not None:
                return snap.halted, False
            if snap.background:
                return None, True
            derived = all(not rt.graph.is_border(n) for n in nodes)
            return None, snap.running and derived and self._other_runner()
        return None, False  # declared, but nothing in this process moves it

    # ------------------------------------------------------------------ reading
    def report_counts(self) -> dict[str, float]:
        """The ingest-side counters alone (no engine lock needed): ``blocked_ingests``,
        ``waiting_ingests``, ``blocked_seconds``, ``timeouts``, ``stalls``."""
        now = time.monotonic()
        with self._mutex:
            return {"blocked_ingests": self._blocked_ingests,
                    "waiting_ingests": len(self._wait_started),
                    "blocked_seconds": self._blocked_total + sum(
                        now - t for t in self._wait_started.values()),
                    "timeouts": self._timeouts, "stalls": self._stalls}

    def report(self, rt: Runtime) -> PressureReport:
        """Every reader's lag and bound and the waits so far (caller holds ``rt.lock``)."""
        pressures = []
        for name, kind, nodes in self._readers(rt):
            bound = self.bound_of(name)
            pressures.append(self._pressure(rt, name, kind, nodes,
                                            self._lag_of(rt, name, kind, nodes, None), bound))
        now = time.monotonic()
        with self._mutex:
            ongoing = sum(now - t for t in self._wait_started.values())
            return PressureReport(
                bool(self._wait_started), len(self._wait_started),
                round(self._blocked_total + ongoing, 6), self._blocked_ingests,
                self._timeouts, self._stalls, self.timeout, self.default.batches,
                self.default.bytes, pressures)


P = ParamSpec("P")
R = TypeVar("R")


def runner(method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """Decorates ``Engine.run`` and ``Engine.run_until_idle``: while the method runs, its
    thread counts as a runner (``Backpressure.running``), so that ingests of other threads
    wait for the procedures it runs instead of being refused."""
    def wrapper(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.backpressure.running():
            return method(self, *args, **kwargs)
    functools.update_wrapper(wrapper, method)  # not @wraps: its _Wrapped type hides P and R
    return wrapper
