"""The ingest path behind ``Engine.ingest`` and ``Engine.ingest_and_run``: a batch's checks
(stream, batch-id, re-send, order, backpressure), its commit protocol, and its replay from the
input log of weak durability.

The functions take the engine's runtime and what else they need explicitly: no engine object
(``ingest_batch`` takes ``rt.lock``; ``apply_ingest`` runs under it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pyarrow as pa

from sstore.base.duck import rollback_after_failure
from sstore.base.errors import (
    BatchIdTakenError,
    DeclarationError,
    OutOfOrderBatchError,
    ResendMismatchError,
    TransactionStateError,
    UnknownStreamError,
)
from sstore.base.faults import crash_point
from sstore.base.fingerprint import fingerprint, soon
from sstore.base.rows import RowsLike
from sstore.execution import group
from sstore.execution.backpressure import Backpressure
from sstore.execution.runtime import CommitEvent, Runtime
from sstore.execution.transaction import Transaction
from sstore.storage import evolution, systables
from sstore.storage.inputlog import LogRecord
from sstore.storage.streams import PendingCommit

log = logging.getLogger("sstore")

MAX_BATCH_ID = 2 ** 63 - 1  # batch-ids are stored as BIGINT


class Ingested(int):
    """The batch-id an ``ingest`` call used; ``duplicate`` is True when it was a no-op re-send.
    ``executions``: the transaction executions ``ingest_and_run`` ran (as ``run_until_idle``
    counts them; 0 for ``ingest``)."""

    duplicate: bool
    rows: int
    executions: int

    def __new__(cls, batch_id: int, duplicate: bool, rows: int,
                executions: int = 0) -> Ingested:
        obj = super().__new__(cls, batch_id)
        obj.duplicate = duplicate
        obj.rows = rows
        obj.executions = executions
        return obj


def ingest_batch(rt: Runtime, backpressure: Backpressure,
                 replayed_ids: dict[str, dict[int, int]], stream: str, rows: RowsLike,
                 batch_id: int | None, *,
                 along: Callable[[Transaction], None] | None = None,
                 run: bool = False) -> Ingested:
    """The one way a batch enters a border stream: ``Engine.ingest``, ``Engine.ingest_and_run``
    (``run``), the Coalescer (through ``ingest_and_run``) and dead-letter replay (``along``)
    all come here, so the stream checks, the batch-id checks and re-send detection
    (``_admit``), and the commit (``apply_ingest``, or a group it leads) are the same for
    all of them; weak durability's replay (``replay_ingest``) passes a logged batch through
    ``_admit`` and ``apply_ingest`` too.

    ``run``: the caller runs the batch's TEs next; the batch then leads their group commit
    (``group.ingest_and_run``) when ``_may_lead`` says so, and is committed alone otherwise.
    Whether its rows are stored is decided by ``sstore.execution.passing`` only. ``backpressure``:
    the engine's readers' bounds; ``replayed_ids``: the engine's batch-ids that dead-letter
    replays took, per border stream (read on the first re-send, forgotten by an ``along``
    ingest)."""
    if stream not in rt.graph.streams:
        raise UnknownStreamError(f"no stream {stream!r}; streams: {sorted(rt.graph.streams)}")
    if not rt.graph.is_border(stream):
        raise DeclarationError(f"stream {stream!r} is written by "
                               f"{rt.graph.writer_of(stream)}; only border streams "
                               f"take ingest")
    if batch_id is not None:
        _check_batch_id(batch_id)
    table = rt.store.conform(stream, rows, f"stream {stream!r}")
    sent = soon(table)  # beside the transaction; recorded with the batch, or compared
    with rt.lock:
        backpressure.admit(rt, stream, batch_id)  # may wait, releasing the lock
        taken = _admit(rt, replayed_ids, stream, batch_id, table, sent)
        if taken.duplicate:
            return taken
        batch_id = int(taken)
        if run and _may_lead(rt):
            group.ingest_and_run(rt, stream, batch_id, table, sent, lambda: apply_ingest(
                rt, stream, batch_id, table, sent()))
        else:
            if along is not None:  # maybe a dead-letter replay: it records its batch-id
                replayed_ids.pop(stream, None)
            apply_ingest(rt, stream, batch_id, table, sent(), along=along)
        if rt.checkpoints is not None:
            rt.checkpoints.after_commit()
    rt.subscribers.publish(rt.take_outbox())
    return taken


def _may_lead(rt: Runtime) -> bool:
    """Whether an ingest whose TEs run next may lead their group commit: not with weak
    durability (its input log records a batch alone, and its replay runs the TEs again up to
    each record's mark, ``sstore.execution.recovery``), nor once a stop was requested (the batch is
    committed alone and the TEs run later)."""
    return rt.input_log is None and not rt.interrupts.stopping()


def _admit(rt: Runtime, replayed_ids: dict[str, dict[int, int]], stream: str,
           batch_id: int | None, table: pa.Table, sent: Callable[[], int]) -> Ingested:
    """The batch-id checks and re-send detection of every ingest (caller holds ``rt.lock``):
    the batch-id to take (the next one when None), or a no-op re-send (``duplicate``: the
    same rows under an id taken before); refused with ``BatchIdTakenError`` (an id a
    dead-letter replay took), ``ResendMismatchError`` (other rows under a taken id) or
    ``OutOfOrderBatchError`` (a new id below the last), before anything is written."""
    last = rt.ledger.last_ingested.get(stream, 0)
    if batch_id is None:
        batch_id = last + 1
        _check_batch_id(batch_id)
    elif rt.ledger.was_ingested(stream, batch_id):
        if stream not in replayed_ids:
            replayed_ids[stream] = systables.replayed(rt.con, stream)
        replayed = replayed_ids[stream].get(batch_id)
        if replayed is not None:
            raise BatchIdTakenError(
                f"stream {stream!r}: batch-id {batch_id} was taken by a dead-letter "
                f"replay (the dead letters of batch {replayed}, sstore dead-letters "
                f"replay), so this batch is not a re-send and was NOT ingested; send "
                f"it under a batch-id above {last} (or without one)")
        _check_resend(rt, stream, batch_id, table, sent(), last)
        log.info("stream %s batch %s was already ingested: no-op", stream, batch_id)
        return Ingested(batch_id, True, 0)
    elif batch_id < last:
        raise OutOfOrderBatchError(
            f"stream {stream!r}: batch-id {batch_id} is lower than the last ingested "
            f"({last}) and was never ingested; batches must arrive in increasing order")
    return Ingested(batch_id, False, table.num_rows)


def apply_ingest(rt: Runtime, stream: str, batch_id: int, table: pa.Table, sent: int,
                 along: Callable[[Transaction], None] | None = None) -> None:
    """Commit protocol of an ingest committed alone (``sent``: the batch's fingerprint):

    1. BEGIN.
    2. Append the rows, always stored (EE triggers, windows): DuckDB checks NOT NULL, CHECK,
       keys here; then ``along``'s statements, if any.
    3. Insert the commit records, the batch's with its row count and fingerprint (what a
       re-send of its id is checked against, ``_check_resend``).
    4. Weak durability, unless this is the replay of the log itself: append the batch to
       the input log, fsync. Only now, when the engine has accepted every row, so the log
       never holds a batch that cannot be replayed.
    5. COMMIT (on failure: ROLLBACK and cut the log record off again).
    6. Apply to memory.

    A crash before step 4 leaves nothing (the client re-sends); between 4 and 5 the batch
    is in the log, valid, and replayed at restart; after 5 it is committed and logged.
    """
    pending = PendingCommit()
    logged: int | None = None
    began = time.perf_counter()
    rt.con.begin()
    try:
        rt.store.append(stream, batch_id, table, pending, fingerprint=sent)
        if along is not None:
            tx = Transaction(rt.con, batch_id, streams=rt.stream_tables)
            along(tx)
            if tx.failure is not None:  # caught inside along: DuckDB aborted the transaction
                raise TransactionStateError(f"a statement of ingest's along failed "
                                            f"({tx.failure})") from tx.failure
        systables.insert_commits(rt.con, pending.records, pending.fingerprints)
        if rt.input_log is not None and not rt.replaying:
            crash_point("ingest.before_log")
            logged = rt.input_log.append_ingest(stream, batch_id, table, rt.te_seq)
        crash_point("ingest.before_commit")
        rt.con.commit()
    except BaseException:
        rollback_after_failure(rt.con)
        rt.store.forget(pending)
        if logged is not None and rt.input_log is not None:
            rt.input_log.undo(logged)
        raise
    crash_point("ingest.after_commit")
    rt.finish(pending)
    if rt.observers:
        now = time.perf_counter()
        rt.observe(CommitEvent("ingest", stream, batch_id, table.num_rows, now,
                               table.num_rows, now - began))


def replay_ingest(rt: Runtime, record: LogRecord) -> None:
    """Apply an ingest record of the input log again (``recovery.replay``), not logging it.

    Through the same checks as a live ingest (``_admit``): a logged batch the state already
    holds (a snapshot that does not say which records it contains) is a re-send, a no-op
    with the same rows and ``ResendMismatchError`` with others; a batch-id below the last is
    ``OutOfOrderBatchError``. Never appended twice, never taken over other rows."""
    assert record.stream and record.batch_id and record.table is not None
    _check_logged_types(rt, record.stream, record.table)
    sent = fingerprint(record.table)
    if _admit(rt, {}, record.stream, record.batch_id, record.table, lambda: sent).duplicate:
        return
    apply_ingest(rt, record.stream, record.batch_id, record.table, sent)


def _check_logged_types(rt: Runtime, stream: str, logged: pa.Table) -> None:
    """A batch in the input log has the column types its stream had when it was accepted; a
    program that declares the stream with other types (and no snapshot holds its table to
    compare with, ``StreamStore.create_all``) would have replay cast the logged values into
    them: ``'7'`` into an INTEGER, a REAL into a DOUBLE. Refused, naming the column."""
    schema = rt.store.schemas.get(stream)
    if schema is None:
        return
    for name, field in zip(logged.schema.names, logged.schema, strict=False):
        if name not in schema.names:
            continue
        declared = schema.field(name).type
        if declared != field.type:
            raise DeclarationError(
                f"stream {stream!r} column {name!r} is declared {declared} but its batches in "
                f"the input log have {field.type}: a stream's column types cannot change on "
                f"an existing state (the log would be replayed into other values); declare it "
                f"as before. The snapshot and the log are untouched. To evolve the stream "
                f"(sstore.storage.evolution), start once with the old declaration and call "
                f"Engine.checkpoint(), then start the new one")


def _check_resend(rt: Runtime, stream: str, batch_id: int, table: pa.Table, sent: int,
                  last: int) -> None:
    """A re-send of ingested batch ``batch_id`` is a no-op only if it carries the same rows:
    compare the row count and the fingerprint (``sent``) with the batch's commit record and
    raise ``ResendMismatchError`` if either differs, before anything is written.

    Checked against what was recorded: a batch ingested before fingerprints existed has the
    row count only; one whose record GC compacted into a run of ids keeps both
    (``systables.ingested_prints``), except a record compacted by an sstore older than that
    table, which has neither: such a re-send stays a no-op, unchecked, and says so in the
    log. A point query, paid by re-sends only."""
    recorded = systables.ingested_record(rt.con, stream, batch_id)
    if recorded is None:
        log.warning("stream %s batch %s: its record was compacted by an sstore older than "
                    "sstore_sys.ingested_prints, so this re-send cannot be compared with the "
                    "rows first sent; taken as a no-op unchecked", stream, batch_id)
        return
    rows, recorded_print = recorded
    if rows != table.num_rows or (recorded_print is not None and recorded_print != sent
                                  and recorded_print != evolution.resent_fingerprint(
                                      rt.con, stream, batch_id, table)):
        raise ResendMismatchError(stream, batch_id, rows, table.num_rows, last)


def _check_batch_id(batch_id: object) -> None:
    """Refuse a batch-id DuckDB cannot store, before any transaction (a raw ConversionException
    from inside the ingest's transaction would say nothing about the cause)."""
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 1:
        raise OutOfOrderBatchError(f"batch-id must be a positive integer, got {batch_id!r}")
    if batch_id > MAX_BATCH_ID:
        raise OutOfOrderBatchError(f"batch-id {batch_id} does not fit in a BIGINT (at most "
                                   f"{MAX_BATCH_ID})")
