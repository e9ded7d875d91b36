"""Coalescing: the batches that wait while the engine is busy run as ONE engine batch.

A source that delivers small batches (100 trades at a time, a poll of a message queue) pays
the fixed cost of a batch for every one of them: DuckDB plans every statement on every
execution (2.0 re-binds even ``PREPARE``\\d statements), and a group commit has its COMMIT, its
commit records and its sink round. When batches arrive faster than the engine runs them, they
queue, and a naive loop runs them one by one and falls further behind. A ``Coalescer`` sits in
front of one border stream: producers ``offer`` batches as they arrive, and one thread of its
own ingests *whatever is pending* as one engine batch (``Engine.ingest_and_run``: the batch
and its transaction executions commit together), then takes what arrived meanwhile. Under
light load every offer is its own engine batch; under load the engine batches grow until the
engine keeps up, as Spark's micro-batches take every record that arrived since the last one.

**Only for a dataflow whose result does not depend on how its input is cut into batches**
(its procedures are set-oriented over rows, as the streaming TPC-DI DimTrade is: the same
warehouse at every batch size, ``tests/workloads/tpcdi/test_tpcdi_streaming.py``). The engine
cannot check
this; choosing a coalescer declares it. What changes: several offers share one batch-id and
one transaction (all of them or none), and procedures see them as one batch.

What a user can get wrong here, and what happens:

- **An offer is not durable when ``offer`` returns** (as a message is not consumed before its
  offset is committed): it is once ``on_batch`` reported it, or ``drain`` returned. After a
  crash, resume the source after ``last_ingested()`` (the batch-id ``batch_id_of`` gave the
  last engine batch that committed). Exactly-once is then the engine's: a batch-id it took is
  never taken twice.
- **Offers must share one schema** (names, order, types: the first offer's), since they are
  joined into one table: an offer with other columns is refused at once (``SchemaError``,
  nothing queued), whether or not it would have been coalesced.
- **A failed engine batch stops the coalescer, loudly.** The error (an out-of-order batch-id,
  rows that do not fit the stream) is kept; every later
  ``offer``, ``drain`` and ``close`` raises ``CoalescerFailed`` with it as the cause and the
  number of offers that did not get in. Nothing is dropped silently, nothing after a failed
  batch is ingested (that would reorder the stream).
- **A producer faster than the engine waits** in ``offer`` while ``max_pending`` offers are
  pending (backpressure), so memory stays bounded; the engine's own backpressure
  (``sstore.execution.backpressure``) acts on the coalesced batches as on any.
- **``close`` without ``drain``** still ingests what is pending before it returns, and so does
  **a program that ends without ``close``**: the thread is not a daemon; once the main thread
  has ended it ingests what is pending and stops. If that fails, or an engine batch failed
  earlier and no ``offer``, ``drain`` or ``close`` raised it before the program ended, offers
  are lost: it says so on stderr and ends the process with exit status 1, never 0. "Ended"
  means the main thread and every other non-daemon thread (a producer that outlives the main
  thread is still served).
- **``batch_id_of`` must give an int for every engine batch**, the source position of the
  batch's last row (positions grow along the rows). None (``pc.max`` of an offer with no
  rows) would let the engine number the batch itself, and ``last_ingested()`` would no
  longer be a source position: it stops the coalescer instead.
- **A source that resumes too early is never doubled** (one that commits its offset in
  ``on_batch`` and crashed after the engine's COMMIT, before its own). The engine's
  batches cover every source position up to its last batch-id, so until a batch goes in
  as new: an offer whose own batch-id is not above that one runs alone, and the engine
  takes it as a re-send (no-op) or refuses it, as one offer at a time; an offer that
  starts at or below it and ends above it is trimmed to its rows above it (found with
  ``batch_id_of`` on prefixes of the offer; logged). Rows are never taken twice.
- **What would wait forever raises ``RuntimeError`` instead**: ``drain``/``close`` from
  ``on_batch``, an ``offer`` that must wait while its thread holds the engine's lock
  (``engine.transaction()``), any call in a forked child (the thread is the parent's).
"""

