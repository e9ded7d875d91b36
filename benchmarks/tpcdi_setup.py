"""What every run of ``benchmarks.tpcdi`` stands on: the data set, the trade events, a database,
and the dimensions, built once per scale factor and copied into each run's warehouse.

Why the dimensions are built once: every system needs the same dimension rows in its warehouse
before Batch1's trades, and the Batch2 (Batch3) versions before Batch2's (Batch3's) trades. Both
pipelines build them with the same PySpark code (``sstore.workloads.tpcdi.dimensions``), which
takes about a minute per scale factor and is the same work whichever system then loads the
trades. So it runs once per scale factor, into the schema ``tpcdi_dims``, with a snapshot after
each batch (``tpcdi_dims_b1`` .. ``b3``), and each run gets a fresh warehouse schema into which
the snapshot of a batch is copied (``INSERT ... SELECT`` inside PostgreSQL) right before that
batch's trades. The copies are timed as dimension phases, apart from the trade phases that the
throughput numbers count.

Why each run is fresh: exactly-once state must not leak from one run to the next. A run's
schema is dropped and created anew, its ``sstore.watermarks`` rows (targets ``<schema>.*``)
are deleted, and the engine gets a new state file (the caller's temporary directory).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.compute as pc
from psycopg import sql

from migrators import watermarks
from migrators.urls import with_database
from sstore.base.sql import ident
from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.streaming.events import (
    BatchEvents,
    batch1_events,
    incremental_events,
)
from sstore.workloads.tpcdi.warehouse import create_warehouse

SEED = 0
BUILD_SCHEMA = "tpcdi_dims"
DIMENSION_TABLES = ("dimdate", "dimtime", "statustype", "tradetype", "industry", "taxrate",
                    "dimbroker", "dimcompany", "dimsecurity", "dimcustomer", "dimaccount")
TPCDI_BATCHES = (1, 2, 3)


@dataclass(frozen=True)
class DataSet:
    """One generated data set and its trade events (the same events feed every streaming run).

    ``source_rows``: the rows of the files DimTrade is loaded from, per TPC-DI batch (Batch1:
    Trade.txt + TradeHistory.txt; Batch2/3: Trade.txt), as the TPC-DI metric counts rows."""

    scale_factor: float
    path: Path
    events: dict[int, BatchEvents]
    source_rows: dict[int, int]
    seconds: float

    @property
    def trades(self) -> int:
        """Trades in the data set: one insert (``I``) event each."""
        return sum(int(pc.sum(pc.starts_with(e.lines["line"], "I|")).as_py() or 0)
                   for e in self.events.values())

    @property
    def total_events(self) -> int:
        return sum(e.lines.num_rows for e in self.events.values())


def make_data(scale_factor: float, out: Path) -> DataSet:
    """Generate the data set (deterministic: the same SF and seed give the same files)."""
    started = time.perf_counter()
    generate(scale_factor, out, seed=SEED)
    events = {1: batch1_events(out)}
    events.update({b: incremental_events(out, b) for b in TPCDI_BATCHES[1:]})
    rows = {1: _lines(out / "Batch1" / "Trade.txt") + _lines(out / "Batch1" / "TradeHistory.txt")}
    rows.update({b: _lines(out / f"Batch{b}" / "Trade.txt") for b in TPCDI_BATCHES[1:]})
    return DataSet(scale_factor, out, events, rows, time.perf_counter() - started)


def _lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def event_source(data: DataSet, tpcdi_batch: int) -> str:
    """The file name the engine's rejects carry for this batch (``streaming.events``)."""
    return str(data.events[tpcdi_batch].lines["source"][0]) if \
        data.events[tpcdi_batch].lines.num_rows else ""


