"""Several sinks of one engine, delivered in ONE PostgreSQL transaction: the rows a batch
produced reach all their tables together.

A dataflow often ends in several sinks into one warehouse (TPC-DI's DimTrade changes, its
alert messages and its rejects). Attached one by one, each sink runs its own thread and its
own PostgreSQL transaction per delivery: a reader of the warehouse may see a batch's trades
before its rejects, and every batch costs one COMMIT (a WAL flush), one thread wake-up and the
Python work of a delivery per sink, which on a small machine competes with the engine for the
CPU (at 100-trade TPC-DI batches the three sinks took a seventh of the engine's time).

A ``SinkGroup`` runs its members (``StreamToPostgres`` sinks of one engine into one
PostgreSQL database) from one thread. When no member has more than one chunk pending (the
steady state of a running pipeline), a round delivers them all in one transaction:

1. BEGIN with the first member's watermark UPDATE (``delivery.write_planned``), then its rows.
2. Each further member: its watermark UPDATE, then its rows, in the same transaction.
3. Each member's ``before_commit`` hook (tests), then COMMIT: every member's rows and
   watermark become visible together, or none does.
4. Each member's bookkeeping (``StreamToPostgres._delivered``): it continues after its chunk,
   acknowledges it to the engine, calls its ``on_delivered``.

Each member keeps its own watermark row, so exactly-once is the one delivery protocol's
(``migrators.delivery``): a crash before step 3 leaves nothing, after it each watermark says
what its table has. Anything unusual in a round (a watermark not where a member's plan
continues, a target dropped or changed, an error that is not transient) rolls the whole round
back, and the members then deliver one by one, each exactly as a sink of its own does (its
full path, its errors, its halt): the group only speeds up the common case and never decides
anything its members would not. A backlog (more than one chunk pending, after downtime) is
also moved member by member, each with its own read-ahead.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence

import psycopg
import pyarrow as pa

from migrators import delivery
from migrators.engine_to_postgres import (
    Chunk,
    MigrationReport,
    StreamToPostgres,
)
from migrators.errors import MigrationError
from migrators.postgres import RetryPolicy, Session
from migrators.sink_loop import feed_until_stopped, idle_seconds
from sstore import interrupts
from sstore.errors import DeclarationError
from sstore.retry import Kind, first_line, kind_of

log = logging.getLogger("sstore.migrators")


class _NotCommonCase(Exception):
    """A member's watermark is not where its plan continues: the round is rolled back."""


