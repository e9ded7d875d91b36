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
warehouse at every batch size, ``tests/test_tpcdi_streaming.py``). The engine cannot check
this; choosing a coalescer declares it. What changes: several offers share one batch-id and
one transaction (all of them or none), and procedures see them as one batch.

What a user can get wrong here, and what happens:

- **An offer is not durable when ``offer`` returns** (as a message is not consumed before its
  offset is committed): it is once ``on_batch`` reported it, or ``drain`` returned. After a
  crash, resume the source after ``last_ingested()`` (the batch-id ``batch_id_of`` gave the
  last engine batch that committed). Exactly-once is then the engine's: a batch-id it took is
  never taken twice.
- **A failed engine batch stops the coalescer, loudly.** The error (an out-of-order batch-id,
  rows that do not fit the stream, batches whose columns differ) is kept; every later
  ``offer``, ``drain`` and ``close`` raises ``CoalescerFailed`` with it as the cause and the
  number of offers that did not get in. Nothing is dropped silently, nothing after a failed
  batch is ingested (that would reorder the stream).
- **A producer faster than the engine waits** in ``offer`` while ``max_pending`` offers are
  pending (backpressure), so memory stays bounded; the engine's own backpressure
  (``sstore.backpressure``) acts on the coalesced batches as on any.
- **``close`` without ``drain``** still ingests what is pending before it returns, and so does
  **a program that ends without ``close``**: the thread is not a daemon; once the main thread
  has ended it ingests what is pending and stops. If that fails, or an engine batch failed
  earlier and no ``offer``, ``drain`` or ``close`` raised it before the program ended, offers
  are lost: it says so on stderr and ends the process with exit status 1, never 0.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sstore.engine import Engine
from sstore.errors import TerminalError


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
        """``batch_id_of(rows)``: the engine batch-id of a coalesced batch (for example the
        source position of its last row, so that a restart knows where to resume); it must grow
        from one engine batch to the next. ``max_pending``: offers that may wait before
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
        #: the thread that ingests (``start``); the engine's calls for this stream run in it
        self.thread: threading.Thread | None = None
        self.batches = 0  # engine batches run
        self.offers = 0  # offers ingested

    # -- what producers call ---------------------------------------------------------------------
    def start(self) -> Coalescer:
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, daemon=False,
                                            name=f"sstore-coalescer-{self.stream}")
            self.thread.start()
        return self

    def offer(self, rows: pa.Table, token: Any = None) -> None:
        """Queue one batch, an Arrow table (``token``: anything, handed back in
        ``Coalesced.tokens``); waits while the pending offers are at their bound
        (``max_pending``, ``max_rows``). Raises ``CoalescerFailed`` once an engine batch
        failed (this offer is then not queued)."""
        if not isinstance(rows, pa.Table):
            raise TypeError(f"Coalescer.offer takes a pyarrow.Table, not "
                            f"{type(rows).__name__} (pa.Table.from_pylist turns dicts into one)")
        with self._cond:
            while True:
                self._raise_if_failed()
                if self._closing:
                    raise RuntimeError(f"coalescer of stream {self.stream!r} is closed")
                if not self._full(rows.num_rows):
                    break
                self._cond.wait()
            self._pending.append((rows, token))
            self._cond.notify_all()
        self.start()

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
            while self._pending or self._running:
                self._raise_if_failed()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
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
            if self.thread is not None:
                self.thread.join()

    def last_ingested(self) -> int:
        """The last batch-id the engine took on the stream (0: none): resume after it."""
        rt = self.engine.runtime
        if rt is None:
            return 0
        with self.engine.lock:
            return rt.ledger.last_ingested.get(self.stream, 0)

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
                if self._closing or not threading.main_thread().is_alive():
                    return None  # closed, or the program ended with nothing pending
                self._cond.wait(EXIT_POLL)
            taken, rows = [], 0
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
            try:
                started = time.perf_counter()
                table = pa.concat_tables([t for t, _ in taken]) if len(taken) > 1 else taken[0][0]
                batch_id = self.batch_id_of(table)
                self.engine.ingest_and_run(self.stream, table, batch_id=batch_id)
                done = Coalesced(batch_id, tuple(tok for _, tok in taken), table.num_rows,
                                 time.perf_counter() - started, time.perf_counter())
            except BaseException as exc:  # kept and raised in the producers' threads
                self._fail(exc, len(taken))
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

    def _fail(self, error: BaseException, running_lost: int) -> None:
        """Keep the failure for the producers; if the program ends before any of them was
        told (``offer``, ``drain``, ``close`` raised it), say so and exit with status 1."""
        with self._cond:
            lost = running_lost + len(self._pending)
            self._failed = CoalescerFailed(self.stream, error, lost)
            self._pending.clear()
            self._running = 0
            self._cond.notify_all()
            while not self._told and threading.main_thread().is_alive():
                self._cond.wait(EXIT_POLL)
            if self._told:
                return
        print(f"sstore: {self._failed}", file=sys.stderr, flush=True)
        os._exit(1)
