"""What ``benchmarks.engine`` pushes through each system: the 3-procedure chain, the voter, and
the chain written by hand against DuckDB.

- ``chain``: parse/validate -> enrich (join with a lookup table) -> aggregate (upsert into a
  per-user state table, output a per-region summary of the batch).
- ``voter``: ``sstore.workloads.voter`` (when it can be imported).
- the baseline: the chain as hand-written DuckDB code, one transaction per batch doing the three
  steps with the very same SQL, with the same durability (a DuckDB file for ``full``; an
  in-memory database plus an fsync'd Arrow input log for ``weak``). The gap between it and
  ``chain`` is the engine's overhead.

The Spark Structured Streaming version of the chain (``benchmarks.engine_spark``) uses the
validation predicate and the lookup rows defined here, so all three systems do the same work.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from sstore import Engine

N_USERS = 100_000
KNOWN_USERS = 95_000  # the other 5% of user ids have no row in the lookup table: enrich drops them
N_REGIONS = 16

RAW_COLUMNS = {"event_id": "BIGINT", "user_id": "BIGINT", "amount": "DOUBLE", "kind": "VARCHAR"}
ENRICHED_COLUMNS = {**RAW_COLUMNS, "region": "VARCHAR", "tier": "VARCHAR"}
SUMMARY_COLUMNS = {"region": "VARCHAR", "n": "BIGINT", "total": "DOUBLE"}

LOOKUP_SELECT = f"""
SELECT range::BIGINT AS user_id, 'region-' || (range % {N_REGIONS}) AS region,
       CASE range % 3 WHEN 0 THEN 'gold' WHEN 1 THEN 'silver' ELSE 'bronze' END AS tier
FROM range({KNOWN_USERS})
"""
LOOKUP_DDL = f"CREATE TABLE users AS {LOOKUP_SELECT}"
LOOKUP_KEY = "ALTER TABLE users ADD PRIMARY KEY (user_id)"
STATE_DDL = ("CREATE TABLE user_totals (user_id BIGINT PRIMARY KEY, n BIGINT NOT NULL, "
             "total DOUBLE NOT NULL)")

# A predicate both DuckDB and Spark SQL parse the same way.
VALID_PREDICATE = "amount > 0 AND kind IN ('click', 'view', 'buy')"
VALIDATE_SQL = f"SELECT event_id, user_id, amount, kind FROM batch WHERE {VALID_PREDICATE}"
ENRICH_SQL = ("SELECT b.event_id, b.user_id, b.amount, b.kind, u.region, u.tier "
              "FROM batch b JOIN users u ON u.user_id = b.user_id")
UPSERT_SQL = ("INSERT INTO user_totals SELECT user_id, count(*), sum(amount) FROM batch "
              "GROUP BY user_id ON CONFLICT (user_id) DO UPDATE "
              "SET n = n + excluded.n, total = total + excluded.total")
SUMMARY_SQL = ("SELECT region, count(*)::BIGINT AS n, sum(amount) AS total FROM batch "
               "GROUP BY region ORDER BY region")
TOTALS_SQL = "SELECT user_id, n, total FROM user_totals ORDER BY user_id"

EVENTS_SQL = f"""
SELECT range::BIGINT AS event_id,
       (hash(range + $seed) % {N_USERS})::BIGINT AS user_id,
       CASE WHEN hash(range * 31 + $seed) % 20 = 0 THEN -1.0
            ELSE ((hash(range * 17 + $seed) % 100000) / 100.0) END::DOUBLE AS amount,
       CASE hash(range * 13 + $seed) % 10 WHEN 0 THEN 'bogus' WHEN 1 THEN 'buy'
            WHEN 2 THEN 'view' WHEN 3 THEN 'view' ELSE 'click' END AS kind
