"""The consumer port: everything an external consumer may ask of an engine, in one place, each
call checked against what the stream really committed.

A consumer (a sink into PostgreSQL, ``sstore migrate``, a reader of a stream in another
process) lists a stream's committed batches, reads them, holds them, acknowledges what its
target took, rewinds after its target lost batches, halts on a terminal error and subscribes
to commits. ``Engine.port(stream, consumer)`` gives one ``ConsumerPort`` for that; the
engine's own methods of the same names (``Engine.acknowledge``, ``Engine.read_batches``, ...)
call the functions below, so there is one implementation of each rule:

- **acknowledge** only what the consumer's streams committed: an acknowledgement of batch
  ``b`` lets garbage collection remove every held batch up to ``b``, so one ahead of a stream
  (its procedure has not run that batch yet) would let GC remove batches the consumer never
  read, as they commit. Refused with ``AcknowledgementError``, nothing recorded.
- **read** only batches that are there: a range that starts at or below what garbage
  collection removed would come back without those rows (``GapError``), and one above what
  the stream committed would come back without rows it will have (``ReadAheadError``).
- **rewind** only backwards (forwards would be an unchecked acknowledgement).

Garbage collection reads the holds and acknowledgements in one place,
``Ledger.retain_from`` (the oldest batch a stream's procedures or holders still need), which
only what this port records moves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sstore.base.duck import arrow
from sstore.base.errors import GapError, TerminalError, UnknownStreamError
from sstore.base.sql import ident
from sstore.execution import halts
from sstore.execution.runtime import Runtime
from sstore.storage import consumers
from sstore.storage.consumers import AcknowledgementError
from sstore.storage.ledger import Ledger


class ReadAheadError(TerminalError):
    """A read of batches a stream has not committed yet: the rows would be missing, not late."""


def committed_through(ledger: Ledger, stream: str) -> int:
    """The highest batch-id ``stream`` has committed (0: none): its newest retained batch,
    what garbage collection removed (batches passed in memory count as collected), or, for a
    border stream, its newest ingest."""
    retained = ledger.batches.get(stream)
    newest = retained.ids[-1] if retained is not None and retained.ids else 0
    return max(newest, ledger.collected.get(stream, 0), ledger.last_ingested.get(stream, 0))


def acknowledge(rt: Runtime, consumer: str, batch_id: int) -> bool:
    """Record that ``consumer``'s target has every held batch up to ``batch_id`` (caller holds
    ``rt.lock``); True if it was news. Checked against each stream it holds."""
    for stream in sorted(s for s, holders in rt.ledger.holders.items() if consumer in holders):
        through = committed_through(rt.ledger, stream)
        if batch_id > through:
            raise AcknowledgementError(
                f"{consumer!r} acknowledged batch {batch_id} of stream {stream!r}, which has "
                f"committed batches up to {through} only: acknowledge only batches read from "
                f"the stream (garbage collection would remove the later ones unread)")
    return consumers.acknowledge(rt.ledger, rt.pending_acks, consumer, batch_id)


def read(rt: Runtime, stream: str, first: int, last: int, consumer: str = "a reader") -> pa.Table:
    """Rows of batches ``first``..``last`` of ``stream`` with their ``_batch_id``, in batch
    order (caller holds ``rt.lock``); refused when part of the range is not there."""
    if stream not in rt.graph.streams:
        raise UnknownStreamError(f"no stream {stream!r}; streams: {sorted(rt.graph.streams)}")
    if first > last:
        return pa.table({"_batch_id": pa.array([], pa.int64())})
    collected = rt.ledger.collected.get(stream, 0)
    if first <= collected:
        raise GapError(stream, consumer, first, min(last, collected))
    through = committed_through(rt.ledger, stream)
    if last > through:
        raise ReadAheadError(f"{consumer} read batches {first}..{last} of stream {stream!r}, "
                             f"which has committed batches up to {through} only: read the "
                             f"batches Engine.batches lists")
    if rt.store.schema(stream) is None:
        return pa.table({"_batch_id": pa.array([], pa.int64())})
    return arrow(rt.con, f"SELECT * FROM {ident(stream)} WHERE _batch_id BETWEEN ? AND ? "
                         f"ORDER BY _batch_id", [first, last], large=True)


def rewind(rt: Runtime, consumer: str, batch_id: int) -> None:
    """Move ``consumer``'s acknowledgement back to ``batch_id`` (caller holds ``rt.lock``)."""
    if batch_id < 0:
        raise AcknowledgementError(f"{consumer!r} rewound to batch {batch_id}: batch-ids are "
                                   f"positive (0: nothing taken)")
    consumers.rewind(rt.con, rt.ledger, consumer, batch_id, rt.pending_acks)


