"""The TPC-DI source generator, checked on real files: names and layouts (CRLF, field counts,
FINWIRE positions), determinism, scaling, trade lifecycles and CDC, referential integrity at
trade time, the cases DimTrade must handle (alerts, a security changing company, changing
dimensions), audit counts recomputed from the data, and injected bad rows.

The checks parse the files independently of the generator's own code (positions and rules are
restated here from the layouts document), so a generator bug cannot hide behind itself.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import re
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from sstore.cli.tpcdi_generate import generate_command
from sstore.workloads.tpcdi.generator import GenerationReport, generate
from sstore.workloads.tpcdi.generator.audit import hundred_years_before
from sstore.workloads.tpcdi.generator.finwire_layout import parse_record

SF = 0.02
SEED = 7
NS = "{http://www.tpc.org/tpc-di}"
BATCH_DATES = {1: dt.date(2017, 7, 7), 2: dt.date(2017, 7, 8), 3: dt.date(2017, 7, 9)}
TRADES_FIRST = dt.date(2012, 7, 7)
LIMIT, MARKET = ("TLB", "TLS"), ("TMB", "TMS")
VALID_SEQUENCES = {
    "limit": (("PNDG",), ("PNDG", "SBMT"), ("PNDG", "SBMT", "CMPT"), ("PNDG", "CNCL")),
    "market": (("SBMT",), ("SBMT", "CMPT")),
}
FIELD_COUNTS = {
    "StatusType.txt": 2, "TradeType.txt": 4, "Date.txt": 18, "Time.txt": 10,
    "Industry.txt": 3, "TaxRate.txt": 3, "BatchDate.txt": 1,
}


# -- reading ----------------------------------------------------------------------------------
def lines_of(path: Path) -> list[str]:
    """Lines of a DIGen-style file, asserting CRLF everywhere."""
    raw = path.read_bytes()
    assert raw == b"" or raw.endswith(b"\r\n"), path
    assert raw.count(b"\n") == raw.count(b"\r\n"), f"{path}: bare LF"
    text = raw.decode("utf-8")
    return text.split("\r\n")[:-1] if text else []


def rows_of(path: Path, sep: str = "|") -> list[list[str]]:
    return [line.split(sep) for line in lines_of(path)]


def ts(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S")


def pts(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y%m%d-%H%M%S")


def cents(text: str) -> int:
    whole, frac = text.split(".")
    assert len(frac) == 2, text
    return int(whole) * 100 + int(frac)


@dataclass
class Trade:
    """A trade as the files show it: unchanging fields and (state, time, batch) steps."""

    t_id: int
    fields: tuple[str, ...]  # T_TT_ID .. T_EXEC_NAME
    steps: list[tuple[str, dt.datetime, int]] = field(default_factory=list)

    @property
    def type(self) -> str:
        return self.fields[0]

    @property
    def symbol(self) -> str:
        return self.fields[2]

    @property
    def account(self) -> int:
        return int(self.fields[5])

    @property
    def created(self) -> dt.datetime:
        return self.steps[0][1]


@dataclass
class Data:
    """One generated data set, parsed."""

    root: Path
    report: GenerationReport
    trade1: list[list[str]]
    history: list[list[str]]
    cdc: dict[int, list[list[str]]]
    cmp: list[dict[str, str]]
    sec: list[dict[str, str]]
    fin_count: int
    actions: list[ET.Element]
    brokers: set[str]
    trades: dict[int, Trade]


def parse(root: Path, report: GenerationReport, skip_lines: dict[int, set[int]] | None = None
          ) -> Data:
    b1 = root / "Batch1"
    cmp: list[dict[str, str]] = []
    sec: list[dict[str, str]] = []
    fin = 0
    for path in sorted(b1.glob("FINWIRE[12][0-9][0-9][0-9]Q[1-4]")):
        for line in lines_of(path):
            kind = line[15:18]
            record = {"PTS": line[:15], "len": str(len(line)), "file": path.name}
            if kind == "CMP":
                record |= {"name": line[18:78].strip(), "cik": line[78:88], "status": line[88:92]}
                cmp.append(record)
            elif kind == "SEC":
                record |= {"symbol": line[18:33], "status": line[39:43], "name": line[43:113],
                           "company": line[160:220].strip()}
                sec.append(record)
            else:
                assert kind == "FIN", line[:20]
                fin += 1
    actions = list(ET.parse(b1 / "CustomerMgmt.xml").getroot())
    hr = rows_of(b1 / "HR.csv", ",")
    brokers = {r[0] for r in hr if r[5] == "314"}
    trade1 = rows_of(b1 / "Trade.txt")
    history = rows_of(b1 / "TradeHistory.txt")
    cdc = {}
    for b in (2, 3):
        skip = (skip_lines or {}).get(b, set())
        cdc[b] = [r for i, r in enumerate(rows_of(root / f"Batch{b}" / "Trade.txt"), start=1)
                  if i not in skip]
    trades: dict[int, Trade] = {}
    for r in trade1:
        trades[int(r[0])] = Trade(int(r[0]), tuple(r[3:10]))
    for t_id, when, state in history:
        trades[int(t_id)].steps.append((state, ts(when), 1))
    for b in (2, 3):
        for r in cdc[b]:
            t_id = int(r[2])
            if r[0] == "I":
                assert t_id not in trades
                trades[t_id] = Trade(t_id, tuple(r[5:12]))
            assert trades[t_id].fields == tuple(r[5:12]), "unchanging fields changed"
            trades[t_id].steps.append((r[4], ts(r[3]), b))
    return Data(root, report, trade1, history, cdc, cmp, sec, fin, actions, brokers, trades)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Data:
    root = tmp_path_factory.mktemp("tpcdi")
    return parse(root, generate(SF, root, seed=SEED))


# -- names and layouts ------------------------------------------------------------------------
def quarters() -> list[str]:
    """DIGen's 203 quarters: 1967Q1 .. 2017Q3 (the last one ends with Batch1)."""
    return [f"{y}Q{q}" for y in range(1967, 2018) for q in range(1, 5)][:203]