FROM range($n) ORDER BY range
"""


def _arrow(sql: str, params: dict[str, Any] | None = None) -> pa.Table:
    con = duckdb.connect()
    try:
        return con.sql(sql, params=params).to_arrow_table().combine_chunks()
    finally:
        con.close()


def make_events(n_rows: int, seed: int) -> pa.Table:
    """Deterministic raw events (about 5% with a bad amount, 10% of an unknown kind), made by
    DuckDB so that a million rows take a fraction of a second."""
    return _arrow(EVENTS_SQL, {"seed": seed, "n": n_rows})


def lookup_rows() -> pa.Table:
    """The rows of the lookup table ``users``, for systems that do not run ``LOOKUP_DDL``."""
    return _arrow(LOOKUP_SELECT)


def create_chain_tables(execute: Callable[[str], Any]) -> None:
    """The lookup table and the state table, through whatever runs DDL (engine or baseline)."""
    execute(LOOKUP_DDL)
    execute(LOOKUP_KEY)
    execute(STATE_DDL)


def declare_chain(eng: Engine) -> None:
    """Declare the chain's streams, tables and three procedures on ``eng``."""
    eng.stream("raw", RAW_COLUMNS)
    eng.stream("valid", RAW_COLUMNS)
    eng.stream("enriched", ENRICHED_COLUMNS)
    eng.stream("region_summary", SUMMARY_COLUMNS)
    create_chain_tables(eng.execute)

    @eng.procedure(input="raw", output="valid")
    def parse(tx: Any, batch: pa.Table) -> pa.Table:
        """Drop malformed events."""
        return tx.sql(VALIDATE_SQL)

    @eng.procedure(input="valid", output="enriched")
    def enrich(tx: Any, batch: pa.Table) -> pa.Table:
        """Join with the lookup table (unknown users are dropped)."""
        return tx.sql(ENRICH_SQL)

    @eng.procedure(input="enriched", output="region_summary")
    def aggregate(tx: Any, batch: pa.Table) -> pa.Table:
        """Upsert per-user totals; output the batch's per-region summary."""
        tx.execute(UPSERT_SQL)
        return tx.sql(SUMMARY_SQL)


def chain_totals(batches: Iterable[pa.Table]) -> pa.Table:
    """The per-user totals the engine's chain ends with after ``batches`` (in memory, no
    durability: the reference the other systems are checked against)."""
    with Engine(":memory:") as eng:
        declare_chain(eng)
        for table in batches:
            eng.ingest("raw", table)
            eng.run_until_idle()
        return eng.query(TOTALS_SQL)


# ---------------------------------------------------------------------------------------------
# the baseline: the chain by hand


def run_chain_by_hand(con: duckdb.DuckDBPyConnection, table: pa.Table) -> pa.Table:
    """The baseline: the three steps in one DuckDB transaction, as a user would write them."""
    con.begin()
    try:
        con.register("batch", table)
        valid = con.sql(VALIDATE_SQL).to_arrow_table()
        con.register("batch", valid)
        enriched = con.sql(ENRICH_SQL).to_arrow_table()
        con.register("batch", enriched)
        con.execute(UPSERT_SQL).fetchall()
        summary = con.sql(SUMMARY_SQL).to_arrow_table()
        con.commit()
    except BaseException:
        con.rollback()
        raise
    finally:
        con.unregister("batch")
    return summary


class InputLogFile:
    """The baseline's weak durability: each input batch appended as Arrow IPC and fsync'd before
    its transaction, which is what the engine's input log does."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "ab")

    def append(self, table: pa.Table) -> None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        self._file.write(sink.getvalue().to_pybytes())
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


# ---------------------------------------------------------------------------------------------
# workloads of the engine


@dataclass(frozen=True)
class Workload:
    """What the driver needs to know about a dataflow to push batches through it."""

    name: str
    input_stream: str
    declare: Callable[[Engine], None]
    make_input: Callable[[int, int], pa.Table]  # (rows, seed) -> rows for the input stream
    tes_per_batch: int | None  # exact TEs per batch, checked; None when it depends on the data


CHAIN = Workload("chain", "raw", declare_chain, make_events, 3)

# The voter removes its lowest contestant every ``remove_every`` valid votes. The package's
# default (1,000) would leave one contestant after ~11,000 votes, and from then on nearly every
# vote is rejected: the long runs would measure a different workload than the short ones.
VOTER_REMOVE_EVERY = 100_000


def load_voter() -> Workload | None:
    """The voter workload, if another engineer's ``sstore.workloads.voter`` is importable yet."""
    try:
        voter = importlib.import_module("sstore.workloads.voter")
    except ImportError:
        return None

    def declare(eng: Engine) -> None:
        voter.declare(eng, remove_every=VOTER_REMOVE_EVERY)

    def make_input(rows: int, seed: int) -> pa.Table:
        return voter.generate_votes(rows, seed)

    # update_trending runs only when the trending window slides (a batch with a valid vote)
    return Workload("voter", "votes", declare, make_input, None)
