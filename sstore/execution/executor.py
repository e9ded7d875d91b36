"""One transaction execution (TE): a stored procedure run on one batch, as one DuckDB transaction.

Commit protocol of a TE (procedure P, batch b):

1. Read P's input batch b of every input (from the cache of recently committed batches, else
   from the stream table; for a window, its contents as of the slide at b).
2. BEGIN.
3. Call P(tx, batch). Its reads and writes of state tables go through ``tx``.
4. Check what P returned against each output stream's schema.
5. Append batch b to each output stream: insert the rows, run the stream's EE triggers, feed its
   windows.
6. Insert the commit records (each output stream's batch b, each window slide, and P's own
   progress "P did b") in one statement.
7. COMMIT. Everything from steps 3-6 is now durable together, or (on any error) none of it is.
8. Apply the commit to memory (ledger, windows, cache) and queue the subscriber notifications.

A crash before step 7 leaves no trace: P runs b again after restart. A crash after step 7 is
recovered from the commit records: P does not run b again. That is exactly-once.

On an exception: ROLLBACK; a transient error (``sstore.base.retry.kind_of``: ``TransientError``, a
DuckDB write conflict, a lost connection) is retried through ``sstore.base.retry.call`` with backoff
up to P's ``retries``; any other error, a timeout (``sstore.execution.interrupts``) or the last
retry applies P's error policy (see ``ErrorPolicy``). An interruption because the engine is stopping
is not an error: it rolls back and raises ``Stopped``, recording nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import duckdb
import pyarrow as pa

from sstore.base import digest, retry
from sstore.base.duck import registered
from sstore.base.errors import ProcedureError
from sstore.base.faults import crash_point
from sstore.base.redact import mask_secrets
from sstore.base.retry import RetryPolicy
from sstore.dataflow.graph import ErrorPolicy, ProcedureDecl
from sstore.execution.interrupts import Reason, Stopped, TimedOut, is_interrupted
from sstore.execution.runtime import CommitEvent, Runtime
from sstore.execution.transaction import Transaction
from sstore.storage import systables
from sstore.storage.streams import PendingCommit, append_or_create

log = logging.getLogger("sstore")

BACKOFF_SECONDS = 0.05  # first wait before retrying a transient failure; doubles each time
MAX_BACKOFF_SECONDS = 2.0


def run_te(rt: Runtime, name: str, batch_id: int,
           first_failure: Exception | None = None) -> bool:
    """Run procedure ``name`` on ``batch_id``. True if the batch is done (committed or
    dead-lettered), False if the procedure halted. Caller holds ``rt.lock``.

    Transient failures (``retry.kind_of``) are tried again through ``retry.call``, up to the
    procedure's ``retries``; any other failure, a timeout, or the last transient one applies the
    procedure's error policy (``_fail``). An interruption is no failure: when the engine is
    stopping, the TE rolls back, nothing is recorded and ``Stopped`` is raised; Ctrl-C that
    reached the procedure or DuckDB without a stop handler is raised as ``KeyboardInterrupt``.

    ``first_failure``: how this TE failed a moment ago inside a group commit
    (``sstore.execution.group``);
    that was its first attempt, so a terminal failure applies the error policy at once and a
    transient one has one retry fewer.
    """
    decl = rt.graph.procedures[name]
    inputs = {node: rt.input_batch(node, batch_id) for node in decl.inputs}  # step 1
    policy = RetryPolicy(attempts=decl.retries + 1, first_delay=BACKOFF_SECONDS,
                         max_delay=MAX_BACKOFF_SECONDS)
    tried = int(first_failure is not None)
    try:
        if first_failure is not None and (decl.retries < 1 or
                                          not retry.is_transient(first_failure)):
            raise first_failure
        retry.call(lambda: _attempt(rt, decl, batch_id, inputs), policy,
                   f"procedure {name} batch {batch_id}", stop=rt.interrupts.stop_requested,
                   tried=tried)
        return True
    except Stopped:
        raise
    except BaseException as exc:  # every failure is classified below
        if rt.interrupts.stopping():
            # stopping: whatever ended the TE, it rolled back; running again shows a real error
            raise Stopped(f"stopped: procedure {name!r} batch {batch_id} rolled back") from exc
        if is_interrupted(exc):
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise KeyboardInterrupt(f"procedure {name!r} batch {batch_id} rolled back") from exc
        if not isinstance(exc, Exception):
            raise  # SystemExit and friends end the process; the TE has rolled back
        return _fail(rt, decl, batch_id, inputs, exc)


def _attempt(rt: Runtime, decl: ProcedureDecl, batch_id: int, inputs: dict[str, pa.Table]) -> None:
    con = rt.con
    guard = rt.interrupts
    pending = PendingCommit()
    tx = Transaction(con, batch_id, decl.name, rows_in=sum(t.num_rows for t in inputs.values()),
                     streams=rt.stream_tables, digests=rt.input_log is not None)
    began = time.perf_counter()
    con.begin()  # step 2
    register_inputs(con, inputs)  # left registered: the next execution's register replaces it
    guard.arm(con, decl.timeout)  # interruptible (stop, timeout) until just before COMMIT
    try:
        guard.check()
        with guard.procedure_code():
            result = decl.fn(tx, inputs[decl.inputs[0]] if len(inputs) == 1
                             else dict(inputs))  # step 3
        outputs = check_outputs(rt, decl, batch_id, result)  # step 4
        tx._note_outputs(outputs)
        for stream, table in outputs.items():  # step 5
            rt.store.append(stream, batch_id, table, pending)
        pending.records.append((decl.name, batch_id, sum(t.num_rows for t in outputs.values())))
        systables.insert_commits(con, pending.records)  # step 6
        guard.disarm()  # raises if the TE was interrupted meanwhile: it must not commit
        crash_point("te.before_commit")
        con.commit()  # step 7
        tx._mark_committed()
    except BaseException as exc:
        reason = guard.disarm(quiet=True)
        con.rollback()
        tx._mark_rolled_back()
        rt.store.forget(pending)
        if reason is Reason.TIMEOUT:
            assert decl.timeout is not None
            raise TimedOut(decl.name, batch_id, decl.timeout) from exc
        if reason is Reason.STOP:
            raise Stopped(f"stopped: procedure {decl.name!r} batch {batch_id} rolled back") \
                from exc
        if tx.failure is not None and tx.failure is not exc and isinstance(exc, Exception):
            # the procedure caught a failed statement and went on: DuckDB had aborted the
            # transaction, so what failed next only says so; the caught error is the cause
            raise tx.failure from exc
        raise
    crash_point("te.after_commit")
    rt.te_seq += 1
    rt.since_gc += 1
    note_te(rt, decl.name, batch_id, tx)
    rt.finish(pending)  # step 8
    if rt.observers:
        now = time.perf_counter()
        rt.observe(CommitEvent("te", decl.name, batch_id, pending.records[-1][2], now,
                               sum(t.num_rows for t in inputs.values()), now - began))


def register_inputs(con: duckdb.DuckDBPyConnection, inputs: dict[str, pa.Table]) -> None:
    """Make the input batches visible to SQL. They stay registered after the execution (an
    unregister costs half a millisecond); the next execution's register replaces them."""
    for node, table in inputs.items():
        rel = "batch" if len(inputs) == 1 else f"{node}_batch"
        if table.num_columns:
            con.register(rel, table)
        else:  # an undeclared stream whose producer has returned no typed rows yet
            try:
                con.unregister(rel)  # never let a previous execution's batch show through
            except duckdb.Error:
                pass


