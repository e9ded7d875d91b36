"""The chaos run (benchmarks.chaos --quick) and the comparison it stands on.

The run itself: TPC-DI DimTrade streamed into a private PostgreSQL while engine workers and
migrators are SIGKILLed, PostgreSQL crashes and restarts, COPY backends are terminated and the
target is reset from scratch; the warehouse must equal an uncrashed run's, row for row.

The comparison is tested on its own, on real warehouses that differ by one row, one duplicate
and one changed value: a chaos run that could not see a loss would prove nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from benchmarks.chaos_compare import compare_warehouses, diff_rows
from benchmarks.chaos_faults import KINDS, make_plan
from sstore.workloads.tpcdi.warehouse import create_warehouse

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------ the comparison
def test_diff_rows_counts_lost_duplicated_and_changed_rows() -> None:
    reference = [(1, "CMPT", Decimal("1.50")), (2, "PNDG", None), (3, "CNCL", Decimal(0))]
    assert diff_rows("t", [0], reference, list(reversed(reference))).lost == 0
    same = diff_rows("t", [0], reference, reference[::-1])
    same.reference_md5 = same.chaos_md5 = "x"
    assert same.identical

    lost = diff_rows("t", [0], reference, reference[:2])
    assert (lost.lost, lost.duplicates, lost.unexpected, lost.lost_keys) == (1, 0, 0, ["3"])
    assert not lost.identical

    duplicated = diff_rows("t", [0], reference, reference + [reference[1]])
    assert (duplicated.lost, duplicated.duplicates, duplicated.unexpected) == (0, 1, 0)
    assert duplicated.duplicate_keys == ["2"]

    changed = diff_rows("t", [0], reference, [reference[0], (2, "CMPT", None), reference[2]])
    assert (changed.lost, changed.duplicates, changed.unexpected) == (1, 0, 1)
    assert changed.lost_keys == changed.unexpected_keys == ["2"]
    # a duplicate in the reference must be matched by a duplicate, not by one row
    twice = diff_rows("t", [0, 1], reference + [reference[0]], reference)
    assert (twice.lost, twice.lost_keys) == (1, [["1", "CMPT"]])


def _fill(url: str, schema: str) -> None:
    create_warehouse(url, schema)
    with psycopg.connect(url) as con:
        for t in (1, 2, 3):
            con.execute(f"INSERT INTO {schema}.dimtrade (tradeid, sk_createdateid, "
                        f"sk_createtimeid, status, type, cashflag, quantity, bidprice, batchid) "
                        f"VALUES (%s, 20170707, 120000, 'Completed', 'Market Buy', true, 10, "
                        f"%s, 1)", (t, Decimal(t) + Decimal("0.25")))
        con.execute(f"INSERT INTO {schema}.dimessages VALUES ('2017-07-07 12:00:00', 1, "
                    f"'DimTrade', 'Invalid trade fee', 'Alert', 'T_ID = 2, T_CHRG = 9.00')")
        con.execute(f"INSERT INTO {schema}.rejects (source_file, batch_id, line_number, "
                    f"raw_line, reason) VALUES ('Trade.txt', 2, 7, 'x|y', 'bad T_QTY')")


def test_compare_warehouses_on_postgres(pg_url: str) -> None:
    _fill(pg_url, "ref")
    _fill(pg_url, "got")
    diffs = {d.table: d for d in compare_warehouses(pg_url, "ref", "got")}
    assert all(d.identical for d in diffs.values())  # rejected_at and reject_id differ: ignored
    assert diffs["dimtrade"].reference_md5 == diffs["dimtrade"].chaos_md5 != ""

    with psycopg.connect(pg_url) as con:
        con.execute("DELETE FROM got.dimtrade WHERE tradeid = 2")
        con.execute("INSERT INTO got.dimessages SELECT * FROM got.dimessages")
        con.execute("UPDATE got.rejects SET reason = 'other'")
    diffs = {d.table: d for d in compare_warehouses(pg_url, "ref", "got")}
    assert (diffs["dimtrade"].lost, diffs["dimtrade"].lost_keys) == (1, ["2"])
    assert diffs["dimessages"].duplicates == 1 and diffs["dimessages"].lost == 0
    assert diffs["rejects"].lost == diffs["rejects"].unexpected == 1
    assert not any(d.identical for d in diffs.values())

    with psycopg.connect(pg_url) as con:
        con.execute("DROP TABLE got.dimtrade")  # a table that is gone lost every row
    lost = next(d for d in compare_warehouses(pg_url, "ref", "got") if d.table == "dimtrade")
    assert (lost.lost, lost.chaos_rows, lost.identical) == (3, 0, False)


def test_plan_is_seeded_and_covers_every_kind() -> None:
    import random

    plan = make_plan(random.Random(5), 10)
    assert plan == make_plan(random.Random(5), 10)
    assert {f.kind for f in plan} == set(KINDS) and len(plan) == 10
    with pytest.raises(ValueError, match="unknown fault kinds"):
        make_plan(random.Random(5), 10, ("engine_kill", "meteor"))


# ------------------------------------------------------------------------------ the run
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_chaos_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    done = subprocess.run([sys.executable, "-m", "benchmarks.chaos", "--quick", "--out",
                           str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False, timeout=880)
    report_path = tmp_path / "chaos-quick.json"
    assert report_path.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    tables = [(t["table"], t["lost"], t["duplicates"], t["unexpected"]) for t in report["tables"]]
    summary = (f"exit {done.returncode}; problems: {report['problems']}; faults: "
               f"{report['faults_by_kind']}; tables: {tables}")
    assert report["faults_injected"] >= 10, summary
    assert set(report["faults_by_kind"]) == set(KINDS), summary
    assert report["duplicates"] == 0 and report["lost"] == 0, summary
    assert report["unexpected"] == 0 and report["identical"], summary
    assert report["rows_in"] > 3000 and report["rejected"] > 0 and report["loaded"] > 1000
    assert done.returncode == 0 and report["ok"], summary
