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

On an exception: ROLLBACK; a ``TransientError`` is retried with backoff up to P's ``retries``;
any other error (or the last retry) applies P's error policy (see ``ErrorPolicy``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import duckdb
import pyarrow as pa

from sstore import systables
from sstore.duck import registered
from sstore.errors import ProcedureError, SStoreError, TransientError
from sstore.faults import crash_point
from sstore.graph import ErrorPolicy, ProcedureDecl
from sstore.runtime import CommitEvent, Runtime
from sstore.streams import PendingCommit, append_or_create
from sstore.transaction import Transaction

log = logging.getLogger("sstore")

BACKOFF_SECONDS = 0.05


def run_te(rt: Runtime, name: str, batch_id: int) -> bool:
    """Run procedure ``name`` on ``batch_id``. True if the batch is done (committed or
    dead-lettered), False if the procedure halted. Caller holds ``rt.lock``."""
    decl = rt.graph.procedures[name]
    inputs = {node: rt.input_batch(node, batch_id) for node in decl.inputs}  # step 1
    attempt = 0
    while True:
        try:
            _attempt(rt, decl, batch_id, inputs)
            return True
        except Exception as exc:  # noqa: BLE001 - every failure is classified below
            transient = isinstance(exc, (TransientError, duckdb.TransactionException))
            if transient and attempt < decl.retries:
                attempt += 1
                log.warning("procedure %s batch %s: transient failure (%s), retry %d/%d",
                            name, batch_id, exc, attempt, decl.retries)
                time.sleep(BACKOFF_SECONDS * 2 ** (attempt - 1))
                continue
            return _fail(rt, decl, batch_id, inputs, exc)


def _attempt(rt: Runtime, decl: ProcedureDecl, batch_id: int, inputs: dict[str, pa.Table]) -> None:
    con = rt.con
    pending = PendingCommit()
    _register_inputs(con, inputs)  # left registered: the next execution's register replaces it
    tx = Transaction(con, batch_id, decl.name)
    began = time.perf_counter()
    con.begin()  # step 2
    try:
        result = decl.fn(tx, inputs[decl.inputs[0]] if len(inputs) == 1 else dict(inputs))  # 3
        outputs = _outputs(rt, decl, batch_id, result)  # step 4
        for stream, table in outputs.items():  # step 5
            rt.store.append(stream, batch_id, table, pending)
        pending.records.append((decl.name, batch_id, sum(t.num_rows for t in outputs.values())))
        systables.insert_commits(con, pending.records)  # step 6
        crash_point("te.before_commit")
        con.commit()  # step 7
        tx._mark_committed()
    except BaseException:
        con.rollback()
        tx._mark_rolled_back()
        rt.store.forget(pending)
        raise
    crash_point("te.after_commit")
    rt.te_seq += 1
    rt.since_gc += 1
    rt.finish(pending)  # step 8
    if rt.observers:
        now = time.perf_counter()
        rt.observe(CommitEvent("te", decl.name, batch_id, pending.records[-1][2], now,
                               sum(t.num_rows for t in inputs.values()), now - began))


def _register_inputs(con: duckdb.DuckDBPyConnection, inputs: dict[str, pa.Table]) -> None:
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


def _outputs(rt: Runtime, decl: ProcedureDecl, batch_id: int, result: Any) -> dict[str, pa.Table]:
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
          exc: BaseException) -> bool:
    message = f"{type(exc).__name__}: {exc}"
    if decl.on_error is ErrorPolicy.DEAD_LETTER and isinstance(exc, Exception):
        _dead_letter(rt, decl, batch_id, inputs, message)
        log.error("procedure %s batch %s moved to dead letters: %s", decl.name, batch_id, message)
        return True
    systables.record_error(rt.con, decl.name, batch_id, "halt", message)
    rt.scheduler.halted[decl.name] = f"batch {batch_id}: {message}"
    log.error("procedure %s halted at batch %s: %s", decl.name, batch_id, message)
    if not isinstance(exc, (Exception, SStoreError)):
        raise exc  # KeyboardInterrupt and friends still stop the process
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
    rt.finish(pending)
