"""The one runner of sinks into PostgreSQL: it drives one sink or a group of them.

A sink (``StreamToPostgres``, ``migrators.engine_to_postgres``) says WHAT to write: it plans
chunks after its watermark, reads and converts their rows, delivers a chunk through the one
delivery protocol (``migrators.delivery``) and keeps its bookkeeping (where the target
stands, acknowledgements, counts, its halt). It starts no thread. This module says WHEN, and
in which thread, for every kind of use, so that all of them wait, retry, halt and flush by
the same rules:

- ``run_once``: everything committed, now, in the caller's thread (``sstore migrate``);
- ``run_pending``: what committed since the last delivery, in the caller's thread;
- ``attach()``: as batches commit, in one thread of the runner's own (woken by a
  subscription to each sink's stream, which also hands over the batch's rows), never under
  the engine's lock; ``attach(background=False)``: in the committing thread;
- ``flush``: wait until every batch committed so far is delivered; ``detach``: stop feeding.

In its thread, transient failures (PostgreSQL away, a terminated backend) are retried for as
long as it runs (``last_error`` shows the latest); a terminal one (a schema mismatch, a gap, a
target claimed by another state file) halts that sink (``StreamToPostgres.halt``: recorded
in the engine, ``status`` shows it, ``flush`` raises it) and the others go on.

A backlog (more than one chunk pending) is moved sink by sink, each with a read-ahead
(``migrators.read_ahead``: the next chunk read and encoded in a helper thread while the
current one is in PostgreSQL); a chunk the target turns out to lack batches for
(``TargetBehind``, a target dropped or emptied by hand) sends the sink back to ``start``.

A runner of several sinks (``SinkGroup``: sinks of one engine into one PostgreSQL database)
delivers them in ONE PostgreSQL transaction when no sink has more than one chunk pending
(the steady state of a running pipeline), so that the rows a batch produced reach all their
tables together, with one COMMIT instead of one per sink:

1. BEGIN with the first sink's watermark UPDATE (``delivery.write_planned``), then its rows.
2. Each further sink: its watermark UPDATE, then its rows, in the same transaction.
3. Each sink's ``before_commit`` hook (tests), then COMMIT: every sink's rows and watermark
   become visible together, or none does.
4. Each sink's bookkeeping (``StreamToPostgres.delivered``): it continues after its chunk,
   acknowledges it to the engine, calls its ``on_delivered``.

Each sink keeps its own watermark row, so exactly-once is the one delivery protocol's: a crash
before step 3 leaves nothing, after it each watermark says what its table has. Anything
unusual in a round (a watermark not where a sink's plan continues, a target dropped or
changed, an error that is not transient) rolls the whole round back, and the sinks then
deliver one by one, each exactly as a runner of one does (its full path, its errors, its
halt): the round only speeds up the common case and never decides anything a sink alone
would not.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg
import pyarrow as pa

from migrators import delivery
from migrators.errors import MigrationError, TargetBehind
from migrators.postgres import RetryPolicy, Session
from migrators.read_ahead import Chunk, ReadAhead
from sstore.base.errors import DeclarationError
from sstore.base.retry import Kind, call, first_line, kind_of
from sstore.execution import interrupts
from sstore.storage.subscriptions import Subscription

if TYPE_CHECKING:
    from migrators.engine_to_postgres import StreamToPostgres

log = logging.getLogger("sstore.migrators")

Progress = Callable[[int, int], None]


@dataclass
class MigrationReport:
    """What a run moved: chunks, batches and rows, in how long, with how many retries, up to
    which batch (``watermark``), and each chunk's time."""

    chunks: int = 0
    batches: int = 0
    rows: int = 0
    seconds: float = 0.0
    retries: int = 0
    watermark: int = 0
    chunk_seconds: list[float] = field(default_factory=list)

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


class _NotCommonCase(Exception):
    """A sink's watermark is not where its plan continues: the round is rolled back."""


def idle_seconds(sinks: Sequence[StreamToPostgres]) -> float | None:
    """How long the runner's thread sleeps when no batch commits: an acknowledgement held
    back is sent after ``ack_every`` (at least every 10 ms) even then; None: no live sink."""
    if not sinks:
        return None
    if any(s.acks_pending for s in sinks):
        return min(1.0, max(min(s.ack_every for s in sinks), 0.01))
    return 1.0