def test_every_file_is_there_with_its_layout(data: Data) -> None:
    root = data.root
    expected = {f"Batch1/{name}" for name in FIELD_COUNTS} | {
        "Batch1/HR.csv", "Batch1/CustomerMgmt.xml", "Batch1/Trade.txt",
        "Batch1/TradeHistory.txt", "Batch2/BatchDate.txt", "Batch3/BatchDate.txt",
        "Batch1_audit.csv", "Batch2_audit.csv", "Batch3_audit.csv", "Generator_audit.csv",
        "Batch1/Trade_audit.csv", "Batch1/TradeHistory_audit.csv", "Batch1/HR_audit.csv",
        "Batch1/CustomerMgmt_audit.csv", "bad_rows.json"}
    expected |= {f"Batch1/FINWIRE{q}" for q in quarters()}
    expected |= {f"Batch1/FINWIRE{q}_audit.csv" for q in quarters()}
    expected |= {f"Batch1/{name}_audit.csv" for name in ("Date", "Time", "StatusType",
                                                         "TradeType", "Industry", "TaxRate")}
    for b in (2, 3):
        expected |= {f"Batch{b}/{n}" for n in ("Trade.txt", "Customer.txt", "Account.txt",
                                               "Trade_audit.csv", "Customer_audit.csv",
                                               "Account_audit.csv")}
    written = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert written == expected
    assert {f.path for f in data.report.files} == expected
    assert quarters()[0] == "1967Q1" and quarters()[-1] == "2017Q3"

    counts = dict(FIELD_COUNTS, **{"Trade.txt": 14, "TradeHistory.txt": 3})
    for name, n in counts.items():
        rows = rows_of(root / "Batch1" / name)
        assert rows and all(len(r) == n for r in rows), name
        assert data.report.file(f"Batch1/{name}").rows == len(rows)
    for b in (1, 2, 3):
        assert lines_of(root / f"Batch{b}/BatchDate.txt") == [BATCH_DATES[b].isoformat()]
    for b in (2, 3):
        for name, n in (("Trade.txt", 16), ("Customer.txt", 33), ("Account.txt", 8)):
            rows = rows_of(root / f"Batch{b}" / name)
            assert rows and all(len(r) == n for r in rows), (b, name)
            assert rows[0][0] in "IU" and not rows[0][1].isalpha()  # no header
    assert all(len(r) == 9 for r in rows_of(root / "Batch1/HR.csv", ","))
    assert not data.trade1[0][0].isalpha() and not data.history[0][0].isalpha()