class ConsumerPort:
    """One consumer of one stream, as it sees the engine. ``runtime``: the engine's started
    runtime (``Engine._runtime``); every call takes the engine's lock where it needs it."""

    def __init__(self, runtime: Callable[[], Runtime], stream: str, consumer: str,
                 subscribe: Callable[..., Any]) -> None:
        self._runtime = runtime
        self.stream = stream
        self.consumer = consumer
        self._subscribe = subscribe

    def hold(self) -> bool:
        """Keep the stream's batches until this consumer acknowledges them (True if new)."""
        rt = self._runtime()
        with rt.lock:
            return consumers.hold(rt.con, rt.ledger, self.stream, self.consumer)

    def continue_from(self, after: int, *, accept_gap: bool = False) -> int:
        """The batch-id to continue after when the target has every batch up to ``after``
        (``GapError`` when GC removed batches above it, unless ``accept_gap``)."""
        rt = self._runtime()
        with rt.lock:
            return consumers.continue_from(rt.con, rt.ledger, self.stream, self.consumer,
                                           after, accept_gap)

    def batches(self, after: int = 0) -> list[tuple[int, int]]:
        """Committed batches after ``after`` still stored: (batch-id, rows), ascending."""
        return self._runtime().committed_batches(self.stream, after)

    def read(self, first: int, last: int) -> pa.Table:
        """Rows of committed batches ``first``..``last`` (all there, or an error)."""
        rt = self._runtime()
        with rt.lock:
            return read(rt, self.stream, first, last, repr(self.consumer))

    def acknowledged(self) -> int:
        rt = self._runtime()
        with rt.lock:
            return rt.ledger.progress.get(self.consumer, 0)

    def acknowledge(self, batch_id: int, *, wait: bool = True) -> bool:
        """Acknowledge every held batch up to ``batch_id``; ``wait=False``: only if the lock is
        free now (False: nothing recorded)."""
        rt = self._runtime()
        if not rt.lock.acquire(blocking=wait):
            return False
        try:
            if acknowledge(rt, self.consumer, batch_id):
                rt.wakeup.notify_all()  # an ingest waiting for this consumer re-checks now
        finally:
            rt.lock.release()
        return True

    def rewind(self, batch_id: int) -> None:
        rt = self._runtime()
        with rt.lock:
            rewind(rt, self.consumer, batch_id)

    def halt(self, batch_id: int, message: str) -> None:
        """Record that this consumer stopped on a terminal error after ``batch_id``."""
        halts.halt_consumer(self._runtime(), self.consumer, batch_id, message)

    def halted(self) -> str | None:
        return halts.consumer_halt(self._runtime(), self.consumer)

    def subscribe(self, callback: Callable[..., Any] | None = None) -> Any:
        """Be told of each batch the stream commits (``Engine.subscribe``)."""
        return self._subscribe(self.stream, callback)

    def drop(self) -> bool:
        """End the hold: the stream no longer waits for this consumer."""
        rt = self._runtime()
        with rt.lock:
            rt.wakeup.notify_all()
            return consumers.drop(rt.con, rt.ledger, self.stream, self.consumer,
                                  rt.pending_acks)