def check_outputs(rt: Runtime, decl: ProcedureDecl, batch_id: int,
                  result: Any) -> dict[str, pa.Table]:
    if not decl.outputs:
        if result is not None:
            raise ProcedureError(decl.name, batch_id, "returned rows but declares no output")
        return {}
    if len(decl.outputs) == 1 and not (isinstance(result, Mapping)
                                       and set(result) <= set(decl.outputs) and result):
        result = {decl.outputs[0]: result}
    if result is None:
        result = {}
    if not isinstance(result, Mapping):
        raise ProcedureError(decl.name, batch_id, f"with outputs {list(decl.outputs)} it must "
                             f"return a dict of stream name to rows, not {type(result).__name__}")
    unknown = set(result) - set(decl.outputs)
    if unknown:
        raise ProcedureError(decl.name, batch_id, f"returned rows for undeclared outputs "
                             f"{sorted(unknown)}")
    return {stream: rt.store.conform(stream, result.get(stream),
                                     f"output {stream!r} of procedure {decl.name!r}")
            for stream in decl.outputs}


def _fail(rt: Runtime, decl: ProcedureDecl, batch_id: int, inputs: dict[str, pa.Table],
          exc: Exception) -> bool:
    """Apply the procedure's error policy. A halt is recorded (error row and halt row in one
    transaction) so that it outlives the process: the procedure stays halted across restarts
    until ``Engine.resume`` / ``sstore resume``."""
    message = mask_secrets(f"{type(exc).__name__}: {exc}")  # kept in the file, shown in status
    if decl.on_error is ErrorPolicy.DEAD_LETTER:
        _dead_letter(rt, decl, batch_id, inputs, message)
        log.error("procedure %s batch %s moved to dead letters: %s", decl.name, batch_id, message)
        return True
    con = rt.con
    con.begin()
    try:
        systables.record_error(con, decl.name, batch_id, "halt", message)
        systables.record_halt(con, decl.name, batch_id, message)
        con.commit()
    except BaseException:
        con.rollback()
        raise
    rt.scheduler.halted[decl.name] = systables.halt_text(batch_id, message)
    log.error("procedure %s halted at batch %s: %s", decl.name, batch_id, message)
    return False


