"""The paper's three ways for a streaming query to reach data that lives in PostgreSQL
(section III.C), each an explicit choice with its own cost:

- ``cross_system_query``: read it each time, keep nothing. No staleness, no storage; pays the
  round trip on every use.
- ``Replica``: keep a copy in the engine and refresh it (fully, or incrementally by a growing
  column). Lookups are local and cheap; the copy is as fresh as its last refresh.
- ``migrate_to_engine``: move rows into the engine and remove them from PostgreSQL, but only
  after the engine has committed them (merge by key makes a repeated move harmless, so a crash
  between the two steps neither loses nor duplicates a row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from migrators.postgres import RetryPolicy, copy_arrow, with_retries
from migrators.postgres_to_engine import copy_into_engine, read_postgres
from sstore.engine import Engine
from sstore.errors import DeclarationError
from sstore.sql import ident, qualified


def cross_system_query(url: str, sql: str, *params: Any) -> pa.Table:
    """Run ``sql`` in PostgreSQL now (parameters ``$1, $2, ...``); nothing is kept."""
    return read_postgres(url, sql, params)


@dataclass
class Replica:
    """A copy of a PostgreSQL table inside the engine, refreshed on demand."""

    engine: Engine
    url: str
    table: str
    into: str
    key: Sequence[str] = ()
    since: str | None = None

    def refresh(self) -> int:
        """Full copy the first time; then incremental by ``since`` (merge by ``key`` if given),
        or a full copy again when there is no ``since``. Returns rows read."""
        if self.since is None:
            return copy_into_engine(self.url, self.engine, into=self.into, table=self.table,
                                    mode="replace")
        mode = "merge" if self.key else "append"
        return copy_into_engine(self.url, self.engine, into=self.into, table=self.table,
                                mode=mode, key=self.key, since=self.since)


def migrate_to_engine(engine: Engine, url: str, table: str, into: str, key: Sequence[str],
                      where: str | None = None, where_params: Sequence[Any] = (),
                      retry: RetryPolicy | None = None) -> int:
    """Move the rows of ``table`` (matching ``where``, written with ``%s`` parameters) into
    ``into``: copy, commit in the engine, then delete exactly those keys in PostgreSQL."""
    if not key:
        raise DeclarationError("migration needs key columns (they make a repeated move harmless)")
    keys = ", ".join(ident(k) for k in key)
    filter_sql = f" WHERE {where}" if where else ""
    query = f"SELECT * FROM {qualified(table)}{filter_sql}"
    rows = read_postgres(url, _to_dollar(query), where_params)
    if rows.num_rows == 0:
        return 0
    engine.load_table(into, rows, mode="merge", key=key)  # the engine has committed them
    moved = rows.select(list(key))

    def delete(con: Any) -> int:
        with con.cursor() as cur:
            cur.execute(f"CREATE TEMPORARY TABLE sstore_moved AS SELECT {keys} FROM "
                        f"{qualified(table)} WITH NO DATA")
            copy_arrow(cur, "sstore_moved", moved)
            cur.execute(f"DELETE FROM {qualified(table)} t USING sstore_moved m WHERE "
                        + " AND ".join(f"t.{ident(k)} = m.{ident(k)}" for k in key))
            deleted = cur.rowcount
        con.commit()
        return deleted

    return with_retries(url, delete, retry or RetryPolicy(), f"remove moved rows from {table}")


def _to_dollar(sql: str) -> str:
    """``%s`` placeholders (psycopg style, what callers write) to ADBC's ``$n``."""
    parts = sql.split("%s")
    return "".join(p + (f"${i + 1}" if i < len(parts) - 1 else "") for i, p in enumerate(parts))