def test_reference_files(data: Data) -> None:
    b1 = data.root / "Batch1"
    dates = lines_of(b1 / "Date.txt")
    assert len(dates) == 25_933
    assert dates[0] == ("19500101|1950-01-01|January 1, 1950|1950|1950|19501|1950 Q1|19501|"
                        "1950 January|19501|1950-W1|7|Sunday|1950|1950|19503|1950 Q3|true")
    by_day = {line[:8]: line.split("|") for line in dates}
    assert by_day["19501231"][9:11] == ["19501", "1950-W1"]
    assert by_day["19501225"][17] == "true" and by_day["19501001"][17] == "false"
    assert by_day["20170707"][7] == "20177" and dates[-1].startswith("20201231|")
    times = rows_of(b1 / "Time.txt")
    assert len(times) == 86_400 and times[0][0] == "000000"
    by_time = {r[0]: r for r in times}
    assert by_time["093000"][8:] == ["true", "true"] and by_time["092959"][8] == "false"
    assert by_time["170000"][9] == "true" and by_time["170001"][9] == "false"
    assert by_time["235959"][:2] == ["235959", "23:59:59"]
    assert [r[0] for r in rows_of(b1 / "StatusType.txt")] == [
        "ACTV", "CMPT", "CNCL", "PNDG", "SBMT", "INAC"]
    assert rows_of(b1 / "TradeType.txt")[0] == ["TMB", "Market Buy", "0", "1"]
    industries = rows_of(b1 / "Industry.txt")
    assert len(industries) == 102 and len({r[0] for r in industries}) == 102
    assert all(len(r[0]) == 2 for r in industries)
    rates = rows_of(b1 / "TaxRate.txt")
    assert len(rates) == 320 and all(re.fullmatch(r"\d\.\d{5}", r[2]) for r in rates)


def test_finwire_records_parse_back_by_position(data: Data) -> None:
    for name in (f"FINWIRE{q}" for q in quarters()):
        lines = lines_of(data.root / "Batch1" / name)
        year, q = int(name[7:11]), int(name[12])
        start = dt.datetime(year, 3 * q - 2, 1)
        end = dt.datetime(year + (q == 4), 1 if q == 4 else 3 * q + 1, 1)
        stamps = [pts(line[:15]) for line in lines]
        assert stamps == sorted(stamps) and all(start <= s < end for s in stamps), name
        for line in lines:
            kind = line[15:18]
            assert len(line) in {"CMP": (543,), "SEC": (170, 220), "FIN": (196, 246)}[kind]
            parsed = parse_record(line + "\r\n")
            if kind == "CMP":
                assert re.fullmatch(r"\d{10}", line[78:88]) and line[88:92] in ("ACTV", "INAC")
                assert parsed["CIK"] == line[78:88]
                assert 15 <= len(line[18:78].strip()) <= 60
            elif kind == "SEC":
                assert re.fullmatch(r"[A-Z]{15}", line[18:33])
                assert line[33:39].strip() in ("COMMON", "PREF_A", "PREF_B", "PREF_C", "PREF_D")
                assert 100_000 <= int(line[119:132]) <= 1_000_000_000
                assert dt.datetime.strptime(line[132:140], "%Y%m%d")
                assert 0 <= cents(line[148:160].strip()) <= 300
                company = line[160:].strip()
                assert (len(line) == 170) == bool(re.fullmatch(r"\d{10}", company))
                assert parsed["Symbol"] == line[18:33] and parsed["CoNameOrCIK"] == company
            else:
                assert int(line[18:22]) == year and int(line[22]) == q
                assert line[23:31] == start.strftime("%Y%m%d") and line[31:39] == line[:8]
                assert parsed["Revenue"] == line[39:56].strip()
                float(line[39:56]), float(line[73:85]), int(line[160:173])
    assert data.cmp and data.sec and data.fin_count


def test_security_records_name_existing_active_companies(data: Data) -> None:
    by_name = {c["name"]: c["cik"] for c in data.cmp}
    assert len(by_name) == len({c["cik"] for c in data.cmp}), "a name per CIK, unique"
    cmp_by_cik: dict[str, list[dict[str, str]]] = defaultdict(list)
    for c in data.cmp:
        cmp_by_cik[c["cik"]].append(c)
    for s in data.sec:
        cik = s["company"] if s["company"].isdigit() else by_name[s["company"]]
        earlier = [c for c in cmp_by_cik[cik] if pts(c["PTS"]) < pts(s["PTS"])]
        assert earlier and earlier[-1]["status"] == "ACTV"
        assert pts(earlier[0]["PTS"]).date() < pts(s["PTS"]).date()


