"""DimTrade and DImessages in PySpark (``dimtrade_spark``) against real Spark and PostgreSQL.

One Spark session and one database serve the module. Two generated SF 0.01 data sets: a clean
one, loaded through Batch1..3 into schema ``tpcdi``, and one with ``bad_rows=7`` (every kind of
malformed row) into schema ``bad``. The dimensions come from the dimension builder
(``dimensions``), built once per batch and copied: the two data sets have the same seed and
differ only in the bad Trade.txt rows.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pytest_postgresql.janitor import DatabaseJanitor

from sstore.workloads.tpcdi import dimensions, dimtrade_spark, sources
from sstore.workloads.tpcdi.audit import run_audit
from sstore.workloads.tpcdi.dimtrade_spark import DimTradeLoadError, TradeLoadReport
from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.warehouse import create_warehouse

STATUS = {"Completed", "Canceled", "Pending", "Submitted", "Active"}
TYPES = {"Market Buy", "Market Sell", "Stop Loss", "Limit Sell", "Limit Buy"}


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def db(postgresql_server) -> Iterator[str]:
    """A database of its own for the module (``pg_url`` is per test, too short-lived here)."""
    name = f"dimtrade_spark_{uuid.uuid4().hex[:8]}"
    s = postgresql_server
    with DatabaseJanitor(user=s.user, host=s.host, port=s.port, dbname=name, version=s.version,
                         password=s.password):
        auth = s.user + (f":{s.password}" if s.password else "")
        yield f"postgresql://{auth}@{s.host}:{s.port}/{name}"


@pytest.fixture(scope="module")
def clean_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tpcdi_clean")
    generate(0.01, out, seed=3)
    return out


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tpcdi_bad")
    generate(0.01, out, seed=3, bad_rows=7)
    return out


DIMENSION_TABLES = ("dimdate", "dimtime", "statustype", "tradetype", "industry", "taxrate",
                    "dimbroker", "dimcompany", "dimsecurity", "dimcustomer", "dimaccount")


def build_dimensions(spark, data_dir: Path, url: str, schema: str, batch_id: int) -> None:
    """The dimensions as they are after batch ``batch_id``'s changes."""
    if batch_id == 1:
        dimensions.build_historical(spark, data_dir, url, schema)
    else:
        dimensions.apply_batch(spark, data_dir, url, schema, batch_id)


def copy_dimensions(url: str, source: str, target: str) -> None:
    """The two data sets differ only in bad Trade.txt rows (same seed), so their dimensions
    are the same: build them once and copy."""
    with psycopg.connect(url) as con:
        for t in DIMENSION_TABLES:
            con.execute(f'TRUNCATE "{target}".{t}')
            con.execute(f'INSERT INTO "{target}".{t} SELECT * FROM "{source}".{t}')


# -- the scenario: both data sets through Batch1..3 -------------------------------------------
class Run:
    """What the module's loads did: reports, table snapshots after each batch, outcomes of the
    out-of-order and the failing attempts."""

    def __init__(self, url: str, clean: Path, bad: Path) -> None:
        self.url, self.data = url, {"tpcdi": clean, "bad": bad}
        self.reports: dict[tuple[str, int], TradeLoadReport] = {}
        self.again: dict[tuple[str, int], TradeLoadReport] = {}
        self.after: dict[tuple[str, int], dict] = {}
        self.after_again: dict[tuple[str, int], dict] = {}
        self.out_of_order: Exception | None = None
        self.failed_write: Exception | None = None
        self.before_failure: dict | None = None
        self.after_failure: dict | None = None

    def snapshot(self, schema: str) -> dict:
        with psycopg.connect(self.url) as con:
            def rows(sql: str) -> list[tuple]:
                return con.execute(sql.replace("{s}", f'"{schema}"')).fetchall()
            trades = {r[0]: r for r in rows("SELECT * FROM {s}.dimtrade")}
            names = [d.name for d in con.execute(
                f'SELECT * FROM "{schema}".dimtrade LIMIT 0').description]
            return {"dimtrade": trades, "columns": names,
                    "dimessages": sorted(rows("SELECT * FROM {s}.dimessages")),
                    "rejects": sorted(rows("SELECT source_file, batch_id, line_number, raw_line, "
                                           "reason FROM {s}.rejects WHERE source_file ~ "
                                           "'Trade(History)?[.]txt$'")),
                    "watermark": rows("SELECT batch_id, rows_total FROM sstore.watermarks "
                                      "WHERE target = '" + schema + ".dimtrade'")}


