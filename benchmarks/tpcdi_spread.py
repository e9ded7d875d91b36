"""Why SF 10's DimTrade batch costs more than SF 1's: the spread of the trades a batch updates.

Run ``python -m benchmarks.tpcdi_spread`` (300 batches per case) or ``--quick`` (120).

A 1,000-trade batch of Batch1 inserts ~1,000 trades and updates ~550 trades created up to 90
days before. At SF 1 those lie among the last ~6,500 DimTrade rows, at SF 10 among the last
~65,000: the same work per batch, spread over ten times as many rows. This benchmark isolates
that on a synthetic DimTrade (DimTrade's 21 columns and primary key, 200,000 rows, then
batches of 1,000 inserts and 550 updates spread over the last ``reach`` rows; one file-backed
DuckDB, a CHECKPOINT every 100 batches as the engine's WAL limit would) and times SP5's write
in the formulations tried so far, at both reaches:

- ``merge-returning``: SP5 as it is, ``MERGE ... RETURNING *`` (the changed rows are SP5's
  output);
- ``merge-returning-id``: ``RETURNING tradeid`` only (is it the width of the returned rows?);
- ``merge``: no ``RETURNING`` (the lower bound of a MERGE that must report its rows);
- ``merge-4-columns``: updating 4 columns instead of 9 (is it per updated column?);
- ``delete-insert``: the new rows computed by a join, the old versions deleted, the new ones
  appended (updated rows move to the end of the table);
- ``merge-returning-plain-executedby``: SP5 as it is, over a DimTrade whose ``executedby`` is
  stored uncompressed (``USING COMPRESSION uncompressed``): ``RETURNING *`` reads that string
  back for every updated row, and from a checkpointed ``DICT_FSST`` vector of this synthetic
  column (a distinct name per trade) each read decodes. The pipeline's real names repeat, and
  there it did not pay (docs/tpcdi.md, sixth session).

Reported: the median ms per batch over the last 100 batches at each reach, and the growth from
the SF 1 reach to the SF 10 reach. Results: ``benchmarks/results/tpcdi-spread.json``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import duckdb
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks.common import machine_info, write_results

REACHES = {"SF 1": 6_500, "SF 10": 65_000}
INITIAL_ROWS = 200_000
INSERTS, UPDATES = 1_000, 550
COLUMNS = (
    "tradeid BIGINT PRIMARY KEY, sk_brokerid BIGINT, sk_createdateid BIGINT, "
    "sk_createtimeid BIGINT, sk_closedateid BIGINT, sk_closetimeid BIGINT, status VARCHAR, "
    "type VARCHAR, cashflag BOOLEAN, sk_securityid BIGINT, sk_companyid BIGINT, "
    "quantity INTEGER, bidprice DECIMAL(8,2), sk_customerid BIGINT, sk_accountid BIGINT, "
    "executedby VARCHAR, tradeprice DECIMAL(8,2), fee DECIMAL(10,2), "
    "commission DECIMAL(10,2), tax DECIMAL(10,2), batchid INTEGER")
NAMES = [c.split()[0] for c in COLUMNS.split(", ")]
INSERTED = (
    "SELECT i AS tradeid, i % 100 AS sk_brokerid, 20200101 AS sk_createdateid, "
    "1200 AS sk_createtimeid, NULL::BIGINT AS sk_closedateid, NULL::BIGINT AS sk_closetimeid, "
    "'Pending' AS status, 'Market Buy' AS type, true AS cashflag, i % 900 AS sk_securityid, "
    "i % 500 AS sk_companyid, (i % 100)::INTEGER AS quantity, 10.5::DECIMAL(8,2) AS bidprice, "
    "i % 5000 AS sk_customerid, i % 9000 AS sk_accountid, 'name ' || i AS executedby, "
    "NULL::DECIMAL(8,2) AS tradeprice, NULL::DECIMAL(10,2) AS fee, "
    "NULL::DECIMAL(10,2) AS commission, NULL::DECIMAL(10,2) AS tax, 1 AS batchid, "
    "true AS inserts FROM range(?, ?) t(i)")
UPDATED = (
    "SELECT u AS tradeid, NULL, NULL, NULL, 20200202, 1300, 'Completed', 'Market Buy', NULL, "
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, 11.5, 1.0, 2.0, 0.5, 1, false "
    "FROM unnest(?::BIGINT[]) t(u)")
SET_9 = ("sk_closedateid = coalesce(s.sk_closedateid, d.sk_closedateid), "
         "sk_closetimeid = coalesce(s.sk_closetimeid, d.sk_closetimeid), status = s.status, "
         "type = s.type, tradeprice = s.tradeprice, fee = s.fee, commission = s.commission, "
         "tax = s.tax, batchid = s.batchid")
SET_4 = ("sk_closedateid = coalesce(s.sk_closedateid, d.sk_closedateid), "
         "sk_closetimeid = coalesce(s.sk_closetimeid, d.sk_closetimeid), status = s.status, "
         "type = s.type")


def merge_sql(sets: str, returning: str) -> str:
    values = ", ".join(f"s.{c}" for c in NAMES)
    return (f"MERGE INTO dimtrade AS d USING s ON d.tradeid = s.tradeid "
            f"WHEN MATCHED THEN UPDATE SET {sets} "
            f"WHEN NOT MATCHED AND s.inserts THEN INSERT ({', '.join(NAMES)}) VALUES ({values}) "
            f"{returning}")


_OLD_FIRST = {"sk_brokerid", "sk_createdateid", "sk_createtimeid", "cashflag", "sk_securityid",
              "sk_companyid", "quantity", "bidprice", "sk_customerid", "sk_accountid",
              "executedby"}  # create-time fields: the stored row's when it exists
_NEW_FIRST = {"sk_closedateid", "sk_closetimeid"}  # the event's when it has one


def _new_row_column(c: str) -> str:
    if c in _OLD_FIRST:
        return f"coalesce(d.{c}, s.{c}) AS {c}"
    if c in _NEW_FIRST:
        return f"coalesce(s.{c}, d.{c}) AS {c}"
    return f"s.{c}"


CHANGED_SQL = (f"CREATE OR REPLACE TEMP TABLE changed AS SELECT "
               f"{', '.join(_new_row_column(c) for c in NAMES)} FROM s LEFT JOIN dimtrade d "
               f"ON d.tradeid = s.tradeid WHERE d.tradeid IS NOT NULL OR s.inserts")


def delete_insert(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(CHANGED_SQL)
    con.execute("DELETE FROM dimtrade WHERE tradeid IN (SELECT tradeid FROM s WHERE NOT inserts)")
    con.execute("INSERT INTO dimtrade SELECT * FROM changed")
    con.sql("SELECT * FROM changed").to_arrow_table()


def statement(sql: str, fetch: bool) -> Callable[[duckdb.DuckDBPyConnection], None]:
    def run(con: duckdb.DuckDBPyConnection) -> None:
        if fetch:
            con.sql(sql).to_arrow_table()
        else:
            con.execute(sql)
    return run


MERGE_RETURNING = statement(merge_sql(SET_9, "RETURNING *"), True)  # SP5's own statement

FORMULATIONS: dict[str, Callable[[duckdb.DuckDBPyConnection], None]] = {
    "merge-returning": MERGE_RETURNING,
    "merge-returning-id": statement(merge_sql(SET_9, "RETURNING tradeid"), True),
    "merge": statement(merge_sql(SET_9, ""), False),
    "merge-4-columns": statement(merge_sql(SET_4, "RETURNING *"), True),
    "delete-insert": delete_insert,
    "merge-returning-plain-executedby": MERGE_RETURNING,  # the same write, other STORAGE
}


#: Column storage per formulation (``USING COMPRESSION``); the others keep DuckDB's own choice.
STORAGE: dict[str, dict[str, str]] = {
    "merge-returning-plain-executedby": {"executedby": "uncompressed"}}


def columns(storage: Mapping[str, str]) -> str:
    """``COLUMNS`` with ``USING COMPRESSION`` for the columns ``storage`` names."""
    out = []
    for column in COLUMNS.split(", "):
        name, rest = column.split(" ", 1)
        if name in storage:
            sql_type, keyed, _ = rest.partition(" PRIMARY KEY")
            rest = f"{sql_type} USING COMPRESSION {storage[name]}{keyed}"
        out.append(f"{name} {rest}")
    return ", ".join(out)


def run_case(path: str, write: Callable[[duckdb.DuckDBPyConnection], None], reach: int,
             batches: int, seed: int, storage: Mapping[str, str] | None = None) -> list[float]:
    """Per-batch seconds of ``write`` (BEGIN to COMMIT) over ``batches`` batches."""
    rng = random.Random(seed)
    con = duckdb.connect(path)
    try:
        con.execute("SET checkpoint_threshold = '1TB'")  # checkpoints as the engine does
        con.execute(f"CREATE TABLE dimtrade ({columns(storage or {})})")
        con.execute(f"INSERT INTO dimtrade SELECT * EXCLUDE (inserts) FROM ({INSERTED})",
                    [0, INITIAL_ROWS])
        con.execute("CHECKPOINT")
        following = INITIAL_ROWS
        seconds: list[float] = []
        for b in range(batches):
            updated = rng.sample(range(following - reach, following), UPDATES)
            con.execute(f"CREATE OR REPLACE TEMP TABLE s AS {INSERTED} UNION ALL {UPDATED}",
                        [following, following + INSERTS, updated])
            following += INSERTS
            began = time.perf_counter()
            con.execute("BEGIN")
            write(con)
            con.execute("COMMIT")
            seconds.append(time.perf_counter() - began)
            if b % 100 == 99:
                con.execute("CHECKPOINT")
        rows = con.execute("SELECT count(*), count(DISTINCT tradeid) FROM dimtrade").fetchone()
        assert rows == (following, following), rows  # every insert in, no update duplicated
        return seconds
    finally:
        con.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tpcdi_spread", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="120 batches per case, not 300")
    parser.add_argument("--formulations", nargs="+", choices=list(FORMULATIONS),
                        default=list(FORMULATIONS))
    args = parser.parse_args(argv)
    batches = 120 if args.quick else 300
    console = Console()
    records: list[dict[str, Any]] = []
    plan = [(f, sf) for f in args.formulations for sf in REACHES]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="sstore-spread-") as tmp, \
            Progress(console=console, transient=True) as progress:
        task = progress.add_task("cases", total=len(plan))
        for i, (name, sf) in enumerate(plan):
            seconds = run_case(os.path.join(tmp, f"{i}.duckdb"), FORMULATIONS[name],
                               REACHES[sf], batches, seed=i // len(REACHES),
                               storage=STORAGE.get(name))
            records.append({"formulation": name, "reach": sf, "reach_rows": REACHES[sf],
                            "batches": batches,
                            "ms_last_100": round(statistics.median(seconds[-100:]) * 1e3, 2)})
            progress.advance(task)
    table = Table(title=f"SP5's write per batch ({INSERTS:,} inserts + {UPDATES} updates), "
                        f"median ms over the last 100 of {batches} batches")
    for col in ("formulation", "SF 1 reach (6,500 rows)", "SF 10 reach (65,000 rows)",
                "growth"):
        table.add_column(col, justify="left" if col == "formulation" else "right")
    for name in args.formulations:
        sf1, sf10 = (next(r["ms_last_100"] for r in records
                          if r["formulation"] == name and r["reach"] == sf) for sf in REACHES)
        growth = sf10 / sf1 - 1
        for r in records:
            if r["formulation"] == name:
                r["growth"] = round(growth, 3)
        table.add_row(name, f"{sf1:.1f}", f"{sf10:.1f}", f"{growth:+.0%}")
    console.print(table)
    console.print(f"load average before {', '.join(f'{x:.2f}' for x in load_before)}")
    path = write_results("tpcdi-spread-quick" if args.quick else "tpcdi-spread",
                         {"records": records, "loadavg_before": load_before,
                          "machine": machine_info()})
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