def test_customer_mgmt_xml(data: Data) -> None:
    root = ET.parse(data.root / "Batch1/CustomerMgmt.xml").getroot()
    assert root.tag == f"{NS}Actions"
    assert all(a.tag == f"{NS}Action" for a in root)
    assert (data.root / "Batch1/CustomerMgmt.xml").read_bytes().startswith(
        b'<?xml version="1.0" encoding="UTF-8"?>\r\n<TPCDI:Actions xmlns:TPCDI=')
    kinds = Counter(a.get("ActionType") for a in data.actions)
    assert set(kinds) == {"NEW", "ADDACCT", "UPDACCT", "CLOSEACCT", "UPDCUST", "INACT"}
    stamps = [a.get("ActionTS") for a in data.actions]
    assert stamps == sorted(stamps) and stamps[0] >= "2007-07-07T00:00:00"
    assert stamps[-1] <= "2017-07-07T23:59:59"
    customers, accounts = -1, -1
    for a in data.actions:
        kind, customer = a.get("ActionType"), a.find("Customer")
        assert customer is not None and len(a) == 1
        c_id = int(customer.get("C_ID"))
        account = customer.find("Account")
        if kind == "NEW":
            assert c_id == customers + 1
            customers = c_id
            assert {"C_TAX_ID", "C_GNDR", "C_DOB"} <= set(customer.attrib)
            assert customer.get("C_TIER", "") in ("", "1", "2", "3")   # DIGen leaves 5% empty
            assert [c.tag for c in customer] == ["Name", "Address", "ContactInfo", "TaxInfo",
                                                 "Account"]
        else:
            assert c_id <= customers
        if kind in ("NEW", "ADDACCT"):
            assert int(account.get("CA_ID")) == accounts + 1
            accounts += 1
            assert account.findtext("CA_B_ID") in data.brokers
            assert account.get("CA_TAX_ST") in ("0", "1", "2")
        elif kind == "UPDACCT":
            assert int(account.get("CA_ID")) <= accounts
            assert "CA_TAX_ST" in account.attrib or len(account)
            assert account.findtext("CA_B_ID") in data.brokers | {None}
        elif kind == "CLOSEACCT":
            assert set(account.attrib) == {"CA_ID"} and len(account) == 0
        elif kind == "UPDCUST":
            assert account is None and (len(customer) or len(customer.attrib) > 1)
        else:
            assert kind == "INACT" and len(customer) == 0 and set(customer.attrib) == {"C_ID"}


# -- determinism and scaling ------------------------------------------------------------------
def test_same_seed_gives_byte_identical_files(data: Data, tmp_path: Path) -> None:
    again = generate(SF, tmp_path / "again", seed=SEED)
    for f in data.report.files:
        assert (data.root / f.path).read_bytes() == (again.output / f.path).read_bytes(), f.path
    other = generate(SF, tmp_path / "other", seed=SEED + 1)
    assert (other.output / "Batch1/Trade.txt").read_bytes() != \
        (data.root / "Batch1/Trade.txt").read_bytes()


def test_trade_counts_scale_with_the_scale_factor(data: Data, tmp_path: Path) -> None:
    big = generate(0.1, tmp_path / "big", seed=SEED)
    for report, sf in ((data.report, SF), (big, 0.1)):
        assert len(rows_of(report.output / "Batch1/Trade.txt")) == round(130_000 * sf)
        history = len(rows_of(report.output / "Batch1/TradeHistory.txt"))
        assert 2.3 < history / (130_000 * sf) < 2.7
        for b in (2, 3):
            rows = rows_of(report.output / f"Batch{b}/Trade.txt")
            new = sum(r[0] == "I" for r in rows)
            assert new == max(5, math.ceil(130_000 * sf / 1830))
            assert report.trades[b].new == new and report.trades[b].records == len(rows)
    assert big.trades[2].records > data.report.trades[2].records


# -- lifecycles -------------------------------------------------------------------------------
def check_lifecycle(trade: Trade) -> None:
    states = tuple(s for s, _, _ in trade.steps)
    kind = "limit" if trade.type in LIMIT else "market"
    assert trade.type in LIMIT + MARKET
    assert states in VALID_SEQUENCES[kind], (trade.t_id, states)
    times = [t for _, t, _ in trade.steps]
    assert times == sorted(times) and len(set(times)) == len(times)
    for (s1, t1, _), (s2, t2, _) in zip(trade.steps, trade.steps[1:]):
        gap = (t2 - t1).total_seconds()
        if s2 == "CMPT":
            assert 1 <= gap <= 300, (trade.t_id, s1, s2, gap)
        else:
            assert 1 <= gap <= 90 * 86_400
    batches = [b for _, _, b in trade.steps]
    assert batches == sorted(batches)
    for _state, when, batch in trade.steps:
        assert when.date() <= BATCH_DATES[batch]
        if batch > 1:
            assert when.date() == BATCH_DATES[batch]


def test_batch1_lifecycles(data: Data) -> None:
    assert [int(r[0]) for r in data.trade1] == list(range(len(data.trade1)))
    history_ids = [int(r[0]) for r in data.history]
    assert history_ids == sorted(history_ids)
    for r in data.trade1:
        trade = data.trades[int(r[0])]
        batch1 = [s for s in trade.steps if s[2] == 1]
        assert batch1, "every Batch1 trade has history"
        last_state, last_time, _ = batch1[-1]
        assert (r[2], ts(r[1])) == (last_state, last_time)
        assert TRADES_FIRST <= trade.created.date() <= BATCH_DATES[1]
        assert (r[2] == "CMPT") == all(r[10:14]), "amounts only when completed"
        assert r[2] == "CMPT" or r[10:14] == ["", "", "", ""]
        assert 10 <= int(r[6]) <= 10_000 and 101 <= cents(r[7]) <= 1_000 and r[4] in "01"
    for trade in data.trades.values():
        check_lifecycle(trade)
    canceled = sum(r[2] == "CNCL" for r in data.trade1)
    assert 0.03 < canceled / len(data.trade1) < 0.09