def _load(spark, run: Run, schema: str, batch: int) -> None:
    args = (spark, run.data[schema], run.url, schema)
    load = (lambda: dimtrade_spark.load_historical(*args)) if batch == 1 else \
        (lambda: dimtrade_spark.apply_batch(*args, batch))
    run.reports[schema, batch] = load()
    run.after[schema, batch] = run.snapshot(schema)
    run.again[schema, batch] = load()
    run.after_again[schema, batch] = run.snapshot(schema)


@pytest.fixture(scope="module")
def run(spark, db, clean_data, bad_data) -> Run:
    result = Run(db, clean_data, bad_data)
    for schema in result.data:
        create_warehouse(db, schema)
    for batch in (1, 2, 3):
        build_dimensions(spark, clean_data, db, "tpcdi", batch)
        copy_dimensions(db, "tpcdi", "bad")
        _load(spark, result, "tpcdi", batch)
        if batch == 2:
            try:
                dimtrade_spark.apply_batch(spark, bad_data, db, "bad", 3)
            except DimTradeLoadError as exc:
                result.out_of_order = exc
            result.before_failure = result.snapshot("bad")
            result.failed_write = _failing_batch(spark, result)
            result.after_failure = result.snapshot("bad")
        _load(spark, result, "bad", batch)
    return result


def _failing_batch(spark, run: Run) -> Exception | None:
    """Batch2 into ``bad`` with the transaction failing after DimTrade and DImessages were
    written (on the rejects COPY): nothing of it may stay."""
    real = dimtrade_spark.copy_arrow

    def copy_then_fail(cur, table, rows):
        if table.endswith(".rejects"):
            raise RuntimeError("injected failure")
        return real(cur, table, rows)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dimtrade_spark, "copy_arrow", copy_then_fail)
        try:
            dimtrade_spark.apply_batch(spark, run.data["bad"], run.url, "bad", 2)
        except RuntimeError as exc:
            return exc
    return None


# -- helpers over the source files ------------------------------------------------------------
def audit_value(data: Path, batch: int, attribute: str) -> int:
    rows = sources.read_audit(data).table.to_pylist()
    return sum(r["value"] for r in rows if r["dataset"] == "DimTrade" and r["batchid"] == batch
               and r["attribute"] == attribute)


def lines(path: Path) -> list[str]:
    return [x for x in path.read_text().replace("\r", "").split("\n") if x]


def sk_date(ts: str) -> int:
    return int(ts[:10].replace("-", ""))


def sk_time(ts: str) -> int:
    return int(ts[11:19].replace(":", ""))


def row(snapshot: dict, trade_id: int) -> dict:
    return dict(zip(snapshot["columns"], snapshot["dimtrade"][trade_id], strict=True))


