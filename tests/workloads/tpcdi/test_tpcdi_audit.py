"""TPC-DI DimTrade audit against real PostgreSQL: a tiny consistent warehouse passes every
check; breaking one thing makes exactly that check fail, in the report and in the CLI."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from sstore.base.sql import ident
from sstore.cli.tpcdi_audit import audit_command
from sstore.workloads.tpcdi.audit import AuditError, run_audit
from sstore.workloads.tpcdi.sources import read_audit
from sstore.workloads.tpcdi.warehouse import (
    TABLES,
    create_warehouse,
    drop_warehouse,
    existing_tables,
    row_count,
    row_counts,
)

HEADER = "DataSet, BatchID ,Date , Attribute , Value, DValue\r\n"
# (batch, T_NEW, T_CanceledTrades, T_InvalidCommision, T_InvalidCharge)
TRADE_AUDIT = ((1, 4, 1, 1, 0), (2, 0, 0, 0, 0), (3, 1, 0, 0, 1))
LAST_DAY = {1: "2017-07-07", 2: "2017-07-08", 3: "2017-07-09"}

DIMENSIONS = """
INSERT INTO {s}.dimdate (sk_dateid, datevalue) VALUES
    (20170705, '2017-07-05'), (20170706, '2017-07-06'), (20170707, '2017-07-07'),
    (20170708, '2017-07-08'), (20170709, '2017-07-09');
INSERT INTO {s}.dimtime (sk_timeid, timevalue) VALUES
    (100000, '10:00:00'), (100500, '10:05:00'), (120000, '12:00:00');
INSERT INTO {s}.statustype VALUES ('CMPT', 'Completed'), ('CNCL', 'Canceled'),
    ('PNDG', 'Pending'), ('SBMT', 'Submitted'), ('ACTV', 'Active'), ('INAC', 'Inactive');
INSERT INTO {s}.tradetype VALUES ('TMB', 'Market Buy', false, true),
    ('TMS', 'Market Sell', true, true), ('TLB', 'Limit Buy', false, false),
    ('TLS', 'Limit Sell', true, false);
INSERT INTO {s}.dimbroker (sk_brokerid, brokerid, firstname, lastname, iscurrent, batchid,
    effectivedate, enddate) VALUES (1, 7, 'Ada', 'Broker', true, 1, '1950-01-01', '9999-12-31');
INSERT INTO {s}.dimcompany (sk_companyid, companyid, status, name, iscurrent, batchid,
    effectivedate, enddate) VALUES
    (10, 42, 'Active', 'Acme Old Name', false, 1, '2000-01-01', '2017-07-06'),
    (11, 42, 'Active', 'Acme', true, 1, '2017-07-06', '9999-12-31');
INSERT INTO {s}.dimsecurity (sk_securityid, symbol, status, sk_companyid, iscurrent, batchid,
    effectivedate, enddate) VALUES
    (20, 'AAAAAAAAAAAADMO', 'Active', 10, false, 1, '2000-01-01', '2017-07-06'),
    (21, 'AAAAAAAAAAAADMO', 'Active', 11, true, 1, '2017-07-06', '9999-12-31');
INSERT INTO {s}.dimcustomer (sk_customerid, customerid, status, iscurrent, batchid,
    effectivedate, enddate) VALUES (30, 0, 'Active', true, 1, '2010-01-01', '9999-12-31');
INSERT INTO {s}.dimaccount (sk_accountid, accountid, sk_brokerid, sk_customerid, status,
    iscurrent, batchid, effectivedate, enddate) VALUES
    (40, 0, 1, 30, 'Active', true, 1, '2010-01-01', '9999-12-31');
