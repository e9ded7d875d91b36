"""PostgreSQL -> engine: copy a table or a query result into a DuckDB state table, so that
stored procedures can look it up locally (fully, or incrementally by a column).

Reads go through ADBC's PostgreSQL driver, which streams a binary COPY straight into Arrow;
the rows land in the engine with one ``Engine.load_table`` transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import adbc_driver_postgresql.dbapi as adbc
import pyarrow as pa
import pyarrow.compute as pc

from migrators import pg_errors  # noqa: F401 - registers PostgreSQL's retry classification
from migrators.errors import MigrationError, PostgresUnavailable
from migrators.urls import parse, with_connect_timeout
from sstore import retry
from sstore.engine import Engine
from sstore.errors import DeclarationError
from sstore.retry import RetryPolicy
from sstore.sql import ident, qualified


def read_postgres(url: str, sql: str, params: Sequence[Any] = (), *,
                  read_only: bool = True, policy: RetryPolicy | None = None,
                  what: str = "read from PostgreSQL") -> pa.Table:
    """Run a query in PostgreSQL and return its rows as Arrow. Parameters are ``$1, $2, ...``.

    ``read_only`` (the default: every caller reads) runs it in a READ ONLY transaction, so SQL
    handed in from outside (``cross_system_query``, ``query=``) cannot write the warehouse;
    the connection is closed without a commit either way. Transient failures (a server away
    or restarting) are retried by ``policy`` through the one retry helper: reads are
    idempotent. Each attempt connects with the same connect timeout as ``postgres.connect``
    (without one, libpq waits for a silent address forever). ``what`` names the step in logs
    and in the error of a policy that gave up."""
    def attempt() -> pa.Table:
        con = adbc.connect(with_connect_timeout(url))
        try:
            return fetch_arrow(con, sql, params, read_only=read_only)
        finally:
            con.close()

    try:
        return retry.call(attempt, policy or RetryPolicy(), what)
    except retry.GaveUp as exc:
        raise PostgresUnavailable(f"PostgreSQL at {parse(url).redacted()}: {exc}") \
            from exc.__cause__
    except adbc.Error as exc:
        raise MigrationError(f"query failed in PostgreSQL: {exc}") from exc


def fetch_arrow(con: Any, sql: str, params: Sequence[Any] = (), *,
                read_only: bool = True) -> pa.Table:
    """Rows of ``sql`` on an open ADBC connection (in explicit-transaction mode) as Arrow.

    ``read_only``: ``SET TRANSACTION READ ONLY`` first, so the transaction the query runs in
    cannot write; the caller ends it (commit or rollback, both leave nothing behind)."""
    with con.cursor() as cur:
        if read_only:
            cur.execute("SET TRANSACTION READ ONLY")
        cur.execute(sql, parameters=tuple(params) if params else None)
        return _plain(cur.fetch_arrow_table())


def _plain(table: pa.Table) -> pa.Table:
    """Drop ADBC's per-field metadata (the PostgreSQL type names) from the schema, and turn
    ``numeric`` (which ADBC hands over as text) into Arrow decimals."""
    columns, fields = [], []
    for field, column in zip(table.schema, table.columns):
        if (field.metadata or {}).get(b"POSTGRESQL:type") == b"numeric":
            column = _numeric(column, int((field.metadata or {}).get(b"POSTGRESQL:typmod", -1)))
        columns.append(column)
        fields.append(pa.field(field.name, column.type))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _numeric(column: pa.ChunkedArray, typmod: int) -> pa.ChunkedArray:
    """PostgreSQL numeric text as decimal128: numeric(p,s) keeps p and s (the type modifier
    is ((p << 16) | s) + 4); an unconstrained numeric gets the largest scale its values use.
    Values no decimal128 holds (NaN, more than 38 digits) leave the column as text."""
    text = column.cast(pa.string()) if not isinstance(column.type, pa.ExtensionType) else \
        pa.chunked_array([c.storage for c in column.chunks], pa.string())
    if typmod >= 4:
        precision, scale = (typmod - 4) >> 16, (typmod - 4) & 0xFFFF
    else:
        fractions = pc.utf8_length(pc.replace_substring_regex(text, r"^[^.]*\.?", ""))
        scale = pc.max(fractions).as_py() or 0
        precision = 38
    try:
        return text.cast(pa.decimal128(precision, scale))
    except (pa.ArrowInvalid, ValueError):
        return text


def copy_into_engine(url: str, engine: Engine, *, into: str, table: str | None = None,
                     query: str | None = None, mode: str = "replace", key: Sequence[str] = (),
                     since: str | None = None, retry: RetryPolicy | None = None) -> int:
    """Copy ``table`` (or the rows of ``query``) into the engine table ``into``.

    ``mode``: "replace" (a full copy), "append" or "merge" (by ``key``). With ``since`` (a key
    or timestamp column that only grows), only rows whose ``since`` is greater than the largest
    one already in ``into`` are read: an incremental refresh. Returns the number of rows read.
    ``retry``: how long a server that is away is tried (``read_postgres``'s ``policy``; default
    ``RetryPolicy()``, about 16 s), for callers that must fail sooner or wait longer.
    """
    if (table is None) == (query is None):
        raise DeclarationError("give exactly one of table= or query=")
    source = qualified(table) if table is not None else f"({query}) AS q"
    sql, params = f"SELECT * FROM {source}", []
    if since is not None:
        if mode == "replace":
            raise DeclarationError("an incremental copy (since=) appends or merges; use "
                                   "mode='append' or mode='merge'")
        newest = _newest(engine, into, since)
        if newest is not None:
            sql, params = f"SELECT * FROM {source} WHERE {ident(since)} > $1", [newest]
    rows = read_postgres(url, sql, params, policy=retry)
    return engine.load_table(into, rows, mode=mode, key=key)


def _newest(engine: Engine, table: str, column: str) -> Any:
    exists = engine.query("SELECT count(*) AS n FROM information_schema.tables "
                          "WHERE table_name = ?", table.split(".")[-1]).column("n")[0].as_py()
    if not exists:
        return None
    return engine.query(f"SELECT max({ident(column)}) AS m FROM {qualified(table)}"
                        ).column("m")[0].as_py()