# -- tests ------------------------------------------------------------------------------------
def test_historical_load_gives_one_row_per_trade(run: Run) -> None:
    data, report, after = run.data["tpcdi"], run.reports["tpcdi", 1], run.after["tpcdi", 1]
    new = audit_value(data, 1, "T_NEW")
    assert len(after["dimtrade"]) == new == report.trades_inserted
    history = len(lines(data / "Batch1" / "TradeHistory.txt"))
    assert report.rows_in == history == report.rows_loaded + report.rows_rejected
    assert report.rows_rejected == report.other_rejects == 0
    assert report.alerts == audit_value(data, 1, "T_InvalidCommision") + \
        audit_value(data, 1, "T_InvalidCharge")
    assert {row(after, t)["batchid"] for t in after["dimtrade"]} == {1}
    # Each trade's final Batch1 state is its Trade.txt row; create = its first history row.
    first: dict[int, str] = {}
    for line in lines(data / "Batch1" / "TradeHistory.txt"):
        t_id, dts, _ = line.split("|")
        first[int(t_id)] = min(first.get(int(t_id), dts), dts)
    status = {"CMPT": "Completed", "CNCL": "Canceled", "PNDG": "Pending", "SBMT": "Submitted"}
    for line in lines(data / "Batch1" / "Trade.txt"):
        f = line.split("|")
        r = row(after, int(f[0]))
        assert r["status"] == status[f[2]]
        assert (r["sk_createdateid"], r["sk_createtimeid"]) == (sk_date(first[int(f[0])]),
                                                                sk_time(first[int(f[0])]))
        closed = f[2] in ("CMPT", "CNCL")
        assert (r["sk_closedateid"], r["sk_closetimeid"]) == \
            ((sk_date(f[1]), sk_time(f[1])) if closed else (None, None))
        assert (str(r["quantity"]), str(r["bidprice"]), r["executedby"]) == (f[6], f[7], f[9])
        assert str(r["commission"] if r["commission"] is not None else "") == f[12]


def test_every_row_passes_the_audit(run: Run) -> None:
    """Appendix A over the final tables: counts, unique keys, every SK joins a dimension
    version valid at create, close not before create, names, alerts per batch."""
    for schema, data in run.data.items():
        report = run_audit(run.url, schema, data)
        assert [c for c in report.checks if not c.passed] == [], schema
    with psycopg.connect(run.url) as con:   # the lookups' own rule: EffectiveDate <= d < End
        for dim, key in (("dimsecurity", "sk_securityid"), ("dimaccount", "sk_accountid")):
            bad = con.execute(
                f"SELECT count(*) FROM tpcdi.dimtrade t JOIN tpcdi.dimdate d "
                f"ON d.sk_dateid = t.sk_createdateid WHERE NOT EXISTS (SELECT 1 FROM "
                f"tpcdi.{dim} x WHERE x.{key} = t.{key} AND x.effectivedate <= d.datevalue "
                f"AND d.datevalue < x.enddate)").fetchone()[0]
            assert bad == 0, dim


def test_names_keys_and_dates(run: Run) -> None:
    final = run.after["tpcdi", 3]
    rows = [row(final, t) for t in final["dimtrade"]]
    assert len({r["tradeid"] for r in rows}) == len(rows)
    assert {r["status"] for r in rows} <= STATUS and {r["type"] for r in rows} <= TYPES
    for r in rows:
        if r["sk_closedateid"] is not None:
            assert (r["sk_closedateid"], r["sk_closetimeid"]) >= \
                (r["sk_createdateid"], r["sk_createtimeid"])


def test_canceled_and_alert_counts_per_batch(run: Run) -> None:
    data, final = run.data["tpcdi"], run.after["tpcdi", 3]
    messages = final["dimessages"]
    for b in (1, 2, 3):
        canceled = sum(1 for t in final["dimtrade"]
                       if row(final, t)["status"] == "Canceled" and row(final, t)["batchid"] == b)
        assert canceled == audit_value(data, b, "T_CanceledTrades")
        for text, attribute in (("Invalid trade commission", "T_InvalidCommision"),
                                ("Invalid trade fee", "T_InvalidCharge")):
            mine = [m for m in messages if m[1] == b and m[3] == text]
            assert len(mine) == audit_value(data, b, attribute) > 0
            assert all(m[2] == "DimTrade" and m[4] == "Alert" for m in mine)
        assert run.reports["tpcdi", b].alerts == sum(1 for m in messages if m[1] == b)
    # MessageDateAndTime is the CMPT event's time; values as written in the file (2 decimals)
    for line in lines(data / "Batch1" / "Trade.txt"):
        f = line.split("|")
        gross = float(f[10]) * int(f[6]) if f[10] else None
        for value, name in ((f[12], "T_COMM"), (f[11], "T_CHRG")):
            if gross is not None and float(value) > gross:
                wanted = f"T_ID = {f[0]}, {name} = {value}"
                hits = [m for m in messages if m[5] == wanted]
                assert len(hits) == 1 and str(hits[0][0]) == f[1], wanted


