"""External consumers of streams: declared, held, acknowledged, never silently after a gap.

An external consumer reads a stream's committed batches from outside the dataflow (a sink into
PostgreSQL, ``sstore migrate``) and acknowledges what its target has safely taken. Garbage
collection and consumers meet here, and the rules are:

1. A consumer is *declared* (``Engine.consumer`` with the dataflow, before the engine starts,
   or ``Engine.hold`` later). From then on its stream keeps every batch the consumer has not
   acknowledged (``sstore_sys.holders``), across restarts, until the consumer is dropped.
2. Before it reads, the consumer asks ``continue_from(stream, consumer, after)`` for the batch
   to continue after. If garbage collection removed a batch above ``after``
   (``sstore_sys.collected``: batches collected before the consumer existed, or after it had
   acknowledged them to a target that has since lost them), the consumer would start after a
   gap: ``GapError`` names the missing range, unless the gap is accepted, which records it
   (``sstore_sys.gaps``, shown by ``status`` for good) and continues after it.
3. It acknowledges what its target committed (``acknowledge``); only then may GC remove it.
   An acknowledgement takes effect in memory at once (GC, backpressure) and is written with
   the next transaction that writes commit records anyway (a group commit, GC: see
   ``ack_records``), not as a DuckDB commit of its own under the engine's lock: a sink that
   acknowledged every batch made every batch wait for one more COMMIT. A crash can lose the
   newest acknowledgements; that is harmless, because a consumer's target watermark, not its
   acknowledgement, is what a restart trusts, and GC writes the acknowledgements it relies on
   in the transaction that removes the batches.
4. If its target lost batches it had acknowledged (a target dropped by hand), ``rewind`` moves
   its acknowledgement back, so the engine delivers them again (step 2 still decides whether
   they are all there).
5. ``drop`` ends the hold: the stream no longer waits for the consumer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import duckdb

from sstore.base.errors import GapError, TerminalError, UnknownStreamError
from sstore.storage import systables
from sstore.storage.ledger import Ledger


class AcknowledgementError(TerminalError):
    """An acknowledgement of a batch that no stream has committed: taken, it would let garbage
    collection remove batches the consumer never read, as they commit."""


@dataclass
class ConsumerStatus:
    """One consumer of one stream, as ``status`` shows it."""

    stream: str
    consumer: str
    acknowledged: int
    pending_batches: int
    pending_from: int | None
    gaps: list[dict[str, object]] = field(default_factory=list)
    halted: str | None = None


def hold(con: duckdb.DuckDBPyConnection, ledger: Ledger, stream: str, consumer: str) -> bool:
    """Step 1: keep ``stream``'s batches for ``consumer``. True if the hold is new."""
    if stream not in ledger.graph.streams:
        raise UnknownStreamError(f"no stream {stream!r}; streams: {sorted(ledger.graph.streams)}")
    holders = ledger.holders.setdefault(stream, set())
    if consumer in holders:
        return False
    systables.add_holder(con, stream, consumer)
    holders.add(consumer)
    return True


def continue_from(con: duckdb.DuckDBPyConnection, ledger: Ledger, stream: str, consumer: str,
                  after: int, accept_gap: bool) -> int:
    """Step 2: the batch-id ``consumer`` continues after, given that its target has every batch
    of ``stream`` up to ``after``. Raises ``GapError`` if garbage collection removed batches
    above ``after``, unless ``accept_gap`` (then the gap is recorded and skipped)."""
    collected = ledger.collected.get(stream, 0)
    if collected <= after:
        return after
    first = after + 1
    if not accept_gap:
        raise GapError(stream, consumer, first, collected)
    systables.insert_gap(con, consumer, stream, first, collected)
    return collected


def acknowledge(ledger: Ledger, pending: dict[str, int], consumer: str, batch_id: int) -> bool:
    """Step 3: ``consumer``'s target has every held batch up to ``batch_id``; ``pending``
    keeps it until a transaction writes it (``ack_records``). True if it was news.

    Checked against what committed: every batch-id of every stream is one a border stream
    took, so one above the newest border batch cannot have been read (``AcknowledgementError``;
    nothing recorded)."""
    if batch_id <= ledger.progress.get(consumer, 0):
        return False
    newest = max(ledger.last_ingested.values(), default=0)
    if batch_id > newest:
        raise AcknowledgementError(
            f"{consumer!r} acknowledged batch {batch_id}, but no stream has committed a batch "
            f"above {newest}: acknowledge only batches read from the stream")
    ledger.record(consumer, batch_id, 0)
    pending[consumer] = batch_id
    return True