def test_incremental_cdc(data: Data) -> None:
    batch1_max = max(int(r[0]) for r in data.trade1)
    seen = {int(r[0]) for r in data.trade1}
    previous_new_max = batch1_max
    for b in (2, 3):
        rows = data.cdc[b]
        dsn = [int(r[1]) for r in rows]
        assert dsn == sorted(dsn) and len(set(dsn)) == len(dsn), "CDC_DSN increasing"
        new = [int(r[2]) for r in rows if r[0] == "I"]
        assert new and min(new) > previous_new_max and new == sorted(new)
        previous_new_max = max(new)
        for r in rows:
            t_id, state = int(r[2]), r[4]
            assert ts(r[3]).date() == BATCH_DATES[b]
            if r[0] == "I":
                assert t_id not in seen
                assert state == ("PNDG" if r[5] in LIMIT else "SBMT")
            else:
                assert r[0] == "U" and t_id in seen and state in ("SBMT", "CNCL", "CMPT")
            seen.add(t_id)
            assert (state == "CMPT") == all(r[12:16])
        updates_of_batch1 = {int(r[2]) for r in rows if r[0] == "U" and int(r[2]) <= batch1_max}
        assert updates_of_batch1, f"Batch{b} continues trades that were open after Batch1"
        assert any(r[4] == "CNCL" for r in rows)
    # market orders submitted before midnight and completed after it, in the next batch
    crossing = [t for t in data.trades.values() if t.type in MARKET and len(t.steps) == 2
                and t.steps[0][2] != t.steps[1][2]]
    assert {(t.steps[0][2], t.steps[1][2]) for t in crossing} >= {(1, 2), (2, 3)}


# -- referential integrity --------------------------------------------------------------------
def security_days(data: Data) -> dict[str, tuple[dt.date, dt.date]]:
    """symbol -> (first day a trade may use it, first day it may not)."""
    out: dict[str, tuple[dt.date, dt.date]] = {}
    for s in data.sec:
        day = pts(s["PTS"]).date()
        if s["symbol"] not in out:
            assert s["status"] == "ACTV"
            out[s["symbol"]] = (day + dt.timedelta(days=1), dt.date.max)
        elif s["status"] == "INAC":
            out[s["symbol"]] = (out[s["symbol"]][0], day)
    return out


def account_days(data: Data) -> tuple[dict[int, dt.date], dict[int, dt.date], dict[int, int]]:
    """Batch1 accounts: opened day, closed day (account or customer), owner."""
    opened: dict[int, dt.date] = {}
    closed: dict[int, dt.date] = {}
    owner: dict[int, int] = {}
    for a in data.actions:
        kind, day = a.get("ActionType"), dt.date.fromisoformat(a.get("ActionTS")[:10])
        customer = a.find("Customer")
        c_id, account = int(customer.get("C_ID")), customer.find("Account")
        if kind in ("NEW", "ADDACCT"):
            opened[int(account.get("CA_ID"))] = day
            owner[int(account.get("CA_ID"))] = c_id
        elif kind == "CLOSEACCT":
            closed[int(account.get("CA_ID"))] = day
        elif kind == "INACT":
            for ca_id, c in owner.items():
                if c == c_id:
                    closed.setdefault(ca_id, day)
    return opened, closed, owner


def test_trades_use_valid_accounts_securities_and_brokers(data: Data) -> None:
    securities = security_days(data)
    opened, closed, owner = account_days(data)
    for trade in data.trades.values():
        day = trade.created.date()
        first, gone = securities[trade.symbol]
        assert first <= day < gone, (trade.t_id, trade.symbol)
        assert trade.fields[6] in data.brokers, "T_EXEC_NAME names a broker"
        if trade.steps[0][2] == 1:
            assert opened[trade.account] < day < closed.get(trade.account, dt.date.max)
    # incremental batches: accounts as DimAccount has them after that batch's changes
    current = {ca for ca in opened if ca not in closed}
    for b in (2, 3):
        inactive = {int(r[2]) for r in rows_of(data.root / f"Batch{b}/Customer.txt")
                    if r[4] == "INAC"}
        for r in rows_of(data.root / f"Batch{b}/Account.txt"):
            ca_id, b_id, c_id, status = int(r[2]), r[3], int(r[4]), r[7]
            assert b_id in data.brokers
            assert (r[0] == "I") == (ca_id not in owner)
            owner[ca_id] = c_id
            (current.add if status == "ACTV" else current.discard)(ca_id)
        current -= {ca for ca, c in owner.items() if c in inactive}
        for r in data.cdc[b]:
            if r[0] == "I":
                assert int(r[10]) in current, f"Batch{b} trade {r[2]} on inactive account"