from __future__ import annotations

import logging
import operator
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sstore.base.errors import SchemaError, TerminalError
from sstore.engine import Engine
from sstore.execution.runtime import Runtime
from sstore.storage import systables

log = logging.getLogger("sstore")

#: how often an idle coalescer looks whether the program's main thread has ended
EXIT_POLL = 0.2


class CoalescerFailed(TerminalError):
    """An engine batch of a coalescer failed; the coalescer takes no more offers."""

    def __init__(self, stream: str, error: BaseException, not_ingested: int) -> None:
        super().__init__(f"coalescer of stream {stream!r} stopped: {error}; {not_ingested} "
                         f"offered batch(es) were not ingested (resume the source after "
                         f"last_ingested())")
        self.error = error
        self.not_ingested = not_ingested


@dataclass(frozen=True)
class Coalesced:
    """One engine batch a coalescer ran: its batch-id, the offers in it (their ``token``\\s,
    in offer order), its rows, and when it committed (``time.perf_counter()``)."""

    batch_id: int
    tokens: tuple[Any, ...]
    rows: int
    seconds: float
    committed_at: float


class Coalescer:
    """Pending offers of one border stream, ingested and run together (module docstring)."""

    def __init__(self, engine: Engine, stream: str, batch_id_of: Callable[[pa.Table], int], *,
                 max_pending: int = 8, max_rows: int | None = None,
                 on_batch: Callable[[Coalesced], None] | None = None) -> None:
        """``batch_id_of(rows)``: the engine batch-id of a coalesced batch, the source position
        of its last row (so that a restart knows where to resume, and an offer that overlaps
        what the engine has can be trimmed: it is also called on prefixes of an offer); it
        must grow from one engine batch to the next. ``max_pending``: offers that may wait before
        ``offer`` blocks. ``max_rows``: at most this many rows per engine batch (at least one
        offer each), and ``offer`` also waits while its rows would make more than this many
        pending (the bound on how long an offer waits: at most one engine batch ahead of it).
        ``on_batch``: called in the coalescer's thread after each engine batch committed."""
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self.engine = engine
        self.stream = stream
        self.batch_id_of = batch_id_of
        self.max_pending = max_pending
        self.max_rows = max_rows
        self.on_batch = on_batch
        self._pending: list[tuple[pa.Table, Any]] = []
        self._running = 0  # offers taken by the thread, not committed yet
        self._cond = threading.Condition()
        self._closing = False
        self._failed: CoalescerFailed | None = None
        self._told = False  # a producer got ``_failed`` raised
        self._schema: pa.Schema | None = None  # the first offer's: every offer must have it
        #: the thread that ingests (``start``); the engine's calls for this stream run in it
        self.thread: threading.Thread | None = None
        self.batches = 0  # engine batches run
        self.offers = 0  # offers ingested
        self._pid = os.getpid()  # a forked child has neither the thread nor the engine's state
        #: an engine batch of this coalescer went in as a new batch (not a re-send): from then
        #: on the source is past what the engine had, and no offer can be stale
        self._caught_up = False

    # -- what producers call ---------------------------------------------------------------------
    def start(self) -> Coalescer:
        with self._cond:
            self._check_process()
            self._start_locked()
        return self

    def _start_locked(self) -> None:
        """Start the thread (caller holds ``_cond``: two producers' first offers must not start
        two threads), or start it again if it ended because the program seemed to end while
        nothing was pending (never after a failure or ``close``)."""
        if self.thread is not None and (self.thread.is_alive() or self._closing
                                        or self._failed is not None):
            return
        self.thread = threading.Thread(target=self._loop, daemon=False,
                                       name=f"sstore-coalescer-{self.stream}")
        _THREADS.add(self.thread)
        self.thread.start()

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"coalescer of stream {self.stream!r} was made in process {self._pid}; this is "
                f"a forked child (process {os.getpid()}): its thread and its engine are the "
                f"parent's, and its pending offers are the parent's to ingest. Open an Engine "
                f"and make a Coalescer in the child")

    def _check_can_wait(self, what: str) -> None:
        """Refuse to wait for the coalescer's thread where that thread can never make progress
        (caller holds ``_cond`` and is about to wait): in the thread itself (``on_batch``), or
        while holding the engine's lock, which the thread needs to ingest."""
        if threading.current_thread() is self.thread:
            raise RuntimeError(f"{what} in the coalescer's own thread (on_batch) would wait for "
                               f"that thread forever")
        if self.engine.holds_lock():
            raise RuntimeError(f"{what} would wait for the coalescer's thread while this thread "
                               f"holds the engine's lock (engine.lock, engine.transaction(), an "
                               f"observer), which that thread needs to ingest: it would wait "
                               f"forever; call it outside")

    def offer(self, rows: pa.Table, token: Any = None) -> None:
        """Queue one batch, an Arrow table (``token``: anything, handed back in
        ``Coalesced.tokens``); waits while the pending offers are at their bound
        (``max_pending``, ``max_rows``). Raises ``CoalescerFailed`` once an engine batch
        failed (this offer is then not queued)."""
        if not isinstance(rows, pa.Table):
            raise TypeError(f"Coalescer.offer takes a pyarrow.Table, not "
                            f"{type(rows).__name__} (pa.Table.from_pylist turns dicts into one)")
        with self._cond:
            self._check_process()
            self._check_schema(rows.schema)
            while True:
                self._raise_if_failed()
                if self._closing:
                    raise RuntimeError(f"coalescer of stream {self.stream!r} is closed")
                if not self._full(rows.num_rows):
                    break
                self._check_can_wait("offer")
                self._cond.wait()
            self._pending.append((rows, token))
            self._cond.notify_all()
            self._start_locked()

    def _check_schema(self, schema: pa.Schema) -> None:
        """Pin the first offer's schema; refuse an offer with another one (caller holds
        ``_cond``). Checked per offer, not when offers meet in a batch, so that whether an
        offer is refused does not depend on what happened to be pending with it."""
        if self._schema is None:
            self._schema = schema
        elif not schema.equals(self._schema):
            raise SchemaError(f"coalescer of stream {self.stream!r}: an offer with columns "
                              f"({_columns(schema)}) after offers with ({_columns(self._schema)}); "
                              f"offers are joined into one engine batch and must have one "
                              f"schema: this one was not queued")

    def _full(self, rows: int) -> bool:
        """Whether an offer of ``rows`` rows must wait: ``max_pending`` offers wait, or they
        and it would make more than ``max_rows`` rows (one offer alone may exceed it)."""
        if len(self._pending) >= self.max_pending:
            return True
        waiting = sum(t.num_rows for t, _ in self._pending)
        return bool(self._pending) and self.max_rows is not None and waiting + rows > self.max_rows

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every offer so far is ingested and run; False on timeout. Raises
        ``CoalescerFailed`` if an engine batch failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._check_process()
            while self._pending or self._running:
                self._raise_if_failed()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._check_can_wait("drain")
                self._cond.wait(left)
            self._raise_if_failed()
        return True

    def close(self) -> None:
        """Ingest what is pending, then stop the thread. Raises ``CoalescerFailed`` if an
        engine batch failed (now or before)."""
        try:
            self.drain()
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            if self.thread is not None and self.thread is not threading.current_thread():
                self.thread.join()
        with self._cond:  # an offer that came between drain and _closing, and failed
            self._raise_if_failed()

    def last_ingested(self) -> int:
        """The last batch-id the engine took on the stream from its source (0: none): resume
        after it. Batch-ids that dead-letter replays took are skipped: the engine numbered
        those (last + 1, ``sstore.dead_letters.replay``), they are no source position, and
        resuming after one would skip the source's row at that position."""
        rt = self._started()
        with self.engine.lock:
            last = rt.ledger.last_ingested.get(self.stream, 0)
            if not last or rt.interrupts.closed:
                return last
            replays = systables.replayed(rt.con, self.stream)
        while last in replays:  # each took the id after the last one then: an ingested id
            last -= 1
        return last

    def pending(self) -> int:
        """Offers waiting or running."""
        with self._cond:
            return len(self._pending) + self._running

    def __enter__(self) -> Coalescer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the coalescer's thread ------------------------------------------------------------------
    def _raise_if_failed(self) -> None:
        if self._failed is not None:
            self._told = True
            raise self._failed

    def _take(self) -> list[tuple[pa.Table, Any]] | None:
        """The next offers to run together (None: closing and nothing pending)."""
        with self._cond:
            while not self._pending:
                if self._closing or _program_ended():
                    return None  # closed, or the program ended with nothing pending
                self._cond.wait(EXIT_POLL)
            taken: list[tuple[pa.Table, Any]] = []
            rows = 0
            for rows_in, token in self._pending:
                if taken and self.max_rows is not None and rows + rows_in.num_rows > self.max_rows:
                    break
                taken.append((rows_in, token))
                rows += rows_in.num_rows
            del self._pending[:len(taken)]
            self._running = len(taken)
            self._cond.notify_all()  # room for producers
            return taken

    def _loop(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            batch_id: int | None = None
            before = 0
            try:
                started = time.perf_counter()
                before = self._engine_last()
                if before and not self._caught_up:  # positions, not replays' ids
                    taken = self._new_only(taken, self.last_ingested())
                table = pa.concat_tables([t for t, _ in taken]) if len(taken) > 1 else taken[0][0]
                batch_id = self._batch_id(table)
                ingested = self.engine.ingest_and_run(self.stream, table, batch_id=batch_id)
                self._caught_up = self._caught_up or not ingested.duplicate
                done = Coalesced(batch_id, tuple(tok for _, tok in taken), table.num_rows,
                                 time.perf_counter() - started, time.perf_counter())
            except BaseException as exc:  # kept and raised in the producers' threads
                # ``ingest_and_run`` commits the batch alone before a stop (``Stopped``)
                # reaches here: those offers are in, and must not be counted as lost
                self._fail(exc, 0 if self._took(batch_id, before) else len(taken))
                return
            self.batches += 1
            self.offers += len(taken)
            try:
                if self.on_batch is not None:  # before drain() may return
                    self.on_batch(done)
            except BaseException as exc:
                self._fail(exc, 0)  # the batch itself is in
                return
            with self._cond:
                self._running = 0
                self._cond.notify_all()

    def _batch_id(self, table: pa.Table) -> int:
        """``batch_id_of(table)``, an int (numpy's ints are taken): None would let the engine
        number the batch itself, and ``last_ingested()`` would then no longer be a position
        of the source (an offer with no rows gives None with ``pc.max``)."""
        raw = self.batch_id_of(table)
        if raw is None or isinstance(raw, bool):
            raise TypeError(f"batch_id_of returned {raw!r} for a batch of {table.num_rows} "
                            f"row(s); it must return the batch's int batch-id (offers with no "
                            f"rows: leave them out, or give them an id in batch_id_of)")
        try:
            return operator.index(raw)
        except TypeError:
            raise TypeError(f"batch_id_of returned {raw!r} ({type(raw).__name__}) for a batch "
                            f"of {table.num_rows} row(s); it must return an int") from None

    def _new_only(self, taken: list[tuple[pa.Table, Any]], last: int
                  ) -> list[tuple[pa.Table, Any]]:
        """What of ``taken`` is new to the engine, whose last batch-id from the source is
        ``last`` (``last_ingested()``: a dead-letter replay's id is no source position), for a
        source that may have resumed before ``last_ingested()`` (e.g. from an offset it
        commits in ``on_batch``, which a crash after the engine's COMMIT did not reach).
        Batch-ids are source positions and the engine's batches cover every position up to
        ``last``, so a row at a position at or below ``last`` is either in already or can
        never go in (out of order):

        - the first offer's own batch-id is not above ``last``: it runs alone, and the engine
          takes an exact re-send as a no-op and refuses any other (``OutOfOrderBatchError``,
          ``ResendMismatchError``), as one offer at a time; the others go back to the front
          of the queue;
        - it is above ``last`` but its first rows are not (a poll that starts before
          ``last`` and ends after it): those rows are trimmed off (``_first_new_row``), the
          rest goes in. Taken whole under the newer id they went in twice.

        Only until a batch went in as new (so ``batch_id_of`` is called a few times more at a
        start only, on prefixes of the first offer)."""
        rows, token = taken[0]
        if self._batch_id(rows) <= last:
            with self._cond:
                self._pending[0:0] = taken[1:]
                self._running = 1
            return taken[:1]
        first = self._first_new_row(rows, last)
        if first:
            log.warning("coalescer of stream %s: an offer's first %d row(s) are at source "
                        "positions the engine already has (up to batch-id %d): trimmed, not "
                        "ingested again", self.stream, first, last)
            taken = [(rows.slice(first), token), *taken[1:]]
        return taken

    def _first_new_row(self, rows: pa.Table, last: int) -> int:
        """The index of the first row of ``rows`` whose source position is above ``last``
        (the last row's is): ``batch_id_of`` of a prefix is the position of its last row.
        A binary search, so a few calls even for a large offer."""
        low, high = 0, int(rows.num_rows) - 1  # position of row ``high`` > last
        if high <= 0 or self._batch_id(rows.slice(0, 1)) > last:
            return 0
        while high - low > 1:  # position of row ``low`` <= last < position of row ``high``
            middle = (low + high) // 2
            if self._batch_id(rows.slice(0, middle + 1)) > last:
                high = middle
            else:
                low = middle
        return high

    def _started(self) -> Runtime:
        """The engine's runtime, starting the engine if nothing did yet: before it starts it
        has not read its state file, and would say "nothing ingested" on a restart."""
        rt = self.engine.runtime
        return rt if rt is not None else self.engine._runtime()

    def _engine_last(self) -> int:
        """The last batch-id the engine took on the stream, whoever sent it (0: none)."""
        rt = self._started()
        with self.engine.lock:
            return rt.ledger.last_ingested.get(self.stream, 0)

    def _took(self, batch_id: int | None, before: int) -> bool:
        """Whether this engine batch got in although ``ingest_and_run`` raised (``before``:
        the last batch-id before it)."""
        rt = self.engine.runtime
        if batch_id is None or batch_id <= before or rt is None:
            return False
        with self.engine.lock:
            return rt.ledger.was_ingested(self.stream, batch_id)

    def _fail(self, error: BaseException, running_lost: int) -> None:
        """Keep the failure for the producers; if the program ends before any of them was
        told (``offer``, ``drain``, ``close`` raised it), say so and exit with status 1."""
        with self._cond:
            lost = running_lost + len(self._pending)
            self._failed = CoalescerFailed(self.stream, error, lost)
            self._pending.clear()
            self._running = 0
            self._cond.notify_all()
            said = False
            while not self._told and not self._closing and not _program_ended():
                if not said and not threading.main_thread().is_alive():
                    # other threads keep the program alive and may never offer again: say it
                    # now, not only when they end
                    print(f"sstore: {self._failed}", file=sys.stderr, flush=True)
                    said = True
                self._cond.wait(EXIT_POLL)
            if self._told or self._closing:  # ``close`` raises it once the thread ended
                return
        if not said:
            print(f"sstore: {self._failed}", file=sys.stderr, flush=True)
        os._exit(1)


def _columns(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


#: the coalescers' threads, alive or not (weakly: a thread object goes when it ended)
_THREADS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def _program_ended() -> bool:
    """Whether the program is ending: its main thread ended and so did every other thread that
    keeps it alive (not a daemon), the coalescers' own apart. A producer thread that outlives
    the main thread still offers, and is still told of a failure."""
    if threading.main_thread().is_alive():
        return False
    return not any(t.is_alive() and not t.daemon and t not in _THREADS
                   for t in threading.enumerate() if t is not threading.main_thread())