def ack_records(pending: Mapping[str, int]) -> list[tuple[str, int, int]]:
    """The commit records of the acknowledgements not yet written, for a transaction that
    writes commit records anyway; after its COMMIT, ``acks_written`` forgets them."""
    return [(consumer, batch_id, 0) for consumer, batch_id in pending.items()]


def acks_written(pending: dict[str, int], records: Iterable[tuple[str, int, int]]) -> None:
    """Forget the acknowledgements ``records`` wrote (a newer one taken meanwhile stays)."""
    for consumer, batch_id, _ in records:
        if pending.get(consumer) == batch_id:
            del pending[consumer]


def write_acks(con: duckdb.DuckDBPyConnection, pending: dict[str, int]) -> None:
    """Write the pending acknowledgements in a transaction of their own (status, close)."""
    records = ack_records(pending)
    if not records:
        return
    con.begin()
    try:
        systables.insert_commits(con, records)
        con.commit()
    except BaseException:
        con.rollback()
        raise
    acks_written(pending, records)


def rewind(con: duckdb.DuckDBPyConnection, ledger: Ledger, consumer: str, batch_id: int,
           pending: dict[str, int]) -> None:
    """Step 4: ``consumer``'s acknowledgement goes back to ``batch_id`` (0: nothing)."""
    if batch_id >= ledger.progress.get(consumer, 0):
        return
    con.begin()
    try:
        con.execute("DELETE FROM sstore_sys.commits WHERE node = ? AND batch_id > ?",
                    [consumer, batch_id])
        if batch_id:
            systables.insert_commits(con, [(consumer, batch_id, 0)])
        con.commit()
    except BaseException:
        con.rollback()
        raise
    pending.pop(consumer, None)  # an acknowledgement not written yet is taken back too
    ledger.rewind(consumer, batch_id)


def drop(con: duckdb.DuckDBPyConnection, ledger: Ledger, stream: str, consumer: str,
         pending: dict[str, int]) -> bool:
    """Step 5: stop holding ``stream`` for ``consumer``. True if there was such a hold."""
    holders = ledger.holders.get(stream, set())
    if consumer not in holders:
        return False
    write_acks(con, pending)  # the consumer's records go below with its others, if at all
    con.begin()
    try:
        systables.remove_holder(con, stream, consumer)
        if not any(consumer in hs for s, hs in ledger.holders.items() if s != stream):
            con.execute("DELETE FROM sstore_sys.commits WHERE node = ?", [consumer])
        con.commit()
    except BaseException:
        con.rollback()
        raise
    holders.discard(consumer)
    if not any(consumer in hs for hs in ledger.holders.values()):
        ledger.progress.pop(consumer, None)
    return True


def list_consumers(con: duckdb.DuckDBPyConnection, ledger: Ledger) -> list[ConsumerStatus]:
    """Every hold, with how far its consumer is, the gaps it accepted and its halt."""
    return describe(ledger.holders, lambda c: ledger.progress.get(c, 0),
                    lambda s: ledger.node_batches(s).ids, systables.load_gaps(con),
                    systables.load_halts(con))


def describe(holders: Mapping[str, Iterable[str]], acknowledged: Callable[[str], int],
             batch_ids: Callable[[str], Sequence[int]],
             gaps: Iterable[tuple[str, str, int, int, str]],
             halts: Mapping[str, tuple[int, str]]) -> list[ConsumerStatus]:
    """``ConsumerStatus`` rows from the holds, the acknowledgements, the retained batch-ids
    of each stream, the accepted gaps and the halts (from a live ledger, or from a bare state
    file)."""
    accepted: dict[tuple[str, str], list[dict[str, object]]] = {}
    for consumer, stream, first, last, at in gaps:
        accepted.setdefault((consumer, stream), []).append(
            {"first_batch": first, "last_batch": last, "accepted_at": at})
    out = []
    for stream in sorted(holders):
        ids = batch_ids(stream)
        for consumer in sorted(holders[stream]):
            acked = acknowledged(consumer)
            waiting = [b for b in ids if b > acked]
            halt = halts.get(consumer)
            out.append(ConsumerStatus(stream, consumer, acked, len(waiting),
                                      waiting[0] if waiting else None,
                                      accepted.get((consumer, stream), []),
                                      None if halt is None else systables.halt_text(*halt)))
    return out
