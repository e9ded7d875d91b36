"""The paper's three ways for a streaming query to reach data that lives in PostgreSQL
(section III.C), each an explicit choice with its own cost:

- ``cross_system_query``: read it each time, keep nothing. No staleness, no storage; pays the
  round trip on every use.
- ``Replica``: keep a copy in the engine and refresh it (fully, or incrementally by a growing
  column). Lookups are local and cheap; the copy is as fresh as its last refresh.
- ``migrate_to_engine``: move rows into the engine and remove them from PostgreSQL, but only
  after the engine has committed them (merge by key makes a repeated move harmless, so a crash
  between the two steps neither loses nor duplicates a row; the removal takes only the row
  versions that were read, so a retried removal or a concurrent change loses nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from migrators.postgres import RetryPolicy, copy_arrow, with_retries
from migrators.postgres_to_engine import copy_into_engine, read_postgres
from sstore.base.errors import DeclarationError
from sstore.base.readonly import check_query
from sstore.base.sql import ident, qualified
from sstore.engine import Engine


def cross_system_query(url: str, sql: str, *params: Any,
                       retry: RetryPolicy | None = None) -> pa.Table:
    """Run ``sql`` in PostgreSQL now (parameters ``$1, $2, ...``); nothing is kept. A server
    that is away is tried again by ``retry`` (default ``RetryPolicy()``): a read, so safe.
    It runs as the reader role (``read_postgres``); a query that is not a plain one is refused
    before that, with a friendlier error (``sstore.base.readonly``)."""
    check_query(sql, "postgres")
    return read_postgres(url, sql, params, policy=retry)


@dataclass
class Replica:
    """A copy of a PostgreSQL table inside the engine, refreshed on demand. ``retry``: how
    long a refresh tries a server that is away (default ``RetryPolicy()``; the read is
    retried whole, and the engine's copy changes only after it)."""

    engine: Engine
    url: str = field(repr=False)  # a repr in a log or traceback must not show a password
    table: str
    into: str
    key: Sequence[str] = ()
    since: str | None = None
    retry: RetryPolicy | None = None

    def refresh(self) -> int:
        """Full copy the first time; then incremental by ``since`` (merge by ``key`` if given),
        or a full copy again when there is no ``since``. Returns rows read."""
        if self.since is None:
            return copy_into_engine(self.url, self.engine, into=self.into, table=self.table,
                                    mode="replace", retry=self.retry)
        mode = "merge" if self.key else "append"
        return copy_into_engine(self.url, self.engine, into=self.into, table=self.table,
                                mode=mode, key=self.key, since=self.since, retry=self.retry)


#: The source's row version (its inserting transaction, ``xmin``), read beside each moved row
#: so that the removal takes exactly the row versions the engine committed.
ROW_VERSION = "sstore_row_xmin"


def migrate_to_engine(engine: Engine, url: str, table: str, into: str, key: Sequence[str],
                      where: str | None = None, where_params: Sequence[Any] = (),
                      retry: RetryPolicy | None = None) -> int:
    """Move the rows of ``table`` (matching ``where``, written with ``%s`` parameters) into
    ``into``: read them, commit them in the engine (merge by ``key``), then delete exactly
    those row versions in PostgreSQL. Returns the number of rows the engine committed.

    Three steps, each a unit that is safe to repeat. ``retry`` (default ``RetryPolicy()``)
    applies to each PostgreSQL step: the read (read-only, so a retry reads again) and the
    removal (one transaction, so a retry after a failure redoes it whole on a new
    connection). A removal that gives up leaves the rows in both places; moving again merges
    them into the engine once more (no duplicate) and removes them then. The removal matches
    each row by key *and* row version (``xmin``): a retry after a COMMIT whose answer was lost
    cannot delete a row inserted since under a moved key, and a row changed at the source
    after the read stays there (the next move takes its new version), so no row is lost.
    ``table`` must be a table (views have no row versions)."""
    if not key:
        raise DeclarationError("migration needs key columns (they make a repeated move harmless)")
    policy = retry or RetryPolicy()
    rows = _read_rows_to_move(url, table, where, where_params, policy)
    if rows.num_rows == 0:
        return 0
    moved = engine.load_table(into, rows.drop_columns([ROW_VERSION]), mode="merge", key=key)
    versions = rows.select([*key, ROW_VERSION])
    with_retries(url, lambda con: _remove_moved(con, table, key, versions), policy,
                 f"remove moved rows from {table}")
    return moved


def _read_rows_to_move(url: str, table: str, where: str | None, where_params: Sequence[Any],
                       policy: RetryPolicy) -> pa.Table:
    """The rows to move, each with its row version (``ROW_VERSION``), in one read-only
    query: retried whole by ``policy``, nothing to undo."""
    filter_sql = f" WHERE {where}" if where else ""
    query = (f"SELECT *, xmin::text::bigint AS {ident(ROW_VERSION)} "
             f"FROM {qualified(table)}{filter_sql}")
    rows = read_postgres(url, _to_dollar(query), where_params, policy=policy,
                         what=f"read rows to move from {table}")
    if rows.column_names.count(ROW_VERSION) != 1:
        raise DeclarationError(f"{table} has a column named {ROW_VERSION}, the name the "
                               f"migration reads row versions under")
    return rows


def _remove_moved(con: Any, table: str, key: Sequence[str], versions: pa.Table) -> int:
    """Delete the moved row versions (key and ``xmin`` as read) in one transaction, and
    commit. Repeating it deletes nothing more: a row inserted or updated since has another
    ``xmin``. Returns the rows deleted (0 when a lost COMMIT answer made this a repeat)."""
    keys = ", ".join(ident(k) for k in key)
    match = " AND ".join([*(f"t.{ident(k)} = m.{ident(k)}" for k in key),
                          f"t.xmin::text::bigint = m.{ident(ROW_VERSION)}"])
    with con.cursor() as cur:
        cur.execute(f"CREATE TEMPORARY TABLE sstore_moved ON COMMIT DROP AS SELECT {keys}, "
                    f"0::bigint AS {ident(ROW_VERSION)} FROM {qualified(table)} WITH NO DATA")
        copy_arrow(cur, "sstore_moved", versions)
        cur.execute(f"DELETE FROM {qualified(table)} t USING sstore_moved m WHERE {match}")
        deleted = cur.rowcount
    con.commit()
    return int(deleted)


def _to_dollar(sql: str) -> str:
    """``%s`` placeholders (psycopg style, what callers write) to ADBC's ``$n``."""
    parts = sql.split("%s")
    return "".join(p + (f"${i + 1}" if i < len(parts) - 1 else "") for i, p in enumerate(parts))
