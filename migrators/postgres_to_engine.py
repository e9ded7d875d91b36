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

from migrators import (
    pg_errors,  # noqa: F401 - registers PostgreSQL's retry classification
    reader,
)
from migrators.errors import (
    LateTiesError,
    MigrationError,
    PostgresUnavailable,
    UnsupportedTypeError,
)
from migrators.urls import parse, with_connect_timeout
from sstore.base import retry
from sstore.base.errors import DeclarationError
from sstore.base.readonly import check_query
from sstore.base.retry import RetryPolicy
from sstore.base.sql import ident, qualified
from sstore.engine import Engine


def read_postgres(url: str, sql: str, params: Sequence[Any] = (), *,
                  read_only: bool = True, policy: RetryPolicy | None = None,
                  what: str = "read from PostgreSQL") -> pa.Table:
    """Run a query in PostgreSQL and return its rows as Arrow. Parameters are ``$1, $2, ...``.

    ``read_only`` (the default: every caller reads) runs it in a READ ONLY transaction as the
    reader role (``migrators.reader``: logged in as it when the URL's password file allows),
    so SQL handed in from outside (``cross_system_query``, ``query=``) cannot write the
    warehouse, whatever it calls; the connection is closed without a commit either way.
    Transient failures (a server away or restarting) are retried by ``policy`` through the
    one retry helper: reads are idempotent. Each attempt connects with the same connect
    timeout as ``postgres.connect`` (without one, libpq waits for a silent address forever).
    ``what`` names the step in logs and in the error of a policy that gave up."""
    def attempt() -> pa.Table:
        # connect first, ask about the role after: a silent server then costs this client's
        # connect timeout once per attempt (psycopg, which ``ensure`` uses, waits 2 s at least)
        con = adbc.connect(with_connect_timeout(reader.reader_url(url) if read_only else url))
        try:
            if read_only:
                reader.ensure(url)
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

    ``read_only``: ``SET TRANSACTION READ ONLY`` and the reader role first
    (``migrators.reader.begin``: the caller has called ``reader.ensure``), so the transaction
    the query runs in cannot write, by privilege; the caller ends it (commit or rollback,
    both leave nothing behind)."""
    with con.cursor() as cur:
        if read_only:
            reader.begin(cur.execute)
        cur.execute(sql, parameters=tuple(params) if params else None)
        return _plain(cur.fetch_arrow_table())


#: PostgreSQL's earliest timestamp and date (4713-11-24 BC), in Arrow's units since 1970. ADBC
#: adds the 1970 -> 2000 epoch shift to PostgreSQL's values without an overflow check, so
#: 'infinity', '-infinity' and timestamps past 294246 AD arrive wrapped around to ~290,000 BC,
#: far below anything PostgreSQL can hold: such a value is refused, never loaded.
_EARLIEST = {"timestamp": -210866803200 * 1_000_000, "timestamptz": -210866803200 * 1_000_000,
             "date": -2440588}

#: PostgreSQL types whose Arrow form from ADBC is not the value: money arrives as its cents in
#: an int64 (12.34 -> 1234), and what ADBC does not know arrives as PostgreSQL's binary wire
#: encoding (inet, timetz, ranges, geometry, bit strings, xml). Refused with the cast that keeps
#: the value; a silent change of meaning is worse than a clear refusal.
_CAST_FIRST = {"money": "numeric"}


def _plain(table: pa.Table) -> pa.Table:
    """Drop ADBC's per-field metadata (the PostgreSQL type names) from the schema, turn
    ``numeric`` (which ADBC hands over as text) into Arrow decimals and ``oid`` (an int32 to
    ADBC) into uint32, and refuse the values ADBC does not carry intact (``_CAST_FIRST``,
    ``_EARLIEST``, opaque types) with an ``UnsupportedTypeError`` naming the column."""
    columns, fields = [], []
    for field, column in zip(table.schema, table.columns):
        metadata = field.metadata or {}
        pg_type = metadata.get(b"POSTGRESQL:type", b"").decode()
        if pg_type == "numeric":
            column = _numeric(column, int(metadata.get(b"POSTGRESQL:typmod", -1)))
        elif pg_type == "oid":
            column = pa.chunked_array([c.view(pa.uint32()) for c in column.chunks],
                                      pa.uint32())
        elif pg_type in _CAST_FIRST or isinstance(field.type, pa.BaseExtensionType) and \
                field.type.extension_name == "arrow.opaque":
            cast = _CAST_FIRST.get(pg_type, "text")
            raise UnsupportedTypeError(
                f"column {field.name!r} has PostgreSQL type {pg_type}, which does not reach "
                f"the engine unchanged; read it as {field.name}::{cast} in a query= instead")
        elif pg_type in _EARLIEST and column.null_count < len(column):
            _refuse_wrapped(field.name, pg_type, column)
        columns.append(column)
        fields.append(pa.field(field.name, column.type))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _refuse_wrapped(name: str, pg_type: str, column: pa.ChunkedArray) -> None:
    units = pa.int32() if pg_type == "date" else pa.int64()
    earliest = pc.min(pa.chunked_array([c.view(units) for c in column.chunks], units)).as_py()
    if earliest is not None and earliest < _EARLIEST[pg_type]:
        raise UnsupportedTypeError(
            f"column {name!r} ({pg_type}) holds 'infinity', '-infinity' or a value after "
            f"294246 AD, which Arrow cannot carry (it would arrive as a date around 290,000 "
            f"BC); replace it in a query= (e.g. NULLIF({name}, 'infinity') or "
            f"LEAST({name}, '9999-12-31'))")


def _numeric(column: pa.ChunkedArray, typmod: int) -> pa.ChunkedArray:
    """PostgreSQL numeric text as decimal128: numeric(p,s) keeps p and s (the type modifier
    is ((p << 16) | s) + 4); an unconstrained numeric gets the largest scale its values use,
    if every value's integer digits fit beside that scale in 38 digits (Arrow's rescaling
    cast wraps around instead of failing for some that do not: 12345678901234567890 at scale
    21 became 95513692080783205.3...). Values no decimal128 holds (NaN, more than 38 digits)
    leave the column as text."""
    text = column.cast(pa.string()) if not isinstance(column.type, pa.ExtensionType) else \
        pa.chunked_array([c.storage for c in column.chunks], pa.string())
    if typmod >= 4:
        precision, scale = (typmod - 4) >> 16, (typmod - 4) & 0xFFFF
    else:
        fractions = pc.utf8_length(pc.replace_substring_regex(text, r"^[^.]*\.?", ""))
        scale = pc.max(fractions).as_py() or 0
        whole = pc.replace_substring_regex(text, r"^-?0*([0-9]*).*$", r"\1")
        if (pc.max(pc.utf8_length(whole)).as_py() or 0) + scale > 38:
            return text
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
    one already in ``into`` are read: an incremental refresh. In merge mode "greater or equal":
    a row that ties with the newest one and was committed after the last refresh would
    otherwise never be read; append needs a ``since`` whose values are unique. Returns the
    number of rows read.
    ``retry``: how long a server that is away is tried (``read_postgres``'s ``policy``; default
    ``RetryPolicy()``, about 16 s), for callers that must fail sooner or wait longer.
    """
    if (table is None) == (query is None):
        raise DeclarationError("give exactly one of table= or query=")
    if query is not None:  # the early, friendly refusal; the reader role is the guarantee
        check_query(query, "postgres")
    source = qualified(table) if table is not None else f"({query}) AS q"
    sql, params = f"SELECT * FROM {source}", []
    if since is not None:
        if mode == "replace":
            raise DeclarationError("an incremental copy (since=) appends or merges; use "
                                   "mode='append' or mode='merge'")
        newest = _newest(engine, into, since)
        if newest is not None:  # merge re-reads rows that tie with the newest (see above)
            op = ">=" if mode == "merge" else ">"
            sql, params = f"SELECT * FROM {source} WHERE {ident(since)} {op} $1", [newest]
            if mode == "append":
                _refuse_late_ties(url, engine, source, into, since, newest, retry)
    rows = read_postgres(url, sql, params, policy=retry)
    return engine.load_table(into, rows, mode=mode, key=key)


def _refuse_late_ties(url: str, engine: Engine, source: str, into: str, since: str,
                      newest: Any, policy: RetryPolicy | None) -> None:
    """Rows at the source that tie with the newest ``since`` copied and came after that copy
    would never be read by an append (``table_to_postgres._refuse_late_ties``, the other
    direction): more of them at the source than in ``into`` is a ``LateTiesError``."""
    there = read_postgres(url, f"SELECT count(*) AS n FROM {source} WHERE {ident(since)} = $1",
                          [newest], policy=policy).column("n")[0].as_py()
    here = engine.query(f"SELECT count(*) AS n FROM {qualified(into)} WHERE {ident(since)} = ?",
                        params=[newest]).column("n")[0].as_py()
    if there > here:
        raise LateTiesError(f"copy into {into}", since, newest, there - here)


def _newest(engine: Engine, table: str, column: str) -> Any:
    exists = engine.query("SELECT count(*) AS n FROM information_schema.tables "
                          "WHERE table_name = ?", table.split(".")[-1]).column("n")[0].as_py()
    if not exists:
        return None
    return engine.query(f"SELECT max({ident(column)}) AS m FROM {qualified(table)}"
                        ).column("m")[0].as_py()
