"""DuckDB helpers: Arrow tables visible to SQL for the length of a block, query results as
Arrow with one planning of the statement, and a ROLLBACK after a failure that keeps its error."""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

# ``con.sql(q).to_arrow_table()``, the form DuckDB 2.x recommends, binds the statement to build
# a relation and binds and plans it again to run it: 2-4 ms per statement here whatever the
# batch size (SP1 of TPC-DI: 8.7 ms that way, 6.0 ms via ``execute``, for 251 lines). The DB-API
# form runs it once but materializes the result before converting it: cheaper up to ~25,000
# rows (38 vs 34 ms), dearer from ~100,000 (SP1 over 100,000 lines: 198 ms vs 292). ``arrow``
# takes the DB-API form unless told the result is large; its advice warning is silenced for
# that message only.
warnings.filterwarnings("ignore", message="Arrow output on a DB-API result makes an extra copy",
                        category=UserWarning)

# DuckDB's Python client resolves unknown table names to Python variables of the calling frame
# (a "replacement scan"). Inside an engine that would let a procedure's local variable shadow a
# state table, so every connection sstore opens turns it off; Arrow data is registered by name.
CONFIG = {"python_enable_replacements": False}


def connect(path: str, read_only: bool = False, external_access: bool = True
            ) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection configured the way sstore needs it.

    ``external_access=False`` is for connections that only answer queries (a state file read
    from outside, the polystore's island): DuckDB then refuses every file, extension and
    network access (COPY TO, read_text, ATTACH, INSTALL), whatever the SQL says, and the
    setting cannot be switched back on while the database is open. The engine's own
    connection keeps it: weak durability ATTACHes its snapshot files."""
    config: dict[str, str | bool | int | float | list[str]] = dict(CONFIG)
    if not external_access:
        config["enable_external_access"] = False
    threads = threads_setting()
    if threads is not None:
        config["threads"] = threads
    return duckdb.connect(path, read_only=read_only, config=config)


#: DuckDB's worker threads for every connection sstore opens (unset: DuckDB's default, one
#: per core). One thread spends 10-20% less CPU on small batches (measured on DimTrade's
#: 100-trade batches: no second worker to start and hand work to) and gives up the
#: parallelism of large ones; on a machine whose cores are busy anyway the CPU is what counts
#: (docs/tpcdi.md, issue 37).
THREADS_VARIABLE = "SSTORE_DUCKDB_THREADS"


def threads_setting() -> int | None:
    """``SSTORE_DUCKDB_THREADS`` as a thread count (None: unset or empty); anything but a
    whole number >= 1 is refused, not guessed."""
    text = os.environ.get(THREADS_VARIABLE, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{THREADS_VARIABLE} must be a whole number >= 1, not {text!r}")
    return int(text)


@contextlib.contextmanager
def registered(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table,
               keep: bool = False) -> Iterator[None]:
    """Make ``table`` the relation ``name`` inside the block.

    ``keep=True`` leaves it registered afterwards: on the hot path of a transaction execution
    an unregister costs half a millisecond, and the next ``register`` of the name replaces it.
    Unregistering fails inside an aborted transaction; the name is then left registered until
    the next ``registered`` call replaces it, so the original error is the one that surfaces.
    """
    con.register(name, table)
    try:
        yield
    finally:
        if not keep:
            try:
                con.unregister(name)
            except duckdb.Error:
                pass


LARGE_ROWS = 50_000  # from about here on, a streamed conversion beats planning once

# DuckDB parses a statement's text again on every ``execute``; given a parsed statement
# (``extract_statements``) it copies that instead. A TE runs the same texts batch after batch
# (a procedure's SQL, a chain of them, the stream appends and commit records), so they are
# parsed once: measured over 251 TPC-DI lines, the chained SP1-SP4 statement 10.8 -> 9.0 ms
# and SP5's MERGE 8.7 -> 7.8 ms, about 8% of a 100-trade batch. A parsed statement holds no
# catalog state (names bind at each execution) and is copied per use, so one serves every
# connection and thread. Bounded: ad hoc queries are texts too.
PARSED_LIMIT = 512
_parsed: dict[str, duckdb.Statement] = {}
_parsed_lock = threading.Lock()


def parsed(con: duckdb.DuckDBPyConnection, query: str) -> duckdb.Statement | str:
    """``query`` as a parsed statement, parsed on its first use; the text itself when it is
    a script of several statements (those run as the text, each in turn). A syntax error
    raises here, as ``execute`` would raise it."""
    statement = _parsed.get(query)
    if statement is not None:
        return statement
    statements = con.extract_statements(query)
    if len(statements) != 1:
        return query
    with _parsed_lock:
        if len(_parsed) >= PARSED_LIMIT:
            del _parsed[next(iter(_parsed))]  # the oldest first (dicts keep insertion order)
        _parsed[query] = statements[0]
    return statements[0]


def execute(con: duckdb.DuckDBPyConnection, query: str,
            params: Sequence[Any] | Mapping[str, Any] | None = None
            ) -> duckdb.DuckDBPyConnection:
    """``con.execute`` of a text that runs again and again, parsed once (``parsed``)."""
    return con.execute(parsed(con, query), params)


def arrow(con: duckdb.DuckDBPyConnection, query: str,
          params: Sequence[Any] | Mapping[str, Any] | None = None, *,
          large: bool = False) -> pa.Table:
    """Run ``query`` (parameters bound) and return its rows as an Arrow table: planned once,
    or, for a ``large`` result, converted as DuckDB streams it (see the note above)."""
    if large:
        return con.sql(query, params=params).to_arrow_table()
    return execute(con, query, params).to_arrow_table()


def rollback_after_failure(con: duckdb.DuckDBPyConnection) -> None:
    """ROLLBACK after a failure; a failed COMMIT has already ended the transaction, and that
    second error must not hide the first."""
    try:
        con.rollback()
    except duckdb.TransactionException:
        pass