def _dead_letter(rt: Runtime, decl: ProcedureDecl, batch_id: int, inputs: dict[str, pa.Table],
                 message: str) -> None:
    """Keep the failed input batch, commit empty outputs so downstream learns b is done."""
    con = rt.con
    pending = PendingCommit()
    con.begin()
    try:
        for node, table in inputs.items():
            if not table.num_columns:
                continue
            with registered(con, "sstore_dead", table):
                # created from the batch's rows the first time (DuckDB 2.0.0 loses the rows of
                # a table created empty and filled in one transaction: see append_or_create)
                append_or_create(con, node + "__dead_letter",
                                 "SELECT ?::BIGINT AS _batch_id, ?::VARCHAR AS _procedure, "
                                 "?::VARCHAR AS _error, * FROM sstore_dead",
                                 [batch_id, decl.name, message])
        for stream in decl.outputs:
            schema = rt.store.schema(stream)
            empty = schema.empty_table() if schema is not None else pa.table({})
            rt.store.append(stream, batch_id, empty, pending)
        pending.records.append((decl.name, batch_id, 0))
        systables.insert_commits(con, pending.records)
        systables.record_error(con, decl.name, batch_id, "dead_letter", message)
        con.commit()
    except BaseException:
        con.rollback()
        rt.store.forget(pending)
        raise
    rt.te_seq += 1
    note_te(rt, decl.name, batch_id, None)
    rt.finish(pending)


def note_te(rt: Runtime, procedure: str, batch_id: int, tx: Transaction | None) -> None:
    """Weak durability: tell the input log what this committed TE did (``sstore.base.digest``;
    ``tx`` None: the batch was dead-lettered), for replay to check."""
    if rt.input_log is not None:
        rt.input_log.note_te(procedure, batch_id,
                             digest.te(procedure, batch_id, tx._digest() if tx else 1))