def test_changing_dimensions_and_alerts_are_present(data: Data) -> None:
    traded = Counter(t.symbol for t in data.trades.values())
    by_name = {c["name"]: c["cik"] for c in data.cmp}
    company_of: dict[str, list[tuple[dt.datetime, str]]] = defaultdict(list)
    for s in data.sec:
        cik = s["company"] if s["company"].isdigit() else by_name[s["company"]]
        company_of[s["symbol"]].append((pts(s["PTS"]), cik))
    moved = []
    for symbol, seq in company_of.items():
        for (_, before), (when, after) in itertools.pairwise(seq):
            if before != after and TRADES_FIRST < when.date() < BATCH_DATES[1]:
                trades = [t.created for t in data.trades.values() if t.symbol == symbol]
                if any(c < when for c in trades) and any(c.date() > when.date() for c in trades):
                    moved.append(symbol)
    assert moved, "a traded security changes company inside the trade window"
    in_window = [s for s in data.sec if TRADES_FIRST < pts(s["PTS"]).date() < BATCH_DATES[1]
                 and traded[s["symbol"]]]
    first = {}
    for s in data.sec:
        first.setdefault(s["symbol"], s["PTS"])
    assert any(s["status"] == "ACTV" and s["PTS"] != first[s["symbol"]] for s in in_window)
    assert any(s["status"] == "INAC" for s in in_window), "a traded security is deleted"
    traded_ciks = {cik for symbol in traded for _, cik in company_of[symbol]}
    seen_cik: set[str] = set()
    changed_companies = []
    for c in data.cmp:
        if c["cik"] in seen_cik and c["status"] == "ACTV" and c["cik"] in traded_ciks \
                and TRADES_FIRST < pts(c["PTS"]).date() < BATCH_DATES[1]:
            changed_companies.append(c["cik"])
        seen_cik.add(c["cik"])
    assert changed_companies, "a company of traded securities changes in the trade window"

    kinds = Counter(a.get("ActionType") for a in data.actions)
    assert all(kinds[k] for k in ("UPDACCT", "UPDCUST", "CLOSEACCT", "INACT"))
    for b in (2, 3):
        customers = rows_of(data.root / f"Batch{b}/Customer.txt")
        accounts = rows_of(data.root / f"Batch{b}/Account.txt")
        assert {(r[0], r[4]) for r in customers} >= {("I", "ACTV"), ("U", "ACTV"), ("U", "INAC")}
        assert {(r[0], r[7]) for r in accounts} >= {("I", "ACTV"), ("U", "ACTV"), ("U", "INAC")}
        assert len({r[2] for r in accounts}) == len(accounts), "an id at most once per file"
    traded_accounts = {t.account for t in data.trades.values()}
    updated = {int(a.find("Customer/Account").get("CA_ID")) for a in data.actions
               if a.get("ActionType") == "UPDACCT"}
    assert traded_accounts & updated

    for rows, offset in ((data.trade1, 0),) + tuple((data.cdc[b], 2) for b in (2, 3)):
        completed = [r for r in rows if r[offset + 2] == "CMPT"]
        value = {id(r): cents(r[offset + 10]) * int(r[offset + 6]) for r in completed}
        assert any(cents(r[offset + 12]) > value[id(r)] for r in completed), "commission alert"
        assert any(cents(r[offset + 11]) > value[id(r)] for r in completed), "fee alert"


# -- audit ------------------------------------------------------------------------------------
def audit(path: Path) -> dict[tuple[str, str], str]:
    lines = lines_of(path)
    assert lines[0] == "DataSet, BatchID ,Date , Attribute , Value, DValue"
    out = {}
    for line in lines[1:]:
        dataset, _batch, date, attribute, value, dvalue = line.split(",")
        out[dataset, attribute] = value or date or dvalue
    return out