"""
# tradeid, create date/time, close date/time, status, type, security, company, commission,
# fee, batch. Trade 4 was created in Batch1 and closed by Batch2; trade 5 is new in Batch3.
TRADES = (
    (1, 20170705, 100000, 20170705, 100500, "Completed", "Market Buy", 20, 10, 99, 1, 1),
    (2, 20170706, 100000, None, None, "Pending", "Limit Buy", 21, 11, None, None, 1),
    (3, 20170705, 120000, 20170706, 100000, "Canceled", "Limit Sell", 20, 10, None, None, 1),
    (4, 20170707, 100000, 20170708, 120000, "Completed", "Limit Buy", 21, 11, 1, 1, 2),
    (5, 20170709, 100000, None, None, "Submitted", "Market Sell", 21, 11, 1, 99, 3),
)
MESSAGES = ((1, "Invalid trade commission", "T_ID = 1, T_COMM = 99.00"),
            (3, "Invalid trade fee", "T_ID = 5, T_CHRG = 99.00"))


def build_warehouse(url: str, schema: str = "tpcdi") -> None:
    create_warehouse(url, schema)
    s = ident(schema)
    with psycopg.connect(url) as con:
        con.execute(DIMENSIONS.format(s=s))
        for t in TRADES:
            con.execute(
                f"INSERT INTO {s}.dimtrade (tradeid, sk_createdateid, sk_createtimeid, "
                f"sk_closedateid, sk_closetimeid, status, type, sk_securityid, sk_companyid, "
                f"commission, fee, batchid, sk_brokerid, sk_customerid, sk_accountid, cashflag, "
                f"quantity, bidprice, executedby, tradeprice) VALUES "
                f"(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 1, 30, 40, false, 10, 5.00, "
                f"'7', 5.00)", t)
        for batch, text, data in MESSAGES:
            con.execute(f"INSERT INTO {s}.dimessages VALUES (now(), %s, 'DimTrade', %s, "
                        f"'Alert', %s)", (batch, text, data))


def write_audit_files(root: Path) -> Path:
    """The audit CSVs as DIGen lays them out: BatchN_audit.csv and BatchN/Trade_audit.csv."""
    for batch, new, canceled, commission, charge in TRADE_AUDIT:
        (root / f"Batch{batch}").mkdir(parents=True, exist_ok=True)
        (root / f"Batch{batch}_audit.csv").write_bytes(
            (HEADER + f"Batch,{batch},1950-01-01,FirstDay,,\r\n"
             f"Batch,{batch},{LAST_DAY[batch]},LastDay,,\r\n").encode())
        (root / f"Batch{batch}" / "Trade_audit.csv").write_bytes(
            (HEADER + f"DimTrade,{batch},,T_Records,{new + 1},\r\n"
             f"DimTrade,{batch},,T_NEW,{new},\r\nDimTrade,{batch},,T_CanceledTrades,{canceled},"
             f"\r\nDimTrade,{batch},,T_InvalidCommision,{commission},\r\n"
             f"DimTrade,{batch},,T_InvalidCharge,{charge},\r\n").encode())
    return root


def failing(report) -> set[str]:
    return {c.name for c in report.checks if c.failed}


@pytest.fixture
def warehouse(pg_url: str, tmp_path: Path) -> tuple[str, Path]:
    build_warehouse(pg_url)
    return pg_url, write_audit_files(tmp_path / "data")


def test_consistent_warehouse_passes_every_check(warehouse: tuple[str, Path]) -> None:
    url, data = warehouse
    report = run_audit(url, data_dir=data)
    assert report.ok and failing(report) == set()
    assert all(c.outcome == "pass" for c in report.checks), report.checks
    by_name = {(c.name, c.batch): c for c in report.checks}
    assert (by_name[("DimTrade row count", None)].observed,
            by_name[("DimTrade row count", None)].expected) == (5, 5)
    assert by_name[("DimTrade canceled trades", None)].expected == 1
    assert by_name[("DImessages DimTrade alerts", 3)].expected == 1
    assert {c.batch for c in report.checks if c.name == "DimTrade date check"} == {1, 2, 3}
    assert len(report.checks) == 24 and "audit files" in report.expectations

    result = CliRunner().invoke(audit_command, ["--postgres", url, "--input", str(data)])
    assert result.exit_code == 0, result.output
    assert "DimTrade SK_AccountID" in result.output and "24 checks: 24 passed" in result.output


BREAKS = {
    "DimTrade distinct keys": [
        "ALTER TABLE {s}.dimtrade DROP CONSTRAINT dimtrade_pkey",
        "UPDATE {s}.dimtrade SET tradeid = 1 WHERE tradeid = 2"],
    "DimTrade SK_BrokerID": ["UPDATE {s}.dimtrade SET sk_brokerid = 999 WHERE tradeid = 2"],
    "DimTrade SK_SecurityID": [  # the security version of the wrong date
        "UPDATE {s}.dimtrade SET sk_securityid = 20 WHERE tradeid = 4"],
    "DimTrade date check": [
        "UPDATE {s}.dimtrade SET sk_createdateid = 20170706 WHERE tradeid = 1",
        "UPDATE {s}.dimtrade SET sk_closedateid = 20170705 WHERE tradeid = 1"],
    "DimTrade canceled trades": ["UPDATE {s}.dimtrade SET status = 'Canceled' WHERE tradeid = 2"],
    "DimTrade Status": ["UPDATE {s}.dimtrade SET status = 'Done' WHERE tradeid = 4"],
    "DimTrade Type": ["UPDATE {s}.dimtrade SET type = 'Limit' WHERE tradeid = 4"],
    "DimTrade SK_CloseTimeID": [
        "UPDATE {s}.dimtrade SET sk_closetimeid = 235959 WHERE tradeid = 3"],
    "DImessages DimTrade alerts": [  # the alert is there, but not from DimTrade
        "UPDATE {s}.dimessages SET messagesource = 'Other' WHERE batchid = 3"],
    "DimTrade row count": ["DELETE FROM {s}.dimtrade WHERE tradeid = 2"],
    "DimTrade batches": ["UPDATE {s}.dimtrade SET batchid = 3 WHERE batchid = 2"],
}


@pytest.mark.parametrize("check", sorted(BREAKS))
def test_one_defect_fails_exactly_its_check(warehouse: tuple[str, Path], check: str) -> None:
    url, data = warehouse
    with psycopg.connect(url) as con:
        for statement in BREAKS[check]:
            con.execute(statement.format(s=ident("tpcdi")))
    report = run_audit(url, data_dir=data)
    assert failing(report) == {check}, [c for c in report.checks if c.failed]
    assert not report.ok and len(report.failed) == 1

    result = CliRunner().invoke(audit_command, ["--postgres", url, "--input", str(data)])
    assert result.exit_code == 1, result.output
    assert "Failed: " + check in result.output and "23 passed, 1 failed" in result.output


def test_failures_show_observed_and_expected(warehouse: tuple[str, Path]) -> None:
    url, data = warehouse
    with psycopg.connect(url) as con:
        con.execute("UPDATE tpcdi.dimtrade SET status = 'Canceled' WHERE tradeid IN (2, 5)")
    check = next(c for c in run_audit(url, data_dir=data).checks
                 if c.name == "DimTrade canceled trades")
    assert (check.outcome, check.observed, check.expected) == ("fail", 3, 1)


def test_expected_numbers_from_the_audit_table(pg_url: str, tmp_path: Path) -> None:
    """Without --input the warehouse's own audit table (Appendix A's Audit) is used; with no
    audit data at all, count checks are skipped, never passed."""
    schema = 'dw "2"'
    build_warehouse(pg_url, schema)
    report = run_audit(pg_url, schema)
    skipped = {c.name for c in report.checks if c.outcome == "skip"}
    assert {"DimTrade row count", "DimTrade canceled trades", "DimTrade commission alerts",
            "DimTrade charge alerts", "DImessages DimTrade alerts"} == skipped
    assert report.ok and report.expectations == "none"

    rows = read_audit(write_audit_files(tmp_path)).table.to_pylist()
    with psycopg.connect(pg_url) as con, con.cursor() as cur:
        cur.executemany(f"INSERT INTO {ident(schema)}.audit VALUES (%(dataset)s, %(batchid)s, "
                        f"%(date)s, %(attribute)s, %(value)s, %(dvalue)s)", rows)
    report = run_audit(pg_url, schema)
    assert all(c.passed for c in report.checks) and "audit" in report.expectations
    with psycopg.connect(pg_url) as con:
        con.execute(f"DELETE FROM {ident(schema)}.dimessages WHERE batchid = 1")
    assert failing(run_audit(pg_url, schema)) == {"DimTrade commission alerts",
                                                  "DImessages DimTrade alerts"}


def test_cli_errors_are_one_line(pg_url: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(audit_command, ["--postgres", pg_url, "--schema", "nothing"])
    assert result.exit_code == 1 and "Error: " in result.output and "dimtrade" in result.output
    with pytest.raises(AuditError):
        run_audit(pg_url, "nothing")
    create_warehouse(pg_url)
    with pytest.raises(AuditError, match="no \\*_audit.csv"):
        run_audit(pg_url, data_dir=tmp_path)
    result = CliRunner().invoke(audit_command, ["--help"])
    assert result.exit_code == 0 and "--postgres" in result.output


def test_warehouse_create_is_rerunnable_and_drop_is_guarded(pg_url: str) -> None:
    create_warehouse(pg_url, "tpcdi")
    with psycopg.connect(pg_url) as con:
        con.execute("INSERT INTO tpcdi.rejects (source_file, batch_id, line_number, raw_line, "
                    "reason) VALUES ('Trade.txt', 1, 3, 'x|y', 'expected 14 fields, found 2')")
    assert create_warehouse(pg_url, "tpcdi") == TABLES          # again: nothing lost
    assert row_count(pg_url, "rejects") == 1
    counts = row_counts(pg_url)
    assert list(counts) == list(TABLES) and counts["rejects"] == 1 and counts["dimtrade"] == 0
    with psycopg.connect(pg_url) as con:
        types = dict(con.execute(
            "SELECT column_name, format_type(atttypid, atttypmod) FROM information_schema.columns "
            "JOIN pg_attribute ON attrelid = 'tpcdi.dimtrade'::regclass AND attname = column_name "
            "WHERE table_schema = 'tpcdi' AND table_name = 'dimtrade'").fetchall())
    assert types["tradeid"] == "bigint" and types["bidprice"] == "numeric(8,2)"
    assert types["fee"] == "numeric(10,2)" and types["sk_closedateid"] == "bigint"
    with pytest.raises(ValueError):
        drop_warehouse(pg_url, "public")
    drop_warehouse(pg_url, "tpcdi")
    assert existing_tables(pg_url, "tpcdi") == set()
