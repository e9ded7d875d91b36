"""Ad hoc access to the state, outside the streams' transactions: statements (DDL, seed data),
read-only queries on the reader cursor, ACID transactions serializable with the transaction
executions (and their replay from the input log), bulk loads of Arrow rows into tables.

The engine's public methods (``Engine.execute``, ``query``, ``query_rows``, ``transaction``,
``load_table``) check their arguments and call these with the runtime or connection explicitly.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import duckdb
import pyarrow as pa

from sstore.base.duck import registered, rollback_after_failure
from sstore.base.errors import ReplayMismatchError, TransactionStateError
from sstore.base.rows import conform_columns
from sstore.base.sql import ident, qualified
from sstore.dataflow import stream_writes
from sstore.dataflow.graph import Graph
from sstore.dataflow.table_declarations import is_same_redeclaration, split_statements
from sstore.execution import passing
from sstore.execution.runtime import Runtime
from sstore.execution.transaction import Transaction
from sstore.storage import systables
from sstore.storage.inputlog import LogRecord

log = logging.getLogger("sstore")
T = TypeVar("T")


def execute_statements(con: duckdb.DuckDBPyConnection, statement: str, bound: Any,
                       rt: Runtime | None, graph: Graph) -> None:
    """``Engine.execute``'s statements, each on its own (caller holds the engine's lock): a
    table declared again the same way, or another CREATE whose object exists, is skipped.
    None runs if any writes a stream's table (``sstore.dataflow.stream_writes``)."""
    parts = [statement] if bound is not None else split_statements(con, statement)
    writing = [part for part in parts if stream_writes.may_write(part)]
    if writing:
        streams = stream_tables(con, rt, graph)
        for part in writing:
            stream_writes.check(part, streams, "Engine.execute")
    for part in parts:
        passing.note(part)  # a view may change: ``sstore.execution.passing`` reads them again
        if is_same_redeclaration(con, part):
            log.debug("table declaration already in the state file: %s", part)
            continue
        try:
            con.execute(part, bound)
        except duckdb.CatalogException as exc:
            if not (part.lstrip()[:6].upper() == "CREATE" and "already exists" in str(exc)):
                raise
            log.debug("declaration already in the state file: %s", exc)


def stream_tables(con: duckdb.DuckDBPyConnection, rt: Runtime | None, graph: Graph
                  ) -> frozenset[str]:
    """The tables ad hoc SQL may not write: the started engine's streams; before the start,
    those declared so far and those the last program declared (their tables exist already)."""
    if rt is not None:
        return rt.stream_tables
    return (stream_writes.stream_tables(graph)
            | stream_writes.saved_stream_tables(systables.load_graph(con)))


def read_committed(rt: Runtime, bound: Any,
                   run: Callable[[duckdb.DuckDBPyConnection, Any], T]) -> T:
    """``run`` on the reader cursor in a READ ONLY transaction (the query already checked)."""
    # the engine's reader cursor, a connection of its own: DuckDB's MVCC gives it a
    # snapshot of what has committed while the engine's transactions go on, so a sink
    # reading its batches does not wait for the next batch's TEs, nor they for it
    with rt.reader_lock:
        cursor = rt.reader
        assert cursor is not None, "set when the engine starts"
        cursor.execute("BEGIN TRANSACTION READ ONLY")
        try:
            found = run(cursor, bound)  # an Arrow table's size unknown: streamed
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
        cursor.execute("COMMIT")
        return found


@contextlib.contextmanager
def transaction(rt: Runtime, log_it: bool) -> Iterator[Transaction]:
    """Commit protocol of an ad hoc transaction:

    1. BEGIN.
    2. The block's statements (recorded, in weak durability).
    3. If any statement failed, even one whose error the block caught, ROLLBACK and raise
       ``TransactionStateError``: DuckDB aborted the transaction at that statement and its
       COMMIT would roll back without a word.
    4. Weak durability: append the statements to the input log, fsync.
    5. COMMIT (on failure: ROLLBACK and cut the log record off again).
    """
    statements: list[tuple[str, Any]] = []
    recorder = (lambda sql, params: statements.append((sql, params))) if log_it else None
    with rt.lock:
        tx = Transaction(rt.con, recorder=recorder, streams=rt.stream_tables,
                         digests=rt.input_log is not None)
        logged: int | None = None
        rt.con.begin()
        try:
            yield tx
            if tx.failure is not None:
                raise TransactionStateError(
                    f"a statement of this transaction failed ({tx.failure}) and the error "
                    f"was caught inside the block; DuckDB aborted the transaction, so "
                    f"nothing was committed") from tx.failure
            if log_it and statements and rt.input_log is not None:
                logged = rt.input_log.append_oltp(statements, rt.te_seq, tx.digests)
            rt.con.commit()
            tx._mark_committed()
        except BaseException:
            rollback_after_failure(rt.con)
            if logged is not None and rt.input_log is not None:
                rt.input_log.undo(logged)
            tx._mark_rolled_back()
            raise
        checkpoint_if_due(rt)