def test_audit_counts_match_the_data(data: Data) -> None:
    root = data.root
    for b in (1, 2, 3):
        batch = audit(root / f"Batch{b}_audit.csv")
        first = "1950-01-01" if b == 1 else BATCH_DATES[b].isoformat()   # as DIGen writes
        assert batch == {("Batch", "FirstDay"): first,
                         ("Batch", "LastDay"): BATCH_DATES[b].isoformat()}
    for b, rows, offset in ((1, data.trade1, 0), (2, data.cdc[2], 2), (3, data.cdc[3], 2)):
        completed = [r for r in rows if r[offset + 2] == "CMPT"]
        value = [cents(r[offset + 10]) * int(r[offset + 6]) for r in completed]
        expected = {
            "T_Records": len(rows),
            "T_NEW": len(rows) if b == 1 else sum(r[0] == "I" for r in rows),
            "T_CanceledTrades": sum(r[offset + 2] == "CNCL" for r in rows),
            "T_InvalidCommision": sum(cents(r[offset + 12]) > v for r, v in zip(completed, value)),
            "T_InvalidCharge": sum(cents(r[offset + 11]) > v for r, v in zip(completed, value)),
        }
        got = audit(root / f"Batch{b}/Trade_audit.csv")
        assert {k: int(got["DimTrade", k]) for k in expected} == expected
    types = {int(r[0]): r[3] for r in data.trade1}
    history = audit(root / "Batch1/TradeHistory_audit.csv")
    assert int(history["DimTradeHistory", "TH_Records"]) == len(data.history)
    for t in ("TLB", "TLS", "TMB", "TMS"):
        assert int(history["DimTradeHistory", f"TH_{t}Trades"]) == sum(
            types[int(r[0])] == t for r in data.history)
    assert int(history["DimTradeHistory", "TH_CanceledLTrades"]) == sum(
        r[2] == "CNCL" for r in data.history)
    fin = Counter(line[15:18] for q in quarters()
                  for line in lines_of(root / f"Batch1/FINWIRE{q}"))
    totals: Counter[str] = Counter()
    for q in quarters():
        finwire = audit(root / f"Batch1/FINWIRE{q}_audit.csv")
        in_file = Counter(line[15:18] for line in lines_of(root / f"Batch1/FINWIRE{q}"))
        for kind, dataset in (("CMP", "DimCompany"), ("SEC", "DimSecurity"), ("FIN", "Financial")):
            assert int(finwire[dataset, f"FW_{kind}"]) == in_file[kind], (q, kind)
            totals[kind] += in_file[kind]
    assert totals == fin
    assert (totals["CMP"], totals["SEC"], totals["FIN"]) == (len(data.cmp), len(data.sec),
                                                              data.fin_count)
    for name in ("Date", "Time", "StatusType", "TradeType", "Industry", "TaxRate"):
        assert audit(root / f"Batch1/{name}_audit.csv") == {}
    assert int(audit(root / "Batch1/HR_audit.csv")["DimBroker", "HR_BROKERS"]) == \
        len(data.brokers)
    kinds = Counter(a.get("ActionType") for a in data.actions)
    cm = audit(root / "Batch1/CustomerMgmt_audit.csv")
    assert {k: int(cm["DimCustomer", f"C_{k}"]) for k in ("NEW", "UPDCUST", "INACT")} == \
        {k: kinds[k] for k in ("NEW", "UPDCUST", "INACT")}
    assert {k: int(cm["DimAccount", f"CA_{k}"]) for k in ("ADDACCT", "UPDACCT", "CLOSEACCT")} \
        == {k: kinds[k] for k in ("ADDACCT", "UPDACCT", "CLOSEACCT")}
    def errors(rows: list[tuple[str, str, dt.date]]) -> tuple[int, int, int]:
        """(C_DOB_TO, C_DOB_TY, C_TIER_INV) of (tier, dob, day) versions."""
        return (sum(dt.date.fromisoformat(dob) < hundred_years_before(day)
                    for _, dob, day in rows),
                sum(dt.date.fromisoformat(dob) > day for _, dob, day in rows),
                sum(tier not in ("1", "2", "3") for tier, _, _ in rows))

    tiers: dict[str, str] = {}
    dobs: dict[str, str] = {}
    versions = []
    for a in data.actions:      # every NEW/UPDCUST makes a version with the tier it has then
        customer, kind = a.find("Customer"), a.get("ActionType")
        c_id = customer.get("C_ID")
        if kind == "NEW":
            tiers[c_id], dobs[c_id] = customer.get("C_TIER", ""), customer.get("C_DOB")
        elif kind == "UPDCUST" and customer.get("C_TIER"):
            tiers[c_id] = customer.get("C_TIER")
        if kind in ("NEW", "UPDCUST"):
            versions.append((tiers[c_id], dobs[c_id],
                             dt.date.fromisoformat(a.get("ActionTS")[:10])))
    assert (int(cm["DimCustomer", "C_DOB_TO"]), int(cm["DimCustomer", "C_DOB_TY"]),
            int(cm["DimCustomer", "C_TIER_INV"])) == errors(versions)
    assert int(cm["DimCustomer", "C_TIER_INV"]) > 0, "empty tiers, as DIGen writes them"
    for b in (2, 3):
        rows = rows_of(root / f"Batch{b}/Customer.txt")
        got = audit(root / f"Batch{b}/Customer_audit.csv")
        assert (int(got["DimCustomer", "C_DOB_TO"]), int(got["DimCustomer", "C_DOB_TY"]),
                int(got["DimCustomer", "C_TIER_INV"])) == errors(
            [(r[9], r[10], BATCH_DATES[b]) for r in rows])
    for b in (2, 3):
        customers = Counter((r[0], r[4]) for r in rows_of(root / f"Batch{b}/Customer.txt"))
        got = audit(root / f"Batch{b}/Customer_audit.csv")
        assert (int(got["DimCustomer", "C_NEW"]), int(got["DimCustomer", "C_UPDCUST"]),
                int(got["DimCustomer", "C_INACT"])) == (
            customers["I", "ACTV"], customers["U", "ACTV"], customers["U", "INAC"])
        accounts = Counter((r[0], r[7]) for r in rows_of(root / f"Batch{b}/Account.txt"))
        got = audit(root / f"Batch{b}/Account_audit.csv")
        assert (int(got["DimAccount", "CA_ADDACCT"]), int(got["DimAccount", "CA_UPDACCT"]),
                int(got["DimAccount", "CA_CLOSEACCT"])) == (
            accounts["I", "ACTV"], accounts["U", "ACTV"], accounts["U", "INAC"])


