"""Read-only access to a state file that no engine in this process has open.

``sstore status`` and ``sstore query`` inspect a state file from the outside, possibly while
nothing runs on it, possibly while a crashed run left it behind. DuckDB's own errors for the
common problems (no such file, another process holds the lock, not a DuckDB file, a DuckDB file
that sstore never used) are precise but cryptic; this module turns them into one
``StateFileError`` whose message says what is wrong and what to do.

Reading cannot write, by construction: the connection is DuckDB read-only with external access
off (no COPY TO, read_text, ATTACH or INSTALL, whatever the SQL), and every query is first
checked to be a plain query (``sstore.base.readonly``), so a refused statement gets a message that
names it instead of a DuckDB error.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from sstore.base.duck import arrow, connect
from sstore.base.errors import TerminalError
from sstore.base.readonly import check_query
from sstore.base.sql import bind, literal
from sstore.storage.status import EngineStatus, status_of_file


class StateFileError(TerminalError):
    """A state file cannot be opened for reading, or is not an sstore state file."""


class StateFileLockedError(StateFileError):
    """Another process holds the state file (DuckDB's lock): ``holder`` is its PID, 0 when
    DuckDB does not name it. If that process serves, ``sstore.observe.live.file_status`` asks
    it over HTTP instead (the core does not: it never imports ``sstore.observe``)."""

    def __init__(self, message: str, holder: int) -> None:
        super().__init__(message)
        self.holder = holder


def explain(path: str, exc: duckdb.Error) -> StateFileError:
    """The ``StateFileError`` that says in plain words why DuckDB could not use ``path``."""
    text = str(exc)
    pid = _lock_holder(exc)
    if pid is not None:
        holder = f" (PID {pid})" if pid else ""
        return StateFileError(f"{path} is in use by another process{holder}: DuckDB lets one "
                              f"process write a file and nobody else read it meanwhile; stop "
                              f"that process, or query it through its engine")
    if isinstance(exc, duckdb.ConnectionException):
        return StateFileError(f"{path} is already open for writing in this process; use that "
                              f"engine's status() or query() instead")
    if "not a valid DuckDB database" in text:
        return StateFileError(f"{path} is not a DuckDB database file")
    if isinstance(exc, duckdb.CatalogException) and "sstore_sys" in text:
        return StateFileError(f"{path} is a DuckDB database but not an sstore state file "
                              f"(it has no sstore_sys schema)")
    if "database does not exist" in text:
        return StateFileError(f"no state file at {path}")
    return StateFileError(f"cannot read {path}: {text}")


def _check_exists(path: str) -> None:
    if not os.path.exists(path):
        hint = "" if os.path.isabs(path) else f" (looked in {os.getcwd()})"
        raise StateFileError(f"no state file at {path}{hint}")
    if os.path.isdir(path):
        raise StateFileError(f"{path} is a directory, not a state file")


def open_read_only(path: str) -> duckdb.DuckDBPyConnection:
    """A read-only connection, external access off, to the sstore state file at ``path``;
    the caller closes it."""
    _check_exists(path)
    try:
        con = connect(path, read_only=True, external_access=False)
    except duckdb.Error as exc:
        raise explain(path, exc) from None
    try:
        con.execute("SELECT count(*) FROM sstore_sys.commits").fetchall()
    except duckdb.CatalogException as exc:
        con.close()
        raise explain(path, exc) from None
    return con


@contextlib.contextmanager
def read_only(path: str) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection to the state file at ``path`` (closed on exit)."""
    con = open_read_only(path)
    try:
        yield con
    finally:
        con.close()


class StateFileReader:
    """Queries over a state file kept open read-only (the polystore's view of an engine that
    runs elsewhere or not at all): ``query`` has ``Engine.query``'s signature, and nothing
    here can write the file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._con = open_read_only(path)

    def query(self, sql: str, *args: Any,
              params: Sequence[Any] | Mapping[str, Any] | None = None,
              time_zone: str | None = None) -> pa.Table:
        """On a cursor of its own: a plan's fetches run in parallel threads, and two of them
        on the one connection failed at random ("connection is busy"). ``time_zone``: the
        session's (a cursor's own setting), so timestamptz values are shown, cut and cast as
        in that zone (the polystore passes PostgreSQL's)."""
        cursor = self._con.cursor()
        try:
            if time_zone:
                cursor.execute(f"SET TimeZone = {literal(time_zone)}")
            return run_query(cursor, sql, args, params)
        finally:
            cursor.close()

    def query_rows(self, sql: str, *args: Any,
                   params: Sequence[Any] | Mapping[str, Any] | None = None
                   ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """``Engine.query_rows``: a small answer as (column names, Python rows)."""
        check_query(sql, "duckdb")
        cursor = self._con.execute(sql, bind(args, params))
        return [d[0] for d in cursor.description or ()], cursor.fetchall()

    def close(self) -> None:
        self._con.close()
SERVE_HINT = ("to read its status while it runs, start it with --serve PORT (sstore demo, "
              "sstore tpcdi run, sstore tpcdi demo) or call sstore.observe.serve(engine) in "
              "its program")


def file_status(path: str) -> EngineStatus:
    """``sstore.storage.status.status_of_file`` with readable errors. A file another process holds
    raises ``StateFileLockedError``; ``sstore.observe.live.file_status`` (what ``sstore
    status`` calls) then asks that process over HTTP if it serves."""
    _check_exists(path)
    try:
        return status_of_file(path)
    except duckdb.Error as exc:
        error = explain(path, exc)
        holder = _lock_holder(exc)
        if holder is None:
            raise error from None
        raise StateFileLockedError(f"{error}; {SERVE_HINT}", holder) from None


def _lock_holder(exc: duckdb.Error) -> int | None:
    """For DuckDB's lock error: the PID holding the lock (0 when DuckDB does not name it);
    None for any other error."""
    text = str(exc)
    if "Conflicting lock" not in text and "Could not set lock" not in text:
        return None
    pid = re.search(r"PID (\d+)", text)
    return int(pid.group(1)) if pid else 0


def query_file(path: str, sql: str, *args: Any,
               params: Sequence[Any] | Mapping[str, Any] | None = None) -> pa.Table:
    """Run one read-only query over a state file; return its rows as an Arrow table.

    Anything but a plain query is refused before the file is opened (``ReadOnlyQueryError``);
    a query that fails in DuckDB raises DuckDB's error (a ``duckdb.Error``, left as it is: it
    is about the SQL, not the file).
    """
    with read_only(path) as con:
        return run_query(con, sql, args, params)


def run_query(con: duckdb.DuckDBPyConnection, sql: str, args: tuple[Any, ...],
              params: Sequence[Any] | Mapping[str, Any] | None) -> pa.Table:
    """``sql``, checked to be a plain query, on a read-only connection, as Arrow."""
    check_query(sql, "duckdb")
    return arrow(con, sql, bind(args, params), large=True)
