"""The handle a stored procedure or an ad hoc OLTP block gets: SQL inside one DuckDB transaction.

The transaction's life is a small state machine (``TxState``); every operation asks ``_require``
first, so a handle kept past its commit cannot silently write outside a transaction.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from sstore.base import digest, volatile
from sstore.base.duck import LARGE_ROWS, arrow, execute
from sstore.base.errors import TransactionStateError
from sstore.base.sql import bind
from sstore.dataflow import stream_writes
from sstore.execution import passing


class TxState(enum.Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"


_ALLOWED = {
    "use": {TxState.OPEN},
    "commit": {TxState.OPEN},
    "rollback": {TxState.OPEN},
}


class Transaction:
    """SQL inside one transaction execution (TE) or one ad hoc transaction.

    ``batch_id`` is the batch being processed (``None`` for ad hoc transactions); ``procedure`` the
    procedure's name. In a TE, the input batch is the relation ``batch`` (one input) or
    ``<stream>_batch`` for each input stream (several inputs).
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, batch_id: int | None = None,
                 procedure: str | None = None,
                 recorder: Callable[[str, Any], None] | None = None, rows_in: int = 0, *,
                 streams: frozenset[str],
                 before: Callable[[str], None] | None = None, digests: bool = False) -> None:
        self._con = con
        #: called with each statement before it runs: a group commit stores a batch it
        #: passes in memory when the statement may read it from its table
        #: (``sstore.execution.passing``)
        self._before = before
        #: weak durability: one digest per statement run, and of the outputs
        #: (``sstore.base.digest``), that the input log records and replay compares; None: not kept
        self.digests: list[int] | None = [] if digests else None
        #: stream tables this transaction's SQL must not write (``sstore.dataflow.stream_writes``);
        #: no default, so that no path that hands out a transaction can forget them
        self._streams = streams
        self._who = f"procedure {procedure!r}" if procedure else "this transaction"
        #: a TE over a large input batch likely returns large results: convert them streamed
        #: (``sstore.base.duck.arrow``)
        self._large = rows_in >= LARGE_ROWS
        self.batch_id = batch_id
        self.procedure = procedure
        self._state = TxState.OPEN
        self._recorder = recorder
        self._registered: list[str] = []
        #: the first statement error of this transaction, even if the caller caught it: DuckDB
        #: aborts the transaction on any failed statement, and its COMMIT then rolls back
        #: without a word, so the engine must refuse to report such a transaction committed
        self.failure: BaseException | None = None

    @property
    def state(self) -> TxState:
        return self._state

    def _require(self, action: str) -> None:
        if self._state not in _ALLOWED[action]:
            raise TransactionStateError(f"cannot {action} a transaction that is "
                                        f"{self._state.value}")

    def _move(self, action: str, to: TxState) -> None:
        self._require(action)
        self._state = to

    # -- what procedures call ------------------------------------------------------------------
    def sql(self, query: str, *args: Any,
            params: Sequence[Any] | Mapping[str, Any] | None = None) -> pa.Table:
        """Run a query and return its rows as an Arrow table."""
        self._require("use")
        self._check(query)
        bound = bind(args, params)
        if self._recorder is not None:
            self._recorder(query, bound)
        with self._watch():
            found = arrow(self._con, query, bound, large=self._large)
        if self.digests is not None:
            self.digests.append(digest.statement(query, bound, digest.answer_of_table(found)))
        return found

    query = sql

    def execute(self, statement: str, *args: Any,
                params: Sequence[Any] | Mapping[str, Any] | None = None) -> None:
        """Run a statement for its effect (INSERT, UPDATE, DELETE, DDL)."""
        self._require("use")
        self._check(statement)
        bound = bind(args, params)
        if self._recorder is not None:
            self._recorder(statement, bound)
        with self._watch():
            answer = execute(self._con, statement, bound)
            found = answer.fetchall()  # DuckDB wants every result consumed
        if self.digests is not None:
            self.digests.append(digest.statement(statement, bound,
                                                 digest.answer_of(found, _names(answer))))

    def fetchall(self, query: str, *args: Any,
                 params: Sequence[Any] | Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a query and return its rows as Python tuples (handy for small lookups)."""
        self._require("use")
        self._check(query)
        bound = bind(args, params)
        if self._recorder is not None:
            self._recorder(query, bound)
        with self._watch():
            answer = execute(self._con, query, bound)
            found = answer.fetchall()
        if self.digests is not None:
            self.digests.append(digest.statement(query, bound,
                                                 digest.answer_of(found, _names(answer))))
        return found

    def fetchone(self, query: str, *args: Any,
                 params: Sequence[Any] | Mapping[str, Any] | None = None) -> tuple[Any, ...] | None:
        rows = self.fetchall(query, *args, params=params)
        return rows[0] if rows else None

    def _check(self, statement: str) -> None:
        """What every statement passes before it runs: it must not write a stream's table
        (``sstore.dataflow.stream_writes``), under weak durability it must write the same at replay
        (``sstore.base.volatile``), and a batch it may read must be in its table
        (``sstore.execution.passing``)."""
        stream_writes.check(statement, self._streams, self._who)
        if self.digests is not None:  # weak durability: it must write the same at replay
            volatile.check(statement, self.procedure)
        passing.note(statement)
        if self._before is not None:
            self._before(statement)

    def register(self, name: str, table: pa.Table) -> None:
        """Make an Arrow table the SQL relation ``name`` until this transaction ends."""
        self._require("use")
        if self._recorder is not None:
            raise TransactionStateError("register is not available in ad hoc transactions of a "
                                        "weak-durability engine: the table would not be logged")
        self._con.register(name, table)
        self._registered.append(name)

    @contextlib.contextmanager
    def _watch(self) -> Iterator[None]:
        try:
            yield
        except duckdb.Error as exc:
            if self.failure is None:
                self.failure = exc
            raise

    # -- what the engine calls -----------------------------------------------------------------
    def _note_outputs(self, outputs: Mapping[str, pa.Table]) -> None:
        """A TE's output batches join its digest (weak durability only)."""
        if self.digests is not None:
            self.digests.append(digest.outputs(outputs))

    def _digest(self) -> int:
        """Everything this transaction's digests say, as one number (0: none kept)."""
        acc = 0
        for one in self.digests or ():
            acc = digest.combine(acc, one)
        return acc

    def _mark_committed(self) -> None:
        self._move("commit", TxState.COMMITTED)
        self._release()

    def _mark_rolled_back(self) -> None:
        self._move("rollback", TxState.ROLLED_BACK)
        self._release()

    def _release(self) -> None:
        for name in self._registered:
            try:
                self._con.unregister(name)
            except duckdb.Error:
                pass
        self._registered.clear()


def _names(answer: duckdb.DuckDBPyConnection) -> list[str]:
    """The column names of a statement's answer (for ``sstore.base.digest.answer_of``)."""
    return [d[0] for d in answer.description or ()]