class SinkRunner:
    """Drives ``sinks`` (see the module docstring): one, or several of one engine into one
    PostgreSQL database. Attach and detach the runner, not its sinks; each sink keeps its
    own watermark, halt, metrics and ``flush``."""

    #: deliver in rounds (one transaction for every sink) even with a single sink: a
    #: ``SinkGroup`` does, so that a group of one takes the same path as a larger one; a
    #: runner of one sink (``StreamToPostgres.attach``) delivers on the sink's own path
    rounds_alone = False

    def __init__(self, sinks: Sequence[StreamToPostgres]) -> None:
        if not sinks:
            raise DeclarationError("a sink group needs at least one sink")
        if len({id(s.engine) for s in sinks}) != 1:
            raise DeclarationError("the sinks of a group must read the same engine")
        if len({s.url for s in sinks}) != 1:
            raise DeclarationError("the sinks of a group must write to one PostgreSQL "
                                   "database (the same URL): one transaction holds them all")
        if len({s.consumer for s in sinks}) != len(sinks):
            raise DeclarationError("a sink group holds each target table once")
        self.sinks = list(sinks)
        self.rounds = 0  # deliveries of several sinks in one transaction
        self.one_by_one = 0  # passes in which the sinks delivered one by one
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._ack_now = {id(s): threading.Event() for s in self.sinks}  # a flush waits
        self._thread: threading.Thread | None = None
        self._subscriptions: list[Subscription] = []
        self._session: Session | None = None

    @property
    def attached(self) -> bool:
        """Whether it feeds its sinks as batches commit (in its thread or the committer's)."""
        return bool(self._subscriptions) or self.threaded

    @property
    def threaded(self) -> bool:
        """Whether its own thread runs (an ingest waiting under backpressure can count on it)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def session(self) -> Session:
        """The connection a group's rounds use (each sink keeps its own for its own path)."""
        if self._session is None:
            self._session = Session(self.sinks[0].url, RetryPolicy(), stop=self._stopping)
        return self._session

    def live(self) -> list[StreamToPostgres]:
        """The sinks not halted."""
        return [s for s in self.sinks if s.halted is None]

    # ------------------------------------------------------------------ attach / detach
    def attach(self, background: bool = True) -> None:
        """Start every sink (a sink that cannot start raises here, and none is attached),
        then feed them as batches commit: from the runner's thread, or with
        ``background=False`` in the committing thread."""
        if self.attached:
            raise MigrationError("the sink runner is attached already")
        for sink in self.sinks:
            if sink.runner is not None:
                how = "on its own" if len(sink.runner.sinks) == 1 else "in another group"
                raise MigrationError(f"sink {sink.stream} -> {sink.table} is attached {how}: "
                                     f"detach it first (a runner feeds each sink alone)")
        self._stopping.clear()
        started: list[StreamToPostgres] = []
        try:
            for sink in self.sinks:
                sink.halted = None
                sink.cancel.clear()
                with sink.mutex:
                    sink.start()
                started.append(sink)
        except BaseException:
            for sink in started:
                with sink.mutex:
                    sink.release()
            raise
        for sink in self.sinks:
            sink.runner = self
        if not background:
            self._subscriptions = [
                sink.port.subscribe(lambda _b, _t: self.run_pending(ack=True, halt=False))
                for sink in self.sinks]
            return
        name = "sstore-sink-group" if len(self.sinks) > 1 else f"sstore-sink-{self.sinks[0].table}"
        self._thread = threading.Thread(target=self._loop, daemon=True, name=name)
        self._wake.set()  # move whatever is already committed
        self._thread.start()
        self._subscriptions = [sink.port.subscribe(self._committed_to(sink))
                               for sink in self.sinks]

    def _committed_to(self, sink: StreamToPostgres) -> Callable[[int, pa.Table], None]:
        def committed(batch_id: int, rows: pa.Table) -> None:
            sink.remember(batch_id, rows)  # its rows, for the thread to deliver
            self._wake.set()
        return committed

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every sink has every batch committed so far; False on timeout. A
        halted sink raises its error (``flush_sink``)."""
        deadline = time.monotonic() + timeout
        return all(self.flush_sink(sink, max(0.0, deadline - time.monotonic()))
                   for sink in self.sinks)

    def flush_sink(self, sink: StreamToPostgres, timeout: float = 30.0) -> bool:
        """Wait until ``sink`` has every batch committed so far and the engine was told;
        False on timeout. A halted sink raises its error (waiting would never end)."""
        deadline = time.monotonic() + timeout
        ack_now = self._ack_now[id(sink)]
        try:
            while time.monotonic() < deadline:
                if sink.halted is not None:
                    raise MigrationError(f"sink {sink.stream} -> {sink.table} is halted: "
                                         f"{sink.halted}")
                acked = sink.port.acknowledged()
                delivered = sink.after
                if not sink.port.batches(max(acked, delivered or 0)):
                    if delivered is None or acked >= delivered:
                        return True
                    if self._thread is None:  # no runner thread: acknowledge here
                        with sink.mutex:
                            sink.acknowledge(force=True)
                    else:
                        ack_now.set()  # the runner's thread acknowledges at once
                self._wake.set()
                time.sleep(0.01)
            return False
        finally:
            ack_now.clear()

    def detach(self, flush_seconds: float | None = None) -> None:
        """Stop feeding: deliver what has committed (for at most ``flush_seconds``: default
        10 s, 1 s when the process is stopping on a signal, so a stop stays quick), finish
        the chunk or round in flight, acknowledge, close the connections. What is not
        delivered by then stays held in the engine for the next run."""
        if self._thread is not None:
            if flush_seconds is None:
                flush_seconds = 1.0 if interrupts.PROCESS_STOP.is_set() else 10.0
            deadline = time.monotonic() + flush_seconds
            for sink in self.live():
                try:
                    self.flush_sink(sink, max(0.0, deadline - time.monotonic()))
                except MigrationError:
                    pass  # halted meanwhile: the halt is recorded
        for subscription in self._subscriptions:
            subscription.close()
        self._subscriptions = []
        if self._thread is not None:
            self._stopping.set()
            for sink in self.sinks:
                sink.cancel.set()
            self._wake.set()
            self._thread.join()
            self._thread = None
        for sink in self.sinks:
            if sink.runner is self:
                sink.runner = None
            with sink.mutex:
                sink.release()
        if self._session is not None:
            self._session.close()
            self._session = None

    # ------------------------------------------------------------------ delivering
    def _loop(self) -> None:
        """The runner's thread: wait until woken by a commit (or ``idle_seconds``), deliver
        what is pending, retry transient failures for as long as it runs (the first sink's
        ``retry`` delays, no limit); a terminal one halts the sink it belongs to."""
        retry = self.sinks[0].retry
        forever = RetryPolicy(attempts=None, first_delay=retry.first_delay,
                              max_delay=retry.max_delay)
        what = "sink group" if len(self.sinks) > 1 else \
            f"sink {self.sinks[0].stream} -> {self.sinks[0].table}"

        def retried(exc: BaseException, _attempt: int) -> None:
            for sink in self.live():
                sink.note_retry(exc)

        while not self._stopping.is_set():
            timeout = idle_seconds(self.live())
            if timeout is None:
                return  # every sink halted: nothing left to feed
            self._wake.wait(timeout=timeout)
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                call(self.run_pending, forever, what, on_retry=retried, stop=self._stopping)
                for sink in self.live():
                    sink.note_recovered()
            except Exception as exc:  # noqa: BLE001 - classified: terminal halts, else stopping
                if self._stopping.is_set() and kind_of(exc) is Kind.TRANSIENT:
                    break
                for sink in self.live():
                    sink.halt(exc)
                return

    def run_pending(self, ack: bool | None = None, halt: bool = True) -> int:
        """One pass in the caller's thread: what the sinks have pending, in one transaction
        when it is a group's common case, else sink by sink; returns the rows moved. A
        transient error is raised (the caller retries the pass).

        ``halt``: a sink's terminal error halts that sink only (the runner's own use);
        False: it is raised, and every sink is tried, halted or not (a caller running a
        sink itself). ``ack``: tell the engine at once (True), only once ``ack_every`` has
        passed (False), or at once only for a sink whose ``flush`` waits (None)."""
        report = MigrationReport()
        live = self.live() if halt else list(self.sinks)
        with contextlib.ExitStack() as held:
            for sink in live:
                held.enter_context(sink.mutex)
            for sink in list(live):
                if sink.after is None:
                    try:
                        sink.start()
                    except Exception as exc:
                        if not halt or kind_of(exc) is Kind.TRANSIENT:
                            raise
                        sink.halt(exc)
                        live.remove(sink)
            if not ((len(self.sinks) > 1 or self.rounds_alone)
                    and self._together(live, report)):
                self.one_by_one += 1
                for sink in live:
                    try:
                        self.move_pending(sink, report)
                    except Exception as exc:
                        if not halt or kind_of(exc) is Kind.TRANSIENT:
                            raise
                        sink.halt(exc)
            for sink in live:
                if sink.halted is None:
                    sink.acknowledge(force=self._ack_now[id(sink)].is_set()
                                     if ack is None else ack)
        return report.rows

    def run_once(self, progress: Progress | None = None) -> MigrationReport:
        """Move every committed batch not yet in PostgreSQL, sink by sink, chunk by chunk, in
        the caller's thread; then return. ``progress(rows_done, rows_total)`` after each
        chunk. Errors are raised (nothing is halted)."""
        report = MigrationReport()
        began = time.perf_counter()
        retries_before = sum(s.retry.retries_done for s in self.sinks)
        for sink in self.sinks:
            try:
                with sink.mutex:
                    report.watermark = sink.start()
                    self.move_pending(sink, report, progress)
            finally:
                sink.close()
        report.seconds = time.perf_counter() - began
        report.retries = sum(s.retry.retries_done for s in self.sinks) - retries_before
        return report

    def move_pending(self, sink: StreamToPostgres, report: MigrationReport,
                     progress: Progress | None = None) -> None:
        """Deliver ``sink``'s chunks until nothing is pending (it holds ``sink.mutex``); a
        target found behind the plan re-plans once (twice in a row means something keeps
        removing the target's rows: a terminal error)."""
        for attempt in (1, 2):
            chunks = sink.plan()
            total = sum(c.rows for c in chunks)
            try:
                self._move_chunks(sink, chunks, report, progress, total)
                return
            except TargetBehind as behind:
                if attempt == 2:
                    raise
                log.warning("%s; planning again from batch %d", behind,
                            behind.watermark.batch_id)
                report.watermark = sink.start()

    @staticmethod
    def _move_chunks(sink: StreamToPostgres, chunks: list[Chunk], report: MigrationReport,
                     progress: Progress | None, total: int) -> None:
        """The plan's chunks, read (and converted) ahead in a helper thread, unless this
        thread holds the engine's lock: a helper reading would wait for it forever (a sink
        fed in the committing thread, ``attach(background=False)``)."""
        after = sink.after
        assert after is not None
        ahead = ReadAhead(chunks, after, sink.read, sink.side.convert,
                          threaded=not sink.engine.holds_lock(),
                          name=f"sstore-sink-read-{sink.table}")
        try:
            for chunk, rows, converted in ahead:
                t0 = time.perf_counter()
                moved = sink.move_chunk(chunk, rows, converted, sent=ahead.kick)
                report.chunk_seconds.append(time.perf_counter() - t0)
                report.chunks += 1
                report.rows += moved
                report.batches += chunk.batches
                report.watermark = chunk.last
                if progress is not None:
                    progress(report.rows, total)
        finally:
            ahead.close()

    def _together(self, live: list[StreamToPostgres], report: MigrationReport) -> bool:
        """Steps 1-4 of the module docstring. True: done (or nothing was pending); False:
        nothing changed, the sinks must deliver one by one."""
        plans: list[tuple[StreamToPostgres, Chunk]] = []
        for sink in live:
            chunks = sink.plan()  # first: it may start the sink again (``plan``)
            after = sink.after
            assert after is not None
            if len(chunks) > 1:
                return False  # a backlog: each sink moves it with its own read-ahead
            if chunks:
                if not delivery.planned(sink.sink_key, after, chunks[0].last):
                    return False
                plans.append((sink, chunks[0]))
        if not plans:
            return True
        try:
            items = []
            for sink, chunk in plans:
                rows = sink.read([chunk])
                after = sink.after
                assert after is not None
                items.append((sink, chunk, rows, sink.side.rows_for_target(rows, after)))
            outcomes = self.session.run(lambda con: _write_round(con, items),
                                        "deliver a round of the sink group")
        except _NotCommonCase:
            return False
        except Exception as exc:  # a sink's rows that do not convert, a failed statement
            if kind_of(exc) is Kind.TRANSIENT:
                raise
            log.info("sink group round not delivered (%s); the sinks deliver one by one, "
                     "each with its own errors", first_line(exc))
            return False
        committed_at = time.perf_counter()
        for (sink, chunk, rows, _data), done in zip(items, outcomes):
            sink.delivered(chunk, rows, done, committed_at)
            report.rows += done.rows
        self.rounds += 1
        return True


class SinkGroup(SinkRunner):
    """The runner of several sinks delivered in one transaction (the name the pipelines and
    the docs use); a group of one delivers in rounds too (``rounds_alone``)."""

    rounds_alone = True


def _write_round(con: psycopg.Connection,
                 items: list[tuple[StreamToPostgres, Chunk, pa.Table, pa.Table]]
                 ) -> list[delivery.Delivery]:
    """Steps 1-3 in one transaction; ``_NotCommonCase`` (the round rolled back by
    ``own_begin``) when a sink's watermark is not where its plan continues."""
    outcomes: list[delivery.Delivery] = []
    with delivery.own_begin(con):
        for i, (sink, chunk, _rows, data) in enumerate(items):
            after = sink.after
            assert after is not None

            def write(cur: psycopg.Cursor, _watermark: int, sink: StreamToPostgres = sink,
                      data: pa.Table = data) -> int:
                return sink.side.write(cur, data)

            done = delivery.write_planned(con, sink.sink_key, after, chunk.last, write,
                                          data.num_rows, sink.drained_target, begin=i == 0)
            if done is None:
                raise _NotCommonCase(f"{sink.sink_key}: not at batch {after}")
            outcomes.append(done)
        for sink, *_ in items:
            if sink.before_commit is not None:
                sink.before_commit(con)
        con.commit()
    return outcomes
