"""What stream evolutions (``sstore.storage.evolution``) and procedure switches
(``sstore.storage.upgrades``)
share: their version tables are made on first use, and a start's changes commit in one DuckDB
transaction with their records, before anything runs."""

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
    """The body runs in one transaction, committed after crash point ``point`` or rolled back
    whole; refused first (``DeclarationError``: "``what`` now: why") when ``blocked`` says
    why it cannot happen now (weak durability with batches in its input log)."""
    reason = blocked() if blocked is not None else None
    if reason is not None:
        raise DeclarationError(f"{what} now: {reason}")
    con.execute(ddl)
    con.begin()
    try:
        yield
        crash_point(point)
        con.commit()
    except BaseException:
        con.rollback()
        raise