def replay_oltp(rt: Runtime, record: LogRecord) -> None:
    """Run an ad hoc transaction of the input log again (``recovery.replay``), not logging it,
    and refuse it (``ReplayMismatchError``, rolled back) if a statement answers otherwise than
    live (``sstore.base.digest``: the row count of an INSERT, UPDATE or DELETE)."""
    with transaction(rt, log_it=False) as tx:
        for i, (sql, params) in enumerate(record.statements or [], start=1):
            tx.execute(sql, params=params)
            live, replayed = record.digests, tx.digests
            if live is not None and replayed is not None and live[i - 1] != replayed[-1]:
                raise ReplayMismatchError(
                    f"record {record.lsn}: ad hoc transaction of {len(live)} statement(s), "
                    f"statement {i} ({sql.strip()[:80]!r}) did not do at replay what it did "
                    f"live (another row count: it read what the input log does not hold, "
                    f"e.g. rows garbage collection or load_table changed, or called random() "
                    f"or the clock); weak durability replays only deterministic transactions "
                    f"(docs/engine.md, \"Durability modes\"), so the engine refuses to start "
                    f"from a state other than the one committed live. The snapshot and the "
                    f"log are untouched")


def load_rows(rt: Runtime, table: str, rows: pa.Table, mode: str, key: Sequence[str]) -> None:
    """``Engine.load_table``'s transaction (``mode`` and ``key`` already checked): create the
    table if missing, empty it for "replace", then INSERT (OR REPLACE, for "merge") the rows."""
    with rt.lock:
        rows = _conform_to_existing(rt.con, table, rows)
        _insert_rows(rt, table, rows, mode, key)
        checkpoint_if_due(rt)


def checkpoint_if_due(rt: Runtime) -> None:
    """After an ad hoc commit, the same checkpoint decision as after a TE or an ingest
    (``Checkpoints.after_commit``): DuckDB's own is off, so a WAL that only ad hoc work
    grows would otherwise grow without bound. Caller holds the lock, no transaction open."""
    if rt.checkpoints is not None:
        rt.checkpoints.after_commit()


def _conform_to_existing(con: duckdb.DuckDBPyConnection, table: str, rows: pa.Table
                         ) -> pa.Table:
    """Rows in the types of ``table``'s columns if it exists (``rows.conform_columns``)."""
    try:
        empty = con.execute(f"SELECT * FROM {qualified(table)} LIMIT 0").to_arrow_table()
    except duckdb.CatalogException:
        return rows
    assert empty is not None, "a SELECT answers a result set"
    return conform_columns(rows, empty.schema, f"table {table!r}")


def _insert_rows(rt: Runtime, table: str, rows: pa.Table, mode: str, key: Sequence[str]) -> None:
    verb = "INSERT OR REPLACE" if mode == "merge" else "INSERT"
    names = ", ".join(ident(c) for c in rows.column_names)
    insert = f"{verb} INTO {qualified(table)} ({names}) SELECT {names} FROM sstore_load"
    stream_writes.check(insert, rt.stream_tables, "Engine.load_table")
    with registered(rt.con, "sstore_load", rows):
        rt.con.begin()
        try:
            _create_like(rt.con, table, "sstore_load", key)
            if mode == "replace":
                rt.con.execute(f"DELETE FROM {qualified(table)}")
            rt.con.execute(insert)
            rt.con.commit()
        except BaseException:
            rt.con.rollback()
            raise


def _create_like(con: duckdb.DuckDBPyConnection, table: str, relation: str,
                 key: Sequence[str]) -> None:
    """CREATE TABLE IF NOT EXISTS with the relation's column types and ``key`` as primary key."""
    columns = con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()
    cols = ", ".join(f"{ident(name)} {ctype}" for name, ctype, *_ in columns)
    if key:
        cols += f", PRIMARY KEY ({', '.join(ident(k) for k in key)})"
    con.execute(f"CREATE TABLE IF NOT EXISTS {qualified(table)} ({cols})")
