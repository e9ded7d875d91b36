"""What stream evolutions (``sstore.storage.evolution``) and procedure switches
(``sstore.storage.upgrades``) share: their version tables are made on first use, and a start's
changes commit in ONE DuckDB transaction with their records and with the rest of the start
(``start_transaction``), before anything runs: a start that fails after an accepted
evolution (a refused event-window change, a crash) leaves neither the evolved table nor its
version record, so the program before it still starts on the file."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import duckdb

from sstore.base.errors import DeclarationError
from sstore.base.faults import crash_point


def has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether ``sstore_sys.<name>`` exists (a file that never changed has none; one opened
    read-only cannot get it)."""
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = "
                            "'sstore_sys' AND table_name = ?", [name]).fetchall()[0][0])


@contextlib.contextmanager
def one_change(con: duckdb.DuckDBPyConnection, ddl: str, what: str,
               blocked: Callable[[], str | None] | None, point: str) -> Iterator[None]:
    """The body runs in the start's open transaction (``start_transaction``), followed by
    crash point ``point``; refused first (``DeclarationError``: "``what`` now: why") when
    ``blocked`` says why it cannot happen now (weak durability with batches in its input
    log). An error rolls the whole start back."""
    reason = blocked() if blocked is not None else None
    if reason is not None:
        raise DeclarationError(f"{what} now: {reason}")
    con.execute(ddl)
    yield
    crash_point(point)


@contextlib.contextmanager
def start_transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Everything a start changes in the state file (evolutions and their records, procedure
    switches, new tables, windows, holds, the saved graph) in one transaction, committed after
    crash point ``start.before_commit`` or rolled back whole: either the start happened, or
    the file is as the last start left it."""
    con.begin()
    try:
        yield
        crash_point("start.before_commit")
        con.commit()
    except BaseException:
        con.rollback()
        raise
