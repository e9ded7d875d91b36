"""TPC-C ORDERS: rows by the specification's rules, one DDL for both engines, and a split.

``split_orders`` puts the newest ``share`` of the rows into the streaming engine and the rest
into PostgreSQL, and declares the split object ``orders`` in a polystore catalog: the layout the
paper measured its two UNION plans on.
"""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa
from sqlglot import exp

from migrators.postgres import connect, copy_arrow
from sstore.base.resources import read_schema
from sstore.base.sql import qualified
from sstore.engine import Engine
from sstore.polystore.sqltext import parse, physical_table, to_sql

DISTRICTS = 10              # per warehouse (clause 1.2.1)
ORDERS_PER_DISTRICT = 3000  # initial population (clause 4.3.3.1)
UNDELIVERED_FROM = 2101     # orders 2101..3000 of a district have no carrier yet


def orders_rows(count: int, seed: int = 7) -> pa.Table:
    """``count`` ORDERS rows, warehouse by warehouse, district by district, in ``o_id`` order:
    the later rows are the newer orders. Deterministic for a seed."""
    rng = np.random.default_rng(seed)
    i = np.arange(count, dtype=np.int64)
    per_wh = DISTRICTS * ORDERS_PER_DISTRICT
    o_id = (i % ORDERS_PER_DISTRICT + 1).astype(np.int32)
    d_id = ((i // ORDERS_PER_DISTRICT) % DISTRICTS + 1).astype(np.int16)
    w_id = (i // per_wh + 1).astype(np.int32)
    c_id = rng.permutation(ORDERS_PER_DISTRICT)[i % ORDERS_PER_DISTRICT].astype(np.int32) + 1
    start = np.datetime64(datetime.datetime(2026, 1, 1), "us")
    entry = start + (i * 1_000_000).astype("timedelta64[us]")
    carrier = rng.integers(1, 11, count).astype(np.int16)
    ol_cnt = rng.integers(5, 16, count).astype(np.int16)
    return pa.table({
        "o_id": o_id, "o_d_id": d_id, "o_w_id": w_id, "o_c_id": c_id,
        "o_entry_d": pa.array(entry, pa.timestamp("us")),
        "o_carrier_id": pa.array(carrier, mask=o_id >= UNDELIVERED_FROM),
        "o_ol_cnt": ol_cnt, "o_all_local": np.ones(count, dtype=np.int16),
    })


def ddl(dialect: str, table: str = "orders") -> str:
    """The ORDERS DDL in ``dialect`` ("postgres" or "duckdb"), for ``table``."""
    text = read_schema("tpcc_orders")
    statement = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    tree = parse(statement, "postgres")
    named = tree.find(exp.Table)
    assert named is not None
    named.replace(physical_table(table))
    return to_sql(tree, dialect)


def create_in_engine(engine: Engine, table: str, rows: pa.Table) -> None:
    engine.execute(f"DROP TABLE IF EXISTS {qualified(table)}")
    engine.execute(ddl("duckdb", table))
    engine.load_table(table, rows)


def create_in_postgres(url: str, table: str, rows: pa.Table) -> None:
    with connect(url) as con:
        with con.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {qualified(table)}")
            cur.execute(ddl("postgres", table))
            copy_arrow(cur, table, rows)
        con.commit()
        con.execute(f"ANALYZE {qualified(table)}")
        con.commit()


def split_rows(rows: pa.Table, share: float) -> tuple[pa.Table, pa.Table]:
    """(newest ``share`` of the rows, the older rest)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be between 0 and 1, got {share}")
    cut = rows.num_rows - round(rows.num_rows * share)
    return rows.slice(cut), rows.slice(0, cut)


