"""The five DimTrade procedures on the engine, against generated TPC-DI data.

The dimension lookups here are stand-ins (one always-valid row per symbol and account seen in
any Trade file) so that the dataflow's own rules are tested without Spark; the end-to-end test
with the real dimensions compares the streaming and Spark warehouses.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sstore import Engine
from sstore.coalesce import Coalescer
from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.sources import (
    read_audit,
    read_status_type,
    read_trade,
    read_trade_incremental,
    read_trade_type,
)
from sstore.workloads.tpcdi.streaming.events import batch1_events, incremental_events
from sstore.workloads.tpcdi.streaming.procedures import declare


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tpcdi")
    generate(0.01, out, seed=3, bad_rows=7)
    return out


def stand_in_dimensions(engine: Engine, data: Path) -> None:
    batch1 = data / "Batch1"
    engine.load_table("statustype", read_status_type(batch1 / "StatusType.txt").table, "replace")
    engine.load_table("tradetype", read_trade_type(batch1 / "TradeType.txt").table, "replace")
    trades = [read_trade(batch1 / "Trade.txt").table.select(["t_s_symb", "t_ca_id"])] + [
        read_trade_incremental(data / f"Batch{b}" / "Trade.txt").table.select(
            ["t_s_symb", "t_ca_id"]) for b in (2, 3)]
    both = pa.concat_tables(trades)
    bad = json.loads((data / "bad_rows.json").read_text())["rows"]
    unknown = {r["text"].split("|")[{"unknown_symbol": 7, "unknown_account": 10}[r["kind"]]]
               for r in bad if r["kind"] in ("unknown_symbol", "unknown_account")}
    for table, key, names in (("dimsecurity", "t_s_symb", ("sk_securityid", "sk_companyid")),
                              ("dimaccount", "t_ca_id", ("sk_accountid", "sk_customerid",
                                                         "sk_brokerid"))):
        values = [v for v in pc.unique(both[key]).to_pylist() if str(v) not in unknown]
        n = len(values)
        cols = {name: pa.array(range(1, n + 1), pa.int64()) for name in names}
        cols["symbol" if key == "t_s_symb" else "accountid"] = pa.array(values)
        cols.update(effectivedate=pa.array([dt.date(1950, 1, 1)] * n),
                    enddate=pa.array([dt.date(9999, 12, 31)] * n),
                    iscurrent=pa.array([True] * n))
        engine.load_table(table, pa.table(cols), "replace")


def run(engine: Engine, data: Path, batch_size: int) -> list[pa.Table]:
    rejects: list[pa.Table] = []
    engine.subscribe("trade_rejects", lambda _b, t: rejects.append(t))
    batch_id = 0
    for events in (batch1_events(data), incremental_events(data, 2),
                   incremental_events(data, 3)):
        for chunk in events.chunks(batch_size):
            batch_id += 1
            engine.ingest("trade_lines", chunk, batch_id=batch_id)
        engine.run_until_idle()
    return rejects


def audit_value(data: Path, batch: int, attribute: str) -> int:
    audit = read_audit(data).table.to_pylist()
    return sum(r["value"] for r in audit if r["dataset"] == "DimTrade" and
               r["batchid"] == batch and r["attribute"] == attribute)


def test_dimtrade_counts_match_the_audit_files(data: Path, tmp_path: Path) -> None:
    engine = Engine(str(tmp_path / "s.duckdb"))
    declare(engine)
    stand_in_dimensions(engine, data)
    rejects = pa.concat_tables(run(engine, data, batch_size=200))
    q = lambda sql: engine.query(sql).column(0)[0].as_py()
    new = sum(audit_value(data, b, "T_NEW") for b in (1, 2, 3))
    assert q("SELECT count(*) FROM dimtrade") == new
    assert q("SELECT count(DISTINCT tradeid) FROM dimtrade") == new
    canceled = sum(audit_value(data, b, "T_CanceledTrades") for b in (1, 2, 3))
    assert q("SELECT count(*) FROM dimtrade WHERE status = 'Canceled'") == canceled
    assert q("SELECT count(*) FROM dimtrade WHERE sk_closedateid < sk_createdateid") == 0
    # every bad row of the manifest was rejected, nothing else was
    bad = json.loads((data / "bad_rows.json").read_text())
    assert rejects.num_rows == len(bad["rows"]) == 7
    reasons = " ".join(rejects["reason"].to_pylist())
    for word in ("fields", "bad", "unknown status", "unknown trade type", "unknown symbol",
                 "unknown account"):
        assert word in reasons


def test_alerts_and_exactly_once_rerun(data: Path, tmp_path: Path) -> None:
    path = str(tmp_path / "s.duckdb")
    engine = Engine(path)
    declare(engine)
    stand_in_dimensions(engine, data)
    alerts: list[pa.Table] = []
    engine.subscribe("dimessages_out", lambda _b, t: alerts.append(t))
    run(engine, data, batch_size=500)
    messages = pa.concat_tables(alerts)
    for batch in (1, 2, 3):
        per = messages.filter(pc.equal(messages["batchid"], batch))
        texts = per["messagetext"].to_pylist()
        assert texts.count("Invalid trade commission") == audit_value(data, batch,
                                                                      "T_InvalidCommision")
        assert texts.count("Invalid trade fee") == audit_value(data, batch, "T_InvalidCharge")
    before = engine.query("SELECT * FROM dimtrade ORDER BY tradeid")
    engine.close()
    engine = Engine(path)  # a client that re-sends everything after a restart
    declare(engine)
    run(engine, data, batch_size=500)
    assert engine.query("SELECT * FROM dimtrade ORDER BY tradeid").equals(before)
    engine.close()


def test_coalesced_batches_give_the_same_warehouse(data: Path, tmp_path: Path) -> None:
    """The streaming DimTrade may run behind a ``Coalescer`` (``sstore.coalesce``): many small
    batches that waited run as one, and DimTrade, the alerts and the rejects are the same."""
    results = []
    for coalesced in (False, True):
        engine = Engine(str(tmp_path / f"{coalesced}.duckdb"))
        declare(engine)
        stand_in_dimensions(engine, data)
        alerts: list[pa.Table] = []
        engine.subscribe("dimessages_out", lambda _b, t, alerts=alerts: alerts.append(t))
        if not coalesced:
            rejects = run(engine, data, batch_size=40)
        else:
            rejects = []
            engine.subscribe("trade_rejects", lambda _b, t, rejects=rejects: rejects.append(t))
            ids = iter(range(1, 1_000_000))
            coalescer = Coalescer(engine, "trade_lines", lambda _rows, ids=ids: next(ids),
                                  max_pending=100_000)
            offers = 0
            for events in (batch1_events(data), incremental_events(data, 2),
                           incremental_events(data, 3)):
                with engine.lock:  # the coalescer waits for the engine: every offer queues
                    for chunk in events.chunks(40):
                        coalescer.offer(chunk)
                        offers += 1
                assert coalescer.drain(timeout=120)
            coalescer.close()
            assert coalescer.offers == offers > 30
            assert coalescer.batches <= 2 * 3  # per TPC-DI batch: the first offer, the rest
        results.append((engine.query("SELECT * FROM dimtrade ORDER BY tradeid"),
                        _sorted(pa.concat_tables(alerts), "messagedata"),
                        _sorted(pa.concat_tables(rejects), "raw_line")))
        engine.close()
    assert results[0][0].num_rows > 0 and results[0][2].num_rows == 7
    for plain, coalesced in zip(*results):
        assert coalesced.equals(plain)


def _sorted(table: pa.Table, key: str) -> pa.Table:
    return table.sort_by([(key, "ascending")])


GOOD = "I|1|7|2017-07-08 10:00:00|PNDG|TLB|1|SYMB|100|10.50|42|Ann||||"


def with_field(line: str, index: int, value: str) -> str:
    fields = line.split("|")
    fields[index] = value
    return "|".join(fields)


def lines_table(lines: list[str], tpcdi_batch: int = 2, first: int = 1) -> pa.Table:
    return pa.table({"line": lines, "line_no": pa.array(range(first, first + len(lines)),
                                                         pa.int64()),
                     "source": ["Trade.txt"] * len(lines),
                     "tpcdi_batch": pa.array([tpcdi_batch] * len(lines), pa.int32())})


def test_sp1_names_the_first_bad_field_of_each_line() -> None:
    """The parser's reasons, one line per rule: field count first, then field by field
    (missing before bad); optional fields may be empty; fields are trimmed."""
    from sstore.workloads.tpcdi.streaming.parse import PARSE_SQL

    cases = [
        (GOOD, None),
        (" I | 1 | 7 |2017-07-08 10:00:00|PNDG|TLB|1|SYMB|100|10.50|42| Ann |  |||", None),
        (GOOD.rsplit("|", 1)[0], "expected 16 fields, found 15"),
        (GOOD + "|", "expected 16 fields, found 17"),
        ("", "expected 16 fields, found 1"),
        (with_field(GOOD, 0, "X"), "bad CDC_FLAG: X"),
        (with_field(GOOD, 1, " "), "missing CDC_DSN"),
        (with_field(GOOD, 3, "2017-07-08 25:00:00"), "bad T_DTS: 2017-07-08 25:00:00"),
        (with_field(GOOD, 4, ""), "missing T_ST_ID"),
        (with_field(GOOD, 6, "2"), "bad T_IS_CASH: 2"),
        (with_field(GOOD, 8, "99999999999"), "bad T_QTY: 99999999999"),  # over INTEGER
        (with_field(GOOD, 9, "1234567.00"), "bad T_BID_PRICE: 1234567.00"),  # over (8,2)
        (with_field(GOOD, 12, "abc"), "bad T_TRADE_PRICE: abc"),  # optional, but bad
        (with_field(with_field(GOOD, 2, ""), 8, "x"), "missing T_ID"),  # the first one wins
        (with_field(with_field(GOOD, 15, "y"), 13, "x"), "bad T_CHRG: x"),
    ]
    con = duckdb.connect()
    con.register("batch", lines_table([line for line, _ in cases]))
    parsed = con.sql(f"SELECT * FROM ({PARSE_SQL}) ORDER BY line_no").to_arrow_table()
    assert parsed["reason"].to_pylist() == [reason for _, reason in cases]
    fine = parsed.slice(1, 1).to_pylist()[0]
    assert (fine["cdc_flag"], fine["t_id"], fine["t_exec_name"], fine["t_trade_price"]) == \
        ("I", 7, "Ann", None)
    assert parsed.slice(2, 1).to_pylist()[0]["t_id"] is None  # a bad line has no values


FIRST_LINES = [
    "I|1|100|2017-07-08 10:00:00|PNDG|TLB|1|SYMB|100|10.50|42|Ann||||",
    "U|2|200|2017-07-08 10:01:00|CMPT|TLB|1|SYMB|100|10.50|42|Ann|10.40|1.00|2000.00|0.50",
    "U|4|300|2017-07-08 10:02:00|CMPT|TMB|0|SYMB|10|5.00|42|Bob|5.00|60.00|1.00|0.10",
    "I|3|300|2017-07-08 10:00:30|SBMT|TMB|0|SYMB|10|5.00|42|Bob||||",
]
SECOND_LINES = [
    "U|5|100|2017-07-09 11:00:00|CMPT|TLB|1|SYMB|100|10.50|42|Ann|10.40|1.00|1100.00|0.50",
    "U|6|200|2017-07-09 11:01:00|CMPT|TLB|1|SYMB|100|10.50|42|Ann|10.40|1.00|1.00|0.50",
]


def tiny_dimensions(engine: Engine) -> dict[str, list[tuple[int, pa.Table]]]:
    """Declare the dataflow on ``engine`` with one-row dimensions; returns the outputs as they
    come, per stream."""
    declare(engine)
    always = {"effectivedate": [dt.date(1950, 1, 1)], "enddate": [dt.date(9999, 12, 31)],
              "iscurrent": [True]}
    for name, rows in (
            ("statustype", {"st_id": ["PNDG", "SBMT", "CMPT"],
                            "st_name": ["Pending", "Submitted", "Completed"]}),
            ("tradetype", {"tt_id": ["TLB", "TMB"], "tt_name": ["Limit Buy", "Market Buy"]}),
            ("dimsecurity", {"sk_securityid": [5], "sk_companyid": [6], "symbol": ["SYMB"],
                             **always}),
            ("dimaccount", {"sk_accountid": [1], "sk_customerid": [2], "sk_brokerid": [3],
                            "accountid": [42], **always})):
        engine.load_table(name, pa.table(rows), "replace")
    got: dict[str, list[tuple[int, pa.Table]]] = {s: [] for s in (
        "dimtrade_changes", "dimessages_out", "trade_rejects")}
    for stream, tables in got.items():
        engine.subscribe(stream, lambda b, t, tables=tables: tables.append((b, t)))
    return got


def test_sp5_applies_updates_of_known_trades_and_rejects_the_others(tmp_path: Path) -> None:
    """SP5 over two engine batches: an update of a trade inserted in an earlier batch, or
    later in the same batch, is applied; an update of a trade that exists nowhere is
    rejected and raises no alert; alerts only for applied rows. (An update listed before its
    trade's insert is applied: the batch's last event by CDC_DSN wins.)"""
    engine = Engine(str(tmp_path / "s.duckdb"))
    got = tiny_dimensions(engine)
    first, second = FIRST_LINES, SECOND_LINES
    engine.ingest("trade_lines", lines_table(first), batch_id=1)
    engine.ingest("trade_lines", lines_table(second, first=5), batch_id=2)
    engine.run_until_idle()
    changed = {b: sorted(t["tradeid"].to_pylist()) for b, t in got["dimtrade_changes"]}
    assert changed == {1: [100, 300], 2: [100]}
    rejects = pa.concat_tables(t for _, t in got["trade_rejects"])
    assert list(zip(rejects["line_number"].to_pylist(), rejects["reason"].to_pylist())) == [
        (2, "unknown trade (update before any insert)"),
        (6, "unknown trade (update before any insert)")]
    alerts = pa.concat_tables(t for _, t in got["dimessages_out"])
    assert list(zip(alerts["messagetext"].to_pylist(), alerts["messagedata"].to_pylist())) == [
        ("Invalid trade fee", "T_ID = 300, T_CHRG = 60.00"),
        ("Invalid trade commission", "T_ID = 100, T_COMM = 1100.00")]
    rows = {r["tradeid"]: r for r in engine.query("SELECT * FROM dimtrade").to_pylist()}
    assert sorted(rows) == [100, 300]
    assert (rows[100]["status"], rows[100]["sk_createdateid"], rows[100]["sk_closedateid"],
            str(rows[100]["commission"]), rows[100]["batchid"]) == \
        ("Completed", 20170708, 20170709, "1100.00", 2)
    assert (rows[300]["status"], rows[300]["type"], rows[300]["sk_createtimeid"],
            rows[300]["sk_closetimeid"], str(rows[300]["fee"]), rows[300]["sk_brokerid"]) == \
        ("Completed", "Market Buy", 100030, 100200, "60.00", 3)
    engine.close()


def versions(engine: Engine) -> list[tuple[int, int, str]]:
    return [(r["tradeid"], r["version"], r["status"]) for r in engine.query(
        "SELECT tradeid, version, status FROM dimtrade_versions ORDER BY ALL").to_pylist()]


def test_dimtrade_keeps_every_version_and_shows_the_current_one(tmp_path: Path) -> None:
    """SP5 appends a version per trade it changes (never updates in place): trade 100 has
    the version of batch 1 and of batch 2, and the view ``dimtrade`` shows the newest; a
    batch that changes nothing appends nothing."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    tiny_dimensions(engine)
    engine.ingest("trade_lines", lines_table(FIRST_LINES), batch_id=1)
    engine.ingest("trade_lines", lines_table(SECOND_LINES, first=5), batch_id=2)
    engine.ingest("trade_lines", lines_table([SECOND_LINES[1]], first=7), batch_id=3)
    engine.run_until_idle()
    assert versions(engine) == [(100, 1, "Pending"), (100, 2, "Completed"),
                                (300, 1, "Completed")]
    current = engine.query("SELECT tradeid, status, batchid FROM dimtrade ORDER BY tradeid")
    assert current.to_pylist() == [{"tradeid": 100, "status": "Completed", "batchid": 2},
                                   {"tradeid": 300, "status": "Completed", "batchid": 2}]
    engine.close()


