"""The TPC-DI warehouse in PostgreSQL: create it, drop it, count its rows.

The tables are defined once, in ``schemas/tpcdi.sql``, so that psql and Python build the same
warehouse. The file names its schema with psql's ``:"schema"`` variable; here that placeholder is
replaced by a quoted identifier (``sstore.base.sql.ident``), so any schema name is safe and several
warehouses can live side by side in one database (one per test, one per run).
"""

from __future__ import annotations

from migrators import watermarks
from migrators.postgres import connect
from sstore.base.resources import read_schema
from sstore.base.sql import ident, one_value

PLACEHOLDER = ':"schema"'
TABLES = ("dimdate", "dimtime", "statustype", "tradetype", "industry", "taxrate", "dimbroker",
          "dimcompany", "dimsecurity", "dimcustomer", "dimaccount", "dimtrade", "dimessages",
          "audit", "rejects")
_SYSTEM_SCHEMAS = frozenset({"public", "pg_catalog", "information_schema", "pg_toast"})


def ddl(schema: str = "tpcdi") -> str:
    """The DDL text for ``schema``, ready to run (no parameters, several statements)."""
    return read_schema("tpcdi").replace(PLACEHOLDER, ident(schema))


def create_warehouse(url: str, schema: str = "tpcdi") -> tuple[str, ...]:
    """Create the schema and every table that is missing, in one transaction (re-runnable:
    existing tables and their rows are left alone). Returns the table names."""
    with connect(url) as con:
        con.execute(ddl(schema))
    return TABLES


def drop_warehouse(url: str, schema: str) -> None:
    """Drop the schema with everything in it, and, in the same transaction, the migrators'
    watermark rows of its tables: a watermark that outlived its table would make the next
    load skip every batch it names as delivered. No default on purpose, and never a system
    schema: this removes data."""
    if schema in _SYSTEM_SCHEMAS or schema.startswith("pg_"):
        raise ValueError(f"refusing to drop system schema {schema!r}")
    with connect(url) as con:
        con.execute(f"DROP SCHEMA IF EXISTS {ident(schema)} CASCADE")
        watermarks.forget_targets(con, schema)
        if one_value(con.execute("SELECT to_regclass('sstore.intervals') IS NOT NULL"
                                 ).fetchone()):
            # versions of intervals whose rows are gone would outlive them (and a backfill
            # would take them for the new load's)
            con.execute("DELETE FROM sstore.intervals WHERE split_part(target, '.', 1) = %s",
                        (schema,))


def existing_tables(url: str, schema: str = "tpcdi") -> set[str]:
    """Names of the tables (of any kind) in ``schema``; empty if it does not exist."""
    with connect(url) as con:
        rows = con.execute("SELECT table_name FROM information_schema.tables "
                           "WHERE table_schema = %s", (schema,)).fetchall()
    return {r[0] for r in rows}


def row_count(url: str, table: str, schema: str = "tpcdi") -> int:
    """``count(*)`` of one warehouse table."""
    with connect(url) as con:
        row = con.execute(f"SELECT count(*) FROM {ident(schema)}.{ident(table)}").fetchone()
    return int(row[0]) if row else 0


def row_counts(url: str, schema: str = "tpcdi") -> dict[str, int]:
    """``count(*)`` of every warehouse table that exists in ``schema``, in TABLES order."""
    present = existing_tables(url, schema)
    names = [t for t in TABLES if t in present]
    if not names:
        return {}
    query = " UNION ALL ".join(
        f"SELECT {i}, count(*) FROM {ident(schema)}.{ident(t)}" for i, t in enumerate(names))
    with connect(url) as con:
        rows: dict[int, int] = dict(con.execute(query).fetchall())
    return {t: int(rows[i]) for i, t in enumerate(names)}


def dimensions_applied(url: str, schema: str, batch: int) -> bool:
    """Whether the warehouse has the dimension changes of ``batch`` (or of a later batch,
    which builds on them): DimCustomer or DimAccount rows of that batch-id or above. Every
    run mode asks this before applying a batch's dimension changes, so a resumed run does
    not apply them twice."""
    s = ident(schema)
    with connect(url) as con:
        row = con.execute(f"SELECT EXISTS (SELECT 1 FROM {s}.dimcustomer WHERE batchid >= %s) "
                          f"OR EXISTS (SELECT 1 FROM {s}.dimaccount WHERE batchid >= %s)",
                          (batch, batch)).fetchone()
    return bool(row and row[0])