# -- databases ----------------------------------------------------------------------------------
def create_database(admin_url: str, name: str) -> str:
    """Create database ``name`` (dropped first if a crashed run left it); return its URL."""
    drop_database(admin_url, name)
    with psycopg.connect(admin_url, autocommit=True) as con:
        con.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_database(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as con:
        con.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


def execute(url: str, statement: str, params: tuple[Any, ...] = ()) -> None:
    with psycopg.connect(url) as con:
        con.execute(statement, params)


def fresh_warehouse(url: str, schema: str) -> None:
    """An empty warehouse schema with no exactly-once state left from an earlier run."""
    execute(url, f"DROP SCHEMA IF EXISTS {ident(schema)} CASCADE")
    create_warehouse(url, schema)
    with psycopg.connect(url) as con:
        watermarks.ensure_watermarks(con)
        watermarks.forget_targets(con, schema)


def drop_schema(url: str, schema: str) -> None:
    execute(url, f"DROP SCHEMA IF EXISTS {ident(schema)} CASCADE")
    with psycopg.connect(url) as con:
        watermarks.forget_targets(con, schema)


# -- dimensions ---------------------------------------------------------------------------------
def build_dimensions(spark: Any, data: DataSet, url: str) -> dict[str, float]:
    """Build the dimensions of every batch once, snapshot each; return the seconds per step."""
    from sstore.workloads.tpcdi import dimensions

    seconds: dict[str, float] = {}
    for batch in TPCDI_BATCHES:
        t0 = time.perf_counter()
        if batch == 1:
            dimensions.build_historical(spark, data.path, url, BUILD_SCHEMA)
        else:
            dimensions.apply_batch(spark, data.path, url, BUILD_SCHEMA, batch)
        seconds[f"build Batch{batch} (Spark)"] = time.perf_counter() - t0
        _snapshot(url, batch)
    return seconds


def _snapshot(url: str, batch: int) -> None:
    snap = ident(f"{BUILD_SCHEMA}_b{batch}")
    with psycopg.connect(url) as con:
        con.execute(f"DROP SCHEMA IF EXISTS {snap} CASCADE")
        con.execute(f"CREATE SCHEMA {snap}")
        for table in DIMENSION_TABLES:
            con.execute(f"CREATE TABLE {snap}.{ident(table)} AS "
                        f"SELECT * FROM {ident(BUILD_SCHEMA)}.{ident(table)}")


def install_dimensions(url: str, schema: str, batch: int) -> float:
    """Make ``schema``'s dimensions those after ``batch`` (one transaction); return seconds."""
    t0 = time.perf_counter()
    snap, target = ident(f"{BUILD_SCHEMA}_b{batch}"), ident(schema)
    with psycopg.connect(url) as con:
        for table in DIMENSION_TABLES:
            con.execute(f"DELETE FROM {target}.{ident(table)}")
            con.execute(f"INSERT INTO {target}.{ident(table)} SELECT * FROM {snap}.{ident(table)}")
        for table in ("dimsecurity", "dimaccount"):
            con.execute(f"ANALYZE {target}.{ident(table)}")
    return time.perf_counter() - t0


# -- results ------------------------------------------------------------------------------------
def fingerprint(url: str, schema: str) -> dict[str, Any]:
    """Row counts of the trade tables and checksums of their contents (every column, in a
    fixed order), to check that two systems loaded the same rows."""
    s = ident(schema)
    with psycopg.connect(url) as con:
        trades, trade_md5 = con.execute(
            f"SELECT count(*), md5(coalesce(string_agg(t::text, E'\\n' ORDER BY tradeid), '')) "
            f"FROM {s}.dimtrade t").fetchone()
        messages, message_md5 = con.execute(
            f"SELECT count(*), md5(coalesce(string_agg(m::text, E'\\n' ORDER BY m::text), '')) "
            f"FROM {s}.dimessages m").fetchone()
        rejects = con.execute(f"SELECT count(*) FROM {s}.rejects").fetchone()[0]
    return {"dimtrade_rows": trades, "dimtrade_md5": trade_md5, "dimessages_rows": messages,
            "dimessages_md5": message_md5, "rejects_rows": rejects}