def test_a_state_file_with_dimtrade_as_a_table_is_upgraded_to_versions(tmp_path: Path) -> None:
    """A state file written before DimTrade was kept as versions has a table ``dimtrade``:
    at the next start its rows become version 0 and the dataflow goes on from them, with
    the same result as a run that never stopped. (Taken for an existing declaration, the
    view would have been skipped, and the old table would have shown none of the later
    changes, silently.)"""
    path = str(tmp_path / "s.duckdb")
    engine = Engine(path)
    tiny_dimensions(engine)
    engine.ingest("trade_lines", lines_table(FIRST_LINES), batch_id=1)
    engine.run_until_idle()
    before = engine.query("SELECT * FROM dimtrade ORDER BY tradeid")
    engine.close()
    con = duckdb.connect(path)  # the old layout: one table, the trade id its key
    con.execute("CREATE TABLE old AS SELECT * FROM dimtrade")
    con.execute("DROP VIEW dimtrade")
    con.execute("DROP TABLE dimtrade_versions")
    con.execute("CREATE TABLE dimtrade AS SELECT * FROM old WITH NO DATA")
    con.execute("ALTER TABLE dimtrade ADD PRIMARY KEY (tradeid)")
    con.execute("INSERT INTO dimtrade SELECT * FROM old")
    con.execute("DROP TABLE old")
    con.close()

    engine = Engine(path)
    tiny_dimensions(engine)
    assert engine.query("SELECT * FROM dimtrade ORDER BY tradeid").equals(before)
    assert versions(engine) == [(100, 0, "Pending"), (300, 0, "Completed")]
    engine.ingest("trade_lines", lines_table(SECOND_LINES, first=5), batch_id=2)
    engine.run_until_idle()
    assert versions(engine) == [(100, 0, "Pending"), (100, 2, "Completed"),
                                (300, 0, "Completed")]
    row = engine.query("SELECT status, sk_closedateid, commission::VARCHAR AS c FROM dimtrade "
                       "WHERE tradeid = 100").to_pylist()
    assert row == [{"status": "Completed", "sk_closedateid": 20170709, "c": "1100.00"}]
    engine.close()
    engine = Engine(path)  # a start after the upgrade changes nothing
    tiny_dimensions(engine)
    assert len(versions(engine)) == 3
    engine.close()