def test_incremental_batches_insert_and_update(run: Run) -> None:
    data = run.data["tpcdi"]
    for b in (2, 3):
        before, after, report = run.after["tpcdi", b - 1], run.after["tpcdi", b], \
            run.reports["tpcdi", b]
        events = [x.split("|") for x in lines(data / f"Batch{b}" / "Trade.txt")]
        assert report.rows_in == len(events) == report.rows_loaded
        new = [e for e in events if e[0] == "I"]
        assert len(new) == audit_value(data, b, "T_NEW") == report.trades_inserted
        assert len(after["dimtrade"]) == len(before["dimtrade"]) + len(new)
        for e in new:
            r = row(after, int(e[2]))
            assert r["batchid"] == b
            assert (r["sk_createdateid"], r["sk_createtimeid"]) == (sk_date(e[3]), sk_time(e[3]))
        changed = {int(e[2]) for e in events if e[0] == "U" and int(e[2]) in before["dimtrade"]}
        assert changed and report.trades_updated == len(changed)
        closing = [e for e in events if e[0] == "U" and int(e[2]) in before["dimtrade"]
                   and e[4] in ("CMPT", "CNCL")]
        assert closing, f"Batch{b} closes no earlier trade"
        for e in closing:
            old, r = row(before, int(e[2])), row(after, int(e[2]))
            assert r["batchid"] == b and r["sk_closedateid"] == sk_date(e[3])
            assert r["sk_closetimeid"] == sk_time(e[3])
            assert r["status"] == ("Completed" if e[4] == "CMPT" else "Canceled")
            for kept in ("sk_createdateid", "sk_createtimeid", "sk_securityid", "sk_companyid",
                         "sk_accountid", "sk_customerid", "sk_brokerid", "quantity"):
                assert r[kept] == old[kept], kept
        untouched = set(before["dimtrade"]) - {int(e[2]) for e in events}
        assert all(after["dimtrade"][t] == before["dimtrade"][t] for t in untouched)


def test_reapplying_a_batch_changes_nothing(run: Run) -> None:
    for key, report in run.again.items():
        assert report.skipped and report.rows_in == 0, key
        assert run.after_again[key] == run.after[key], key
    assert run.after["tpcdi", 3]["watermark"][0][0] == 3


def test_batches_apply_in_order_and_all_or_nothing(run: Run) -> None:
    assert isinstance(run.out_of_order, DimTradeLoadError)
    assert "batch 3 cannot be applied before batch 2" in str(run.out_of_order)
    assert isinstance(run.failed_write, RuntimeError)
    assert run.after_failure == run.before_failure
    assert run.after["bad", 2]["watermark"][0][0] == 2     # and the retry went through


def test_bad_rows_land_in_rejects_with_their_reasons(run: Run) -> None:
    data = run.data["bad"]
    manifest = json.loads((data / "bad_rows.json").read_text())["rows"]
    assert {r["kind"] for r in manifest} == set(KIND_REASONS)
    rejects = run.after["bad", 3]["rejects"]
    assert len(rejects) == len(manifest)
    for bad, (path, batch, line, raw, reason) in zip(
            sorted(manifest, key=lambda r: (r["batch"], r["line"])), rejects, strict=True):
        assert (path.endswith(bad["file"]), batch, line, raw) == (True, bad["batch"],
                                                                  bad["line"], bad["text"])
        assert KIND_REASONS[bad["kind"]] in reason, (bad, reason)
        assert bad["t_id"] not in run.after["bad", 3]["dimtrade"]
    for b in (1, 2, 3):
        report = run.reports["bad", b]
        assert report.rows_in == report.rows_loaded + report.rows_rejected
        assert report.rows_rejected == sum(1 for r in manifest if r["batch"] == b)
    # The bad rows changed nothing else: the same tables as from the clean data set.
    for table in ("dimtrade", "dimessages"):
        assert run.after["bad", 3][table] == run.after["tpcdi", 3][table]


