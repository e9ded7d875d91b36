"""The five DimTrade procedures on the engine, against generated TPC-DI data.

The dimension lookups here are stand-ins (one always-valid row per symbol and account seen in
any Trade file) so that the dataflow's own rules are tested without Spark; the end-to-end test
with the real dimensions compares the streaming and Spark warehouses.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sstore import Engine
from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.sources import read_audit, read_status_type, read_trade, \
    read_trade_incremental, read_trade_type
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
    q = lambda sql: engine.query(sql).column(0)[0].as_py()  # noqa: E731
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