# -- bad rows, validation, command line -------------------------------------------------------
def test_bad_rows_match_their_manifest(data: Data, tmp_path: Path) -> None:
    report = generate(SF, tmp_path / "bad", seed=SEED, bad_rows=14)
    manifest = json.loads((report.output / "bad_rows.json").read_text())
    rows = manifest["rows"]
    assert manifest["count"] == report.bad_rows == len(rows) == 14
    assert Counter(r["kind"] for r in rows) == Counter({k: 2 for k in manifest["kinds"]})
    symbols = {s["symbol"] for s in data.sec}
    accounts = {t.account for t in data.trades.values()} | {
        int(r[2]) for b in (2, 3) for r in rows_of(data.root / f"Batch{b}/Account.txt")}
    skip: dict[int, set[int]] = defaultdict(set)
    for r in rows:
        lines = lines_of(report.output / r["file"])
        assert lines[r["line"] - 1] == r["text"]
        skip[r["batch"]].add(r["line"])
        f = r["text"].split("|")
        kind = r["kind"]
        if kind == "field_count":
            assert len(f) != 16
            continue
        assert len(f) == 16
        if kind == "bad_number":
            with pytest.raises(ValueError):
                int(f[8]) if r["field"] == "T_QTY" else cents(f[9])
        elif kind == "bad_date":
            with pytest.raises(ValueError):
                ts(f[3])
        elif kind == "unknown_status":
            assert f[4] not in ("PNDG", "SBMT", "CNCL", "CMPT", "ACTV", "INAC")
        elif kind == "unknown_type":
            assert f[5] not in ("TLB", "TLS", "TMB", "TMS", "TSL")
        elif kind == "unknown_symbol":
            assert re.fullmatch(r"[A-Z]{15}", f[7]) and f[7] not in symbols
        else:
            assert kind == "unknown_account" and int(f[10]) not in accounts
        assert int(f[2]) > max(data.trades)
    # without the injected lines, every file is the clean run's file
    for f in data.report.files:
        if f.path == "bad_rows.json":
            continue
        clean = (data.root / f.path).read_bytes()
        dirty = (report.output / f.path).read_bytes()
        if f.path in ("Batch2/Trade.txt", "Batch3/Trade.txt"):
            batch = int(f.path[5])
            kept = [line for i, line in enumerate(lines_of(report.output / f.path), start=1)
                    if i not in skip[batch]]
            dirty = "".join(line + "\r\n" for line in kept).encode()
        assert clean == dirty, f.path
    parse(report.output, report, skip)  # the valid rows still parse as before


def test_invalid_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        generate(0.005, tmp_path)
    with pytest.raises(ValueError):
        generate(SF, tmp_path, seed=-1)
    with pytest.raises(ValueError):
        generate(SF, tmp_path, bad_rows=-1)


def test_command_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(generate_command, ["--scale-factor", "0.01", "--output",
                                                   str(tmp_path), "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "Trade.txt" in result.output
    assert len(rows_of(tmp_path / "Batch1/Trade.txt")) == 1_300
    result = CliRunner().invoke(generate_command, ["--scale-factor", "0", "-o", str(tmp_path)])
    assert result.exit_code != 0