KIND_REASONS = {"field_count": "expected 16 fields", "bad_number": "unparsable T_",
                "bad_date": "unparsable T_DTS", "unknown_status": "unknown T_ST_ID 'XXXX'",
                "unknown_type": "unknown T_TT_ID 'TXX'",
                "unknown_symbol": "no DimSecurity row for T_S_SYMB",
                "unknown_account": "no DimAccount row for T_CA_ID"}


def test_hand_written_edge_cases(spark, run: Run, tmp_path: Path) -> None:
    """Batch1 lines that make no trade, an update before its insert, an insert for a trade
    that exists: what docs/tpcdi.md rules 2-5 say, on a few hand-written lines."""
    clean = run.data["tpcdi"]
    history = [x.split("|") for x in lines(clean / "Batch1" / "TradeHistory.txt")]
    ref = next(t for t in lines(clean / "Batch1" / "Trade.txt")
               if t.split("|")[3] in ("TLB", "TLS")
               and any(h[0] == t.split("|")[0] and h[2] == "PNDG" and h[1][11:13] < "20"
                       for h in history)).split("|")
    t0 = dt.datetime.fromisoformat(next(h[1] for h in history if h[0] == ref[0]))
    symbol, account = ref[5], ref[8]

    def at(seconds: int) -> str:
        return str(t0 + dt.timedelta(seconds=seconds))

    def trade(*fields: object) -> str:
        return "|".join(str(f) for f in fields)

    folder = tmp_path / "Batch1"
    folder.mkdir()
    for name in ("StatusType.txt", "TradeType.txt"):
        (folder / name).write_bytes((clean / "Batch1" / name).read_bytes())
    (folder / "Trade.txt").write_text("\n".join([
        trade(1, at(2), "CMPT", "TLB", 0, symbol, 100, "5.00", account, 7, "5.10", "1.00",
              "600.00", "10.00"),
        trade(2, at(3), "PNDG", "TLS", 1, symbol, 200, "6.00", account, 7, "", "", "", ""),
        trade(2, at(3), "PNDG", "TLS", 1, symbol, 999, "6.00", account, 7, "", "", "", ""),
        trade(3, at(4), "PNDG", "TLB", 0, symbol, 10, "1.00", account, 7, "", "", "", ""),
        trade(5, at(5), "PNDG", "TLB", 0, symbol, "1x0", "1.00", account, 7, "", "", "", ""),
        trade(6, at(6), "SBMT", "TLB", 0, symbol, 10, "1.00", account, 7, "", "", "", "")]) + "\n")
    (folder / "TradeHistory.txt").write_text("\n".join([
        trade(1, at(0), "PNDG"), trade(1, at(1), "SBMT"), trade(1, at(2), "CMPT"),
        trade(2, at(3), "PNDG"), trade(4, at(4), "PNDG"), trade(5, at(5), "PNDG"),
        trade(6, at(6), "SBMT"), trade(7, "yesterday", "PNDG")]) + "\n")
    (tmp_path / "Batch2").mkdir()
    fixed = ("TLB", 0, symbol, 50, "2.00", account, 7)
    (tmp_path / "Batch2" / "Trade.txt").write_text("\n".join([
        trade("U", 8, 2, at(10), "CNCL", "TLS", 1, symbol, 200, "6.00", account, 7, "", "", "",
              ""),
        trade("U", 44, 11, at(11), "SBMT", *fixed, "", "", "", ""),
        trade("I", 45, 11, at(12), "PNDG", *fixed, "", "", "", ""),
        trade("I", 4, 1, at(13), "SBMT", "TMB", 1, symbol, 77, "9.99", account, 7, "", "", "",
              ""),
        trade("I", 49, 12, at(14), "SBMT", "TMB", 0, symbol, 10, "1.00", account, 7, "", "",
              "", ""),
        trade("U", 50, 12, at(15), "CMPT", "TMB", 0, symbol, 10, "1.00", account, 7, "1.00",
              "0.01", "20.00", "0.10")]) + "\n")
    create_warehouse(run.url, "tiny")
    copy_dimensions(run.url, "tpcdi", "tiny")

    first = dimtrade_spark.load_historical(spark, tmp_path, run.url, "tiny")
    assert (first.rows_in, first.rows_loaded, first.rows_rejected, first.other_rejects,
            first.alerts, first.trades_inserted) == (8, 4, 4, 3, 1, 2)
    after1 = run.snapshot("tiny")
    t1, t2 = row(after1, 1), row(after1, 2)
    assert (t1["status"], t1["quantity"], t1["sk_createtimeid"], t1["sk_closetimeid"]) == \
        ("Completed", 100, sk_time(at(0)), sk_time(at(2)))
    assert (t2["status"], t2["quantity"], t2["cashflag"], t2["sk_closedateid"]) == \
        ("Pending", 200, True, None)
    assert [(m[0], m[5]) for m in after1["dimessages"]] == \
        [(t0 + dt.timedelta(seconds=2), "T_ID = 1, T_COMM = 600.00")]
    reasons = {(Path(r[0]).name, r[2]): r[4] for r in after1["rejects"]}
    assert set(reasons) == {("Trade.txt", 3), ("Trade.txt", 4), ("Trade.txt", 5),
                            ("TradeHistory.txt", 5), ("TradeHistory.txt", 6),
                            ("TradeHistory.txt", 7), ("TradeHistory.txt", 8)}
    assert "duplicate T_ID 2" in reasons["Trade.txt", 3]
    assert "trade 3 has no TradeHistory.txt row" in reasons["Trade.txt", 4]
    assert "unparsable T_QTY" in reasons["Trade.txt", 5]
    assert "trade 4 has no valid Trade.txt row" in reasons["TradeHistory.txt", 5]
    assert "trade 5 has no valid Trade.txt row" in reasons["TradeHistory.txt", 6]
    assert "U event for trade 6, which does not exist" in reasons["TradeHistory.txt", 7]
    assert "unparsable TH_DTS" in reasons["TradeHistory.txt", 8]

    second = dimtrade_spark.apply_batch(spark, tmp_path, run.url, "tiny", 2)
    assert (second.rows_in, second.rows_loaded, second.rows_rejected, second.alerts,
            second.trades_inserted, second.trades_updated) == (6, 5, 1, 1, 2, 2)
    after2 = run.snapshot("tiny")
    assert set(after2["dimtrade"]) == {1, 2, 11, 12}
    t1, t2, t11, t12 = (row(after2, t) for t in (1, 2, 11, 12))
    # An I event for a trade that exists acts by rule 3 only: create fields and SKs stay.
    assert (t1["status"], t1["type"], t1["tradeprice"], t1["batchid"]) == \
        ("Submitted", "Market Buy", None, 2)
    assert {c: t1[c] for c in after1["columns"] if c not in
            ("status", "type", "tradeprice", "fee", "commission", "tax", "batchid")} == \
        {c: v for c, v in row(after1, 1).items() if c in t1 and c not in
         ("status", "type", "tradeprice", "fee", "commission", "tax", "batchid")}
    assert (t2["status"], t2["sk_closetimeid"], t2["batchid"]) == ("Canceled", sk_time(at(10)), 2)
    # The U event of trade 11 comes before its I event (CDC_DSN order): refused.
    assert (t11["status"], t11["sk_createtimeid"]) == ("Pending", sk_time(at(12)))
    assert [r[4] for r in after2["rejects"] if r[1] == 2] == \
        ["U event for trade 11, which does not exist"]
    assert (t12["status"], t12["sk_createtimeid"], t12["sk_closetimeid"]) == \
        ("Completed", sk_time(at(14)), sk_time(at(15)))
    assert [m[5] for m in after2["dimessages"] if m[1] == 2] == ["T_ID = 12, T_COMM = 20.00"]

    (tmp_path / "Batch3").mkdir()      # an empty batch is a batch: applied, changes nothing
    (tmp_path / "Batch3" / "Trade.txt").write_text("")
    third = dimtrade_spark.apply_batch(spark, tmp_path, run.url, "tiny", 3)
    assert (third.rows_in, third.rows_loaded, third.skipped) == (0, 0, False)
    after3 = run.snapshot("tiny")
    assert after3.pop("watermark") == [(3, 2 + 4)]   # batch 3, DimTrade rows written
    assert after3 == {k: v for k, v in after2.items() if k != "watermark"}
