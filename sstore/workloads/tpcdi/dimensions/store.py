"""Dimension rows into PostgreSQL: Arrow -> binary COPY, all-or-nothing.

Why not Spark's JDBC writer: it commits each partition on its own, so a load that fails half
way leaves half a dimension behind (and a TRUNCATE already committed). Dimensions are small
(DimAccount, the largest type-2 table, has about one row per CustomerMgmt action, DimTime
86,400 rows) and the jobs produce them as one Arrow table in the driver anyway
(``frames.materialize``), so one PostgreSQL transaction takes them all: TRUNCATE, binary COPY,
COMMIT. A failure rolls back to the previous contents, and running the load again repairs
anything. It is also faster: DimDate (25,933 rows) takes 1.4-1.9 s through
``dataframe_to_postgres`` and 0.6 s as ``toArrow`` + COPY (0.3 s of it the COPY). Columns are
cast to the exact types of ``schemas/tpcdi.sql`` first. An incremental batch likewise runs in
one transaction (undo of an earlier run, state read, new versions), see ``incremental``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
import pyarrow as pa

from migrators.postgres import connect, copy_arrow
from sstore.base.errors import TerminalError
from sstore.base.sql import ident

_PG_TO_ARROW = {
    "bigint": pa.int64(), "integer": pa.int32(), "smallint": pa.int16(),
    "boolean": pa.bool_(), "date": pa.date32(), "text": pa.string(),
    "character varying": pa.string(), "time without time zone": pa.time64("us"),
    "timestamp without time zone": pa.timestamp("us"), "double precision": pa.float64(),
}


class DimensionLoadError(TerminalError):
    """Rows that the warehouse cannot take (a column missing from the table, a batch applied
    out of order)."""


def _columns(cur: psycopg.Cursor, schema: str, table: str) -> dict[str, pa.DataType]:
    rows = cur.execute(
        "SELECT column_name, data_type, numeric_precision, numeric_scale "
        "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
        "ORDER BY ordinal_position", (schema, table)).fetchall()
    out: dict[str, pa.DataType] = {}
    for name, data_type, precision, scale in rows:
        if data_type == "numeric" and precision is not None:
            out[name] = pa.decimal128(precision, scale or 0)
        elif data_type in _PG_TO_ARROW:
            out[name] = _PG_TO_ARROW[data_type]
    return out


def copy_rows(cur: psycopg.Cursor, schema: str, table: str, rows: pa.Table) -> int:
    """Binary COPY of ``rows`` into ``schema.table``, each column cast to the table's type."""
    types = _columns(cur, schema, table)
    unknown = [c for c in rows.column_names if c not in types]
    if unknown:
        raise DimensionLoadError(f"{schema}.{table} has no column(s) {unknown}")
    fitted = pa.table([rows[c].cast(types[c]) for c in rows.column_names],
                      names=rows.column_names)
    return copy_arrow(cur, f"{schema}.{table}", fitted)


def delete_rejects(cur: psycopg.Cursor, schema: str, files: str,
                   batches: Sequence[int] | None = None) -> None:
    """Forget earlier rejects of these source files (a regex on the path) and batches (all
    when None), so that a re-run does not count a bad line twice."""
    if batches is None:
        cur.execute(f"DELETE FROM {ident(schema)}.rejects WHERE source_file ~ %s", (files,))
    else:
        cur.execute(f"DELETE FROM {ident(schema)}.rejects WHERE batch_id = ANY(%s) "
                    f"AND source_file ~ %s", (list(batches), files))


def replace_tables(url: str, schema: str, tables: Mapping[str, pa.Table], rejects: pa.Table,
                   reject_files: str) -> None:
    """One transaction: every table in ``tables`` emptied and refilled, earlier rejects of the
    source files ``reject_files`` (a regex, every batch) replaced by ``rejects``."""
    names = ", ".join(f"{ident(schema)}.{ident(t)}" for t in tables)
    with connect(url) as con, con.cursor() as cur:
        cur.execute(f"TRUNCATE {names}")
        for table, rows in tables.items():
            copy_rows(cur, schema, table, rows)
        delete_rejects(cur, schema, reject_files)
        copy_rows(cur, schema, "rejects", rejects)


def add_versions(cur: psycopg.Cursor, schema: str, added: Mapping[str, tuple[str, pa.Table]],
                 effective: dt.date, rejects: pa.Table, reject_files: str, batch_id: int
                 ) -> dict[str, int]:
    """For each ``added[table] = (natural key, new versions)``: end the current versions of
    those keys at ``effective``, append the new ones; replace this batch's rejects of the same
    sources. Returns the versions ended per table. The caller commits."""
    ended: dict[str, int] = {}
    for table, (key, rows) in added.items():
        cur.execute(f"UPDATE {ident(schema)}.{ident(table)} SET enddate = %s, "
                    f"iscurrent = false WHERE iscurrent AND {ident(key)} = ANY(%s)",
                    (effective, rows[key].to_pylist()))
        ended[table] = cur.rowcount
        copy_rows(cur, schema, table, rows)
    delete_rejects(cur, schema, reject_files, [batch_id])
    copy_rows(cur, schema, "rejects", rejects)
    return ended


def undo_batch(cur: psycopg.Cursor, schema: str, tables: Mapping[str, str], batch_id: int
               ) -> int:
    """Take batch ``batch_id`` back out of the type-2 ``tables`` (table -> natural key): its
    versions are deleted and the versions it had ended become current again. Refused when a
    later batch is loaded (it builds on this one). Returns the versions deleted. The caller
    commits (or rolls back: then nothing was undone).

    A batch only ever adds versions dated on its BatchDate and ends the then-current ones, so
    after deleting its versions a key's latest version is current again exactly when it had
    been ended by this batch."""
    s = ident(schema)
    later = sum(scalar(cur, f"SELECT count(*) FROM {s}.{ident(t)} WHERE batchid > %s",
                       batch_id) for t in tables)
    if later:
        raise DimensionLoadError(f"batch {batch_id} cannot be applied again: {later} "
                                 f"dimension rows of a later batch build on it")
    deleted = 0
    for table, key in tables.items():
        t, k = f"{s}.{ident(table)}", ident(key)
        deleted += cur.execute(f"DELETE FROM {t} WHERE batchid = %s", (batch_id,)).rowcount
        cur.execute(f"UPDATE {t} AS d SET enddate = DATE '9999-12-31', iscurrent = true "
                    f"WHERE NOT d.iscurrent AND NOT EXISTS (SELECT 1 FROM {t} AS n "
                    f"WHERE n.{k} = d.{k} AND n.effectivedate > d.effectivedate)")
    return deleted


def read_rows(cur: psycopg.Cursor, schema: str, table: str, where: str = "TRUE") -> pa.Table:
    """Rows of a warehouse table as Arrow, typed like the table (``where`` is SQL text from
    this package, never from data). The state an incremental batch starts from is small
    (current versions), and read in the batch's own transaction, so it sees its undo."""
    types = _columns(cur, schema, table)
    names = ", ".join(ident(c) for c in types)
    rows = cur.execute(f"SELECT {names} FROM {ident(schema)}.{ident(table)} "
                       f"WHERE {where}").fetchall()
    columns: list[Sequence[Any]] = list(zip(*rows)) if rows else [[] for _ in types]
    return pa.table([pa.array(values, type_) for values, type_ in zip(columns, types.values())],
                    names=list(types))


def scalar(cur: psycopg.Cursor, sql: str, *params: object) -> Any:
    """One value of one query (the warehouse's max SK, its latest date, ...)."""
    row = cur.execute(sql, params).fetchone()
    return row[0] if row else None