class SinkGroup:
    """``sinks`` fed together (see the module docstring). Attach and detach the group, not
    its members; each member keeps its own watermark, halt, metrics and ``flush``."""

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
        self.rounds = 0  # deliveries of the members in one transaction
        self.one_by_one = 0  # passes in which the members delivered one by one
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._session: Session | None = None

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = Session(self.sinks[0].url, RetryPolicy(), stop=self._stopping)
        return self._session

    def _live(self) -> list[StreamToPostgres]:
        return [s for s in self.sinks if s.halted is None]

    # ------------------------------------------------------------------ attach / detach
    def attach(self) -> None:
        """Start every member (as ``StreamToPostgres.attach`` does: a member that cannot
        start raises here, and none is attached) and feed them from one thread."""
        if self._thread is not None:
            raise MigrationError("the sink group is attached already")
        for sink in self.sinks:
            if sink._thread is not None or sink._subscription is not None:
                raise MigrationError(f"sink {sink.stream} -> {sink.table} is attached on its "
                                     f"own: detach it first (a group feeds its members)")
        self._stopping.clear()
        started: list[StreamToPostgres] = []
        try:
            for sink in self.sinks:
                sink.halted = None
                sink._stopping.clear()
                with sink._mutex:
                    sink.start()
                started.append(sink)
        except BaseException:
            for sink in started:
                with sink._mutex:
                    sink.close()
                sink._after = None
            raise
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="sstore-sink-group")
        for sink in self.sinks:
            sink._wake = self._wake  # its subscription and its flush wake the group's thread
            sink._thread = self._thread
        self._wake.set()  # move whatever is already committed
        self._thread.start()
        for sink in self.sinks:
            sink._subscription = sink.engine.subscribe(sink.stream, sink._committed)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every member has every batch committed so far; False on timeout. A
        halted member raises its error (``StreamToPostgres.flush``)."""
        deadline = time.monotonic() + timeout
        return all(sink.flush(max(0.0, deadline - time.monotonic())) for sink in self.sinks)

    def detach(self, flush_seconds: float | None = None) -> None:
        """Stop feeding (``StreamToPostgres.detach``, for all members): deliver what has
        committed for at most ``flush_seconds``, finish the round in flight, close."""
        if self._thread is not None:
            if flush_seconds is None:
                flush_seconds = 1.0 if interrupts.PROCESS_STOP.is_set() else 10.0
            deadline = time.monotonic() + flush_seconds
            for sink in self._live():
                try:
                    sink.flush(timeout=max(0.0, deadline - time.monotonic()))
                except MigrationError:
                    pass  # halted meanwhile: the halt is recorded
        for sink in self.sinks:
            if sink._subscription is not None:
                sink._subscription.close()
                sink._subscription = None
        if self._thread is not None:
            self._stopping.set()
            for sink in self.sinks:
                sink._stopping.set()
            self._wake.set()
            self._thread.join()
            self._thread = None
        for sink in self.sinks:
            sink._thread = None
            sink._wake = threading.Event()
            with sink._mutex:
                sink.close()
            sink._after = None
        if self._session is not None:
            self._session.close()
            self._session = None

    # ------------------------------------------------------------------ delivering
    def _loop(self) -> None:
        def remember(exc: BaseException, _attempt: int) -> None:
            for sink in self._live():
                sink.last_error = f"{type(exc).__name__}: {first_line(exc)}"
                sink._loop_retries += 1

        def cleared() -> None:
            for sink in self._live():
                sink.last_error = None

        def halt_all(exc: BaseException) -> None:
            for sink in self._live():
                sink._halt(exc)

        feed_until_stopped(self._wake, self._stopping, self.sinks[0].retry, "sink group",
                           self.run_pending, lambda: idle_seconds(self._live()), remember,
                           cleared, halt_all)

    def run_pending(self) -> None:
        """One pass: what the live members have pending, in one transaction when it is the
        common case, else member by member. A member's terminal error halts that member
        only; a transient one is raised (the caller retries the pass)."""
        live = self._live()
        with contextlib.ExitStack() as held:
            for sink in live:
                held.enter_context(sink._mutex)
            for sink in list(live):
                if sink._after is None:
                    try:
                        sink.start()
                    except Exception as exc:
                        if kind_of(exc) is Kind.TRANSIENT:
                            raise
                        sink._halt(exc)
                        live.remove(sink)
            if not self._together(live):
                self.one_by_one += 1
                for sink in live:
                    try:
                        sink._move_pending(MigrationReport(), None)
                    except Exception as exc:
                        if kind_of(exc) is Kind.TRANSIENT:
                            raise
                        sink._halt(exc)
            for sink in live:
                if sink.halted is None:
                    sink._acknowledge(force=sink._ack_now.is_set())

    def _together(self, live: list[StreamToPostgres]) -> bool:
        """Steps 1-4 of the module docstring. True: done (or nothing was pending); False:
        nothing changed, the members must deliver one by one."""
        plans: list[tuple[StreamToPostgres, Chunk]] = []
        for sink in live:
            assert sink._after is not None
            chunks = sink._chunks(sink._after)
            if len(chunks) > 1:
                return False  # a backlog: each member moves it with its own read-ahead
            if chunks:
                if not delivery.planned(sink.sink_key, sink._after, chunks[0].last):
                    return False
                plans.append((sink, chunks[0]))
        if not plans:
            return True
        try:
            items = []
            for sink, chunk in plans:
                rows = sink._read_group([chunk])
                assert sink._after is not None
                items.append((sink, chunk, rows, sink._rows_for_target(rows, sink._after)))
            outcomes = self.session.run(lambda con: _write_round(con, items),
                                        "deliver a round of the sink group")
        except _NotCommonCase:
            return False
        except Exception as exc:  # a member's rows that do not convert, a failed statement
            if kind_of(exc) is Kind.TRANSIENT:
                raise
            log.info("sink group round not delivered (%s); the members deliver one by one, "
                     "each with its own errors", first_line(exc))
            return False
        committed_at = time.perf_counter()
        for (sink, chunk, rows, _data), done in zip(items, outcomes):
            sink._delivered(chunk, rows, done, committed_at)
        self.rounds += 1
        return True


def _write_round(con: psycopg.Connection,
                 items: list[tuple[StreamToPostgres, Chunk, pa.Table, pa.Table]]
                 ) -> list[delivery.Delivery]:
    """Steps 1-3 in one transaction; ``_NotCommonCase`` (the round rolled back by
    ``own_begin``) when a member's watermark is not where its plan continues."""
    outcomes: list[delivery.Delivery] = []
    with delivery.own_begin(con):
        for i, (sink, chunk, _rows, data) in enumerate(items):
            assert sink._after is not None

            def write(cur: psycopg.Cursor, _watermark: int, sink: StreamToPostgres = sink,
                      data: pa.Table = data) -> int:
                return sink._write(cur, data)

            done = delivery.write_planned(con, sink.sink_key, sink._after, chunk.last, write,
                                          data.num_rows, sink.drained_target, begin=i == 0)
            if done is None:
                raise _NotCommonCase(f"{sink.sink_key}: not at batch {sink._after}")
            outcomes.append(done)
        for sink, *_ in items:
            if sink.before_commit is not None:
                sink.before_commit(con)
        con.commit()
    return outcomes
