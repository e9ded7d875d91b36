"""Engine table -> PostgreSQL: a full copy, or incremental by a column that only grows.

Streams carry batch-ids and move through ``engine_to_postgres``. A state table has no batches,
so its increments are decided by a column: with ``since``, only rows whose ``since`` is greater
than the largest one already in the target are sent (in merge mode, greater or equal: a row that
ties with the newest one copied and was committed after that copy is merged in, not skipped;
append cannot tell such a row from one it sent, so append needs a column whose values are
unique and only grow, such as a sequence). The largest value is read inside the same
PostgreSQL transaction that loads the rows, under a lock that keeps concurrent copies of the same
target out, so a repeated or concurrent copy never duplicates a row.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from migrators import follow
from migrators.errors import LateTiesError, MigrationError
from migrators.postgres import (
    RetryPolicy,
    Session,
    copy_arrow,
    merge_rows,
)
from migrators.typemap import check_engine_table, check_sendable, for_copy, for_target
from sstore.base.errors import DeclarationError
from sstore.base.sql import ident, one_value, qualified
from sstore.engine import Engine


def copy_table_to_postgres(engine: Engine, url: str, source_table: str, table: str,
                           mode: str = "replace", key: Sequence[str] = (),
                           since: str | None = None, retry: RetryPolicy | None = None) -> int:
    """Copy the engine table ``source_table`` into PostgreSQL ``table``; return rows sent.

    ``mode``: "replace" (the target's rows become the source's, in one transaction), "append",
    or "merge" (by ``key``). ``since`` makes it incremental (append or merge only).
    """
    if mode not in ("replace", "append", "merge"):
        raise DeclarationError(f"mode must be replace, append or merge, not {mode!r}")
    if mode == "merge" and not key:
        raise DeclarationError("merge mode needs key columns")
    if since is not None and mode == "replace":
        raise DeclarationError("an incremental copy (since=) appends or merges")
    schema = engine.query(f"SELECT * FROM {qualified(source_table)} LIMIT 0").schema
    check_engine_table(engine, source_table, f"table {source_table!r}")
    if since is not None and since not in schema.names:
        raise MigrationError(f"table {source_table!r} has no column {since!r}")

    def load(con: psycopg.Connection) -> int:
        prepared = follow.prepare(con, table, schema, tuple(key),
                                  source=f"table {source_table!r}")
        types = prepared.types
        con.execute(f"LOCK TABLE {qualified(table)} IN SHARE ROW EXCLUSIVE MODE")
        sql, params = f"SELECT * FROM {qualified(source_table)}", []
        if since is not None:
            newest = one_value(con.execute(f"SELECT max({ident(since)}) FROM {qualified(table)}"
                                           ).fetchone())
            if newest is not None:  # merge re-reads the newest value: rows that tie with
                # it and committed after the last copy are merged in, not skipped for good
                op = ">=" if mode == "merge" else ">"
                sql, params = f"{sql} WHERE {ident(since)} {op} ?", [newest]
                if mode == "append":
                    _refuse_late_ties(con, engine, source_table, table, since, newest)
        rows = engine.query(sql, params=params)
        check_sendable(rows)
        # binary COPY sends exactly the column's type: rows go in the target's (widened)
        # types, or are refused (a bigint sent into a numeric column was read as zeros)
        rows = for_target(for_copy(rows), types)
        with con.cursor() as cur:
            if rows.num_rows:  # columns the source gained, in the transaction of their rows
                prepared.follow.apply(cur)
            if mode == "replace":
                cur.execute(f"DELETE FROM {qualified(table)}")
            if mode == "merge":
                merge_rows(cur, table, rows, key)
            else:
                copy_arrow(cur, table, rows)
        con.commit()
        return int(rows.num_rows)

    session = Session(url, retry)
    try:
        return session.run(load, f"copy {source_table} to {table}")
    finally:
        session.close()


def _refuse_late_ties(con: psycopg.Connection, engine: Engine, source_table: str, table: str,
                      since: str, newest: object) -> None:
    """An append by ``since`` sends rows above the newest value copied; rows that tie with it
    and were committed after that copy would never be sent. They cannot be told apart from the
    ones sent (no key), so more such rows at the source than in the target is a
    ``LateTiesError``, not a silent loss."""
    there = one_value(con.execute(
        f"SELECT count(*) FROM {qualified(table)} WHERE {ident(since)} = %s", (newest,)
    ).fetchone())
    here = engine.query(f"SELECT count(*) AS n FROM {qualified(source_table)} WHERE "
                        f"{ident(since)} = ?", params=[newest]).column("n")[0].as_py()
    if here > there:
        raise LateTiesError(f"copy {source_table} to {table}", since, newest, here - there)
