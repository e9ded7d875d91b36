"""TPC-DI dimensions in PySpark into a real PostgreSQL warehouse (one Spark session, one
generated SF 0.02 data set and one database per module).

Expectations are derived independently of the loader, from the raw files (split, sliced,
parsed with ElementTree), *before* a few edge cases are added to the data set: same-day second
versions (a later CMP record, a later UPDCUST) that must replace the day's version without
adding rows, and bad rows of every kind that must land in ``rejects`` and nowhere else.
The warehouse is read into snapshots right after each load, so every test looks at the state
it is about, whatever order the tests run in.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
import uuid
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from migrators.urls import default_url, parse
from sstore.base.sql import ident
from sstore.workloads.tpcdi.dimensions import (
    DimensionLoadError,
    apply_batch,
    build_historical,
)
from sstore.workloads.tpcdi.dimensions.store import replace_tables
from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.warehouse import create_warehouse

SF, SEED, SCHEMA = 0.02, 11, "dims"
END = dt.date(9999, 12, 31)
NS = "{http://www.tpc.org/tpc-di}"
TABLES = {"dimdate": "sk_dateid", "dimtime": "sk_timeid", "statustype": "st_id",
          "tradetype": "tt_id", "industry": "in_id", "taxrate": "tx_id",
          "dimbroker": "sk_brokerid", "dimcompany": "sk_companyid",
          "dimsecurity": "sk_securityid", "dimcustomer": "sk_customerid",
          "dimaccount": "sk_accountid"}
TYPE2 = {"dimcompany": "companyid", "dimsecurity": "symbol", "dimcustomer": "customerid",
         "dimaccount": "accountid", "dimbroker": "brokerid"}


# -- the independent model -------------------------------------------------------------------

@dataclass
class Model:
    counts: dict[str, int]
    brokers: set[int]
    owner: dict[int, int]                 # account -> customer, as of the last batch read
    customers: set[int]
    batches: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    # batch -> (new customer versions, ended, new account versions, ended)


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line]


def _finwire(b1: Path) -> tuple[list[str], list[str]]:
    cmp, sec = [], []
    for path in sorted(b1.iterdir()):
        if re.fullmatch(r"FINWIRE\d{4}Q[1-4]", path.name):
            for line in _lines(path):
                {"CMP": cmp, "SEC": sec}.get(line[15:18], []).append(line)
    return cmp, sec


def _actions(b1: Path) -> list[tuple[str, str, int, int | None, ET.Element]]:
    out = []
    for action in ET.parse(b1 / "CustomerMgmt.xml").getroot().iter(f"{NS}Action"):
        customer = action.find("Customer")
        account = customer.find("Account")
        out.append((action.get("ActionType"), action.get("ActionTS"), int(customer.get("C_ID")),
                    None if account is None else int(account.get("CA_ID")), customer))
    return out


def model_of(root: Path) -> Model:
    b1 = root / "Batch1"
    counts = {t: len(_lines(b1 / f)) for t, f in (
        ("dimdate", "Date.txt"), ("dimtime", "Time.txt"), ("statustype", "StatusType.txt"),
        ("tradetype", "TradeType.txt"), ("industry", "Industry.txt"),
        ("taxrate", "TaxRate.txt"))}
    brokers = {int(f[0]) for f in (line.split(",") for line in _lines(b1 / "HR.csv"))
               if f[5] == "314"}
    counts["dimbroker"] = len(brokers)
    cmp, sec = _finwire(b1)
    company_days: dict[int, set[str]] = defaultdict(set)
    cik_of_name = {}
    for line in cmp:
        company_days[int(line[78:88])].add(line[:8])
        cik_of_name[line[18:78].strip()] = int(line[78:88])
    counts["dimcompany"] = sum(len(days) for days in company_days.values())
    security_days: dict[str, dict[str, int]] = defaultdict(dict)
    for line in sorted(sec, key=lambda s: s[:15]):        # the last record of a day wins
        co = line[160:220].strip()
        security_days[line[18:33].strip()][line[:8]] = int(co) if co.isdigit() \
            else cik_of_name[co]
    pieces = 0
    for days in security_days.values():
        starts = sorted(days)
        for i, day in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else "99991231"
            pieces += 1 + sum(day < c < end for c in company_days[days[day]])
    counts["dimsecurity"] = pieces
    customer_days, account_days, owner = set(), set(), {}
    for kind, ts, c_id, ca_id, _ in _actions(b1):
        day = ts[:10]
        if kind in ("NEW", "UPDCUST", "INACT"):
            customer_days.add((c_id, day))
        if kind in ("NEW", "ADDACCT"):
            owner[ca_id] = c_id
        if ca_id is not None:
            account_days.add((ca_id, day))
        if kind in ("UPDCUST", "INACT"):
            account_days |= {(a, day) for a, o in owner.items() if o == c_id}
    counts["dimcustomer"], counts["dimaccount"] = len(customer_days), len(account_days)
    model = Model(counts, brokers, owner, {c for c, _ in customer_days})
    for batch in (2, 3):
        folder = root / f"Batch{batch}"
        changed = {int(f.split("|")[2]) for f in _lines(folder / "Customer.txt")}
        rows = [f.split("|") for f in _lines(folder / "Account.txt")]
        accounts = {int(f[2]) for f in rows} | {a for a, o in model.owner.items()
                                                 if o in changed}
        model.batches[batch] = (len(changed), len(changed & model.customers), len(accounts),
                                len(accounts & set(model.owner)))
        model.owner.update({int(f[2]): int(f[4]) for f in rows})
        model.customers |= changed
    return model


# -- the edge cases added after the model is taken --------------------------------------------

@dataclass
class Injected:
    same_day_customer: tuple[int, str]     # (C_ID, date) whose day gets a second UPDCUST
    same_day_company: tuple[int, str]      # (CIK, yyyymmdd) whose day gets a second CMP
    rejects: dict[tuple[str, int], list[str]]  # (file, batch) -> reason fragments


def _append(path: Path, line: str) -> None:
    with path.open("a", newline="") as out:
        out.write(line + "\r\n")


def inject(root: Path) -> Injected:
    b1 = root / "Batch1"
    _append(b1 / "HR.csv", "not,a,valid,line")
    non_broker = next(int(f[0]) for f in (line.split(",") for line in _lines(b1 / "HR.csv"))
                      if f[5] not in ("314", ""))
    actions = _actions(b1)
    inactivated = {c for kind, _, c, _, _ in actions if kind == "INACT"}
    _, ts, c_id, _, _ = next(a for a in reversed(actions)
                             if a[0] == "UPDCUST" and a[2] not in inactivated)
    day = ts[:10]
    extra = (
        f'\t<TPCDI:Action ActionType="UPDCUST" ActionTS="{day}T23:59:59">\r\n'
        f'\t\t<Customer C_ID="{c_id}"><Name><C_L_NAME>Sameday</C_L_NAME></Name></Customer>\r\n'
        f'\t</TPCDI:Action>\r\n'
        f'\t<TPCDI:Action ActionType="UPDACCT" ActionTS="2015-01-01T00:00:00">\r\n'
        f'\t\t<Customer C_ID="0"><Account CA_ID="999999"><CA_NAME>x</CA_NAME></Account>'
        f'</Customer>\r\n\t</TPCDI:Action>\r\n'
        f'\t<TPCDI:Action ActionType="NEW" ActionTS="2015-01-01T00:00:00">\r\n'
        f'\t\t<Customer C_ID="999998"><Account CA_ID="999998" CA_TAX_ST="1">'
        f'<CA_B_ID>{non_broker}</CA_B_ID><CA_NAME>x</CA_NAME></Account></Customer>\r\n'
        f'\t</TPCDI:Action>\r\n'
        f'\t<TPCDI:Action ActionType="INACT" ActionTS="2015-02-30T00:00:00">\r\n'
        f'\t\t<Customer C_ID="0"/>\r\n\t</TPCDI:Action>\r\n')
    xml = (b1 / "CustomerMgmt.xml").read_text()
    (b1 / "CustomerMgmt.xml").write_text(xml.replace("</TPCDI:Actions>",
                                                     extra + "</TPCDI:Actions>"), newline="")
    cmp_file, cmp_line = next((p, line) for p in sorted(b1.glob("FINWIRE2*Q*"))
                              for line in _lines(p) if line[15:18] == "CMP")
    same_day = cmp_line[:9] + "235959" + cmp_line[15:347] + "Sameday Ceo".ljust(46) \
        + cmp_line[393:]
    _append(cmp_file, same_day)
    _append(cmp_file, cmp_line[:18] + "Unknown Status Company".ljust(60) + "9999999999"
            + "XXXX" + cmp_line[92:])
    customer = _lines(root / "Batch2" / "Customer.txt")[0].split("|")
    customer[:5] = ["I", "999", "999999", customer[3], "XXXX"]
    _append(root / "Batch2" / "Customer.txt", "|".join(customer))
    _append(root / "Batch2" / "Account.txt", f"I|999|999997|999999|{c_id}|x|1|ACTV")
    return Injected((c_id, day), (int(cmp_line[78:88]), cmp_line[:8]), {
        ("HR.csv", 1): ["expected 9 fields"],
        ("CustomerMgmt.xml", 1): ["does not exist", "is not a broker", "unparsable"],
        ("FINWIRE", 1): ["unknown CMP Status"],
        ("Customer.txt", 2): ["unknown C_ST_ID"],
        ("Account.txt", 2): ["no DimBroker for CA_B_ID 999999"]})


# -- fixtures -----------------------------------------------------------------------------------

Snapshot = dict[str, list[dict]]


def snapshot(url: str) -> Snapshot:
    out: Snapshot = {}
    with psycopg.connect(url) as con:
        for table, key in TABLES.items():
            cur = con.execute(f"SELECT * FROM {SCHEMA}.{table} ORDER BY {key}")
            names = [d.name for d in cur.description]
            out[table] = [dict(zip(names, row)) for row in cur.fetchall()]
        cur = con.execute(f"SELECT source_file, batch_id, line_number, raw_line, reason "
                          f"FROM {SCHEMA}.rejects ORDER BY 1, 2, 3, 4, 5")
        out["rejects"] = [dict(zip(("file", "batch", "line", "raw", "reason"), r))
                          for r in cur.fetchall()]
    return out


@pytest.fixture(scope="module")
def url():
    server = parse(default_url())
    name = f"sstore_dims_{uuid.uuid4().hex[:12]}"
    admin = default_url()
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute(f"CREATE DATABASE {ident(name)}")
    auth = (server.user or "postgres") + (f":{server.password}" if server.password else "")
    yield f"postgresql://{auth}@{server.host}:{server.port}/{name}"
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute(f"DROP DATABASE IF EXISTS {ident(name)} WITH (FORCE)")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Model, Injected]:
    root = tmp_path_factory.mktemp("tpcdi")
    generate(SF, root, seed=SEED)
    model = model_of(root)
    return root, model, inject(root)


@pytest.fixture(scope="module")
def historical(spark, url, data):
    report = build_historical(spark, data[0], url, SCHEMA)
    return report, snapshot(url)


@pytest.fixture(scope="module")
def rebuilt(spark, url, data, historical):
    report = build_historical(spark, data[0], url, SCHEMA)
    return report, snapshot(url)


@pytest.fixture(scope="module")
def batches(spark, url, data, rebuilt):
    reports, snaps = {}, {}
    for batch in (2, 3):
        reports[batch] = apply_batch(spark, data[0], url, SCHEMA, batch)
        snaps[batch] = snapshot(url)
    again = apply_batch(spark, data[0], url, SCHEMA, 3)
    with pytest.raises(DimensionLoadError, match="later batch"):
        apply_batch(spark, data[0], url, SCHEMA, 2)
    return reports, snaps, again, snapshot(url)


# -- checks -------------------------------------------------------------------------------------

def scd2_problems(rows: list[dict], key: str) -> list[str]:
    problems = []
    versions: dict[object, list[dict]] = defaultdict(list)
    for row in rows:
        versions[row[key]].append(row)
    for natural, chain in versions.items():
        chain.sort(key=lambda r: r["effectivedate"])
        for row in chain:
            if not row["effectivedate"] < row["enddate"]:
                problems.append(f"{natural}: empty version {row}")
            if row["iscurrent"] != (row["enddate"] == END):
                problems.append(f"{natural}: IsCurrent disagrees with EndDate {row}")
        for a, b in itertools.pairwise(chain):
            if a["enddate"] != b["effectivedate"]:
                problems.append(f"{natural}: {a['enddate']} then {b['effectivedate']}")
        if chain[-1]["enddate"] != END or sum(r["iscurrent"] for r in chain) != 1:
            problems.append(f"{natural}: not exactly one current version ending 9999-12-31")
    return problems


def containment_problems(snap: Snapshot) -> list[str]:
    problems = []
    for child, parent, sk in (("dimsecurity", "dimcompany", "sk_companyid"),
                              ("dimaccount", "dimcustomer", "sk_customerid")):
        parents = {r[sk]: r for r in snap[parent]}
        for row in snap[child]:
            p = parents.get(row[sk])
            if p is None or not (p["effectivedate"] <= row["effectivedate"]
                                 and row["enddate"] <= p["enddate"]):
                problems.append(f"{child} {row} outside its {parent} {p}")
            elif child == "dimaccount" and p["status"] == "Inactive" \
                    and row["status"] != "Inactive":
                problems.append(f"active account {row} of inactive customer {p}")
    brokers = {r["sk_brokerid"] for r in snap["dimbroker"]}
    problems += [f"account {r} has no broker" for r in snap["dimaccount"]
                 if r["sk_brokerid"] not in brokers]
    return problems


def test_row_counts_match_the_source_files(historical, data):
    report, snap = historical
    assert {t: len(snap[t]) for t in TABLES} == data[1].counts
    assert report.rows == data[1].counts


@pytest.mark.parametrize("table", sorted(TYPE2))
def test_type2_invariants_after_batch1(historical, table):
    assert scd2_problems(historical[1][table], TYPE2[table]) == []


def test_securities_and_accounts_lie_inside_their_parent_versions(historical):
    snap = historical[1]
    assert containment_problems(snap) == []
    # the generator places a company change under a trading security: some version is split
    company_of = {r["sk_companyid"]: r["companyid"] for r in snap["dimcompany"]}
    split = [(a, b) for a, b in itertools.pairwise(snap["dimsecurity"])
             if a["symbol"] == b["symbol"] and a["name"] == b["name"]
             and company_of[a["sk_companyid"]] == company_of[b["sk_companyid"]]
             and a["sk_companyid"] != b["sk_companyid"]]
    assert split


def test_dimbroker_is_job_code_314_only(historical, data):
    rows = historical[1]["dimbroker"]
    assert {r["brokerid"] for r in rows} == data[1].brokers
    assert {(r["effectivedate"], r["enddate"], r["iscurrent"], r["batchid"]) for r in rows} \
        == {(dt.date(1950, 1, 1), END, True, 1)}


def test_same_day_versions_keep_the_last(historical, data):
    snap, injected = historical[1], data[2]
    c_id, day = injected.same_day_customer
    version = next(r for r in snap["dimcustomer"] if r["customerid"] == c_id
                   and r["effectivedate"] == dt.date.fromisoformat(day))
    assert version["lastname"] == "Sameday"
    cik, pts_day = injected.same_day_company
    company = next(r for r in snap["dimcompany"] if r["companyid"] == cik
                   and r["effectivedate"] == dt.datetime.strptime(pts_day, "%Y%m%d").date())
    assert company["ceo"] == "Sameday Ceo"


def test_rejected_rows_are_in_rejects_and_counted(historical, data):
    report, snap = historical
    wanted = {k: v for k, v in data[2].rejects.items() if k[1] == 1}
    found: dict[tuple[str, int], list[str]] = defaultdict(list)
    for r in snap["rejects"]:
        name = Path(r["file"]).name
        found[("FINWIRE" if name.startswith("FINWIRE") else name, r["batch"])].append(r["reason"])
    assert sorted(found) == sorted(wanted)
    for key, fragments in wanted.items():
        assert len(found[key]) == len(fragments)
        assert all(any(f in reason for reason in found[key]) for f in fragments)
    by_source = {s.source: s for s in report.sources}
    hr_lines = len(_lines(data[0] / "Batch1" / "HR.csv"))
    assert (by_source["HR.csv"].rows_in, by_source["HR.csv"].rejected) == (hr_lines, 1)
    assert by_source["CustomerMgmt.xml"].rejected == 3
    assert report.rejected == sum(len(v) for v in wanted.values())


def test_rebuild_gives_identical_tables_and_keys(historical, rebuilt):
    assert rebuilt[1] == historical[1]
    assert rebuilt[0].rows == historical[0].rows


@pytest.mark.parametrize("batch", [2, 3])
def test_batches_add_the_expected_versions(batches, data, batch):
    reports, snaps, _, _ = batches
    new_c, ended_c, new_a, ended_a = data[1].batches[batch]
    assert reports[batch].rows == {"dimcustomer": new_c, "dimaccount": new_a}
    assert reports[batch].ended == {"dimcustomer": ended_c, "dimaccount": ended_a}
    day = dt.date.fromisoformat(_lines(data[0] / f"Batch{batch}" / "BatchDate.txt")[0])
    snap = snaps[batch]
    for table in ("dimcustomer", "dimaccount"):
        added = [r for r in snap[table] if r["batchid"] == batch]
        assert {(r["effectivedate"], r["iscurrent"]) for r in added} == {(day, True)}
        assert min(r[TABLES[table]] for r in added) > max(
            r[TABLES[table]] for r in snap[table] if r["batchid"] < batch)
        assert scd2_problems(snap[table], TYPE2[table]) == []
    assert containment_problems(snap) == []


def test_batch_rejects_and_reapplying(batches, data):
    reports, snaps, again, final = batches
    assert {s.source: s.rejected for s in reports[2].sources} == \
        {"Customer.txt": 1, "Account.txt": 1}
    assert reports[3].rejected == 0
    assert final == snaps[3]                 # batch 3 applied twice: the same warehouse
    assert again.rows == reports[3].rows


def test_a_failed_write_changes_nothing(url):
    create_warehouse(url, "atomic")
    broker = pa.table({"sk_brokerid": [1], "brokerid": [7], "iscurrent": [True],
                       "batchid": [1], "effectivedate": [dt.date(1950, 1, 1)],
                       "enddate": [END]})
    no_rejects = pa.table({c: pa.array([], pa.string()) for c in ("source_file", "raw_line",
                                                                  "reason")})
    replace_tables(url, "atomic", {"dimbroker": broker}, no_rejects, "^$")
    broken = pa.table({"sk_companyid": [1], "companyid": [1], "status": [None],
                       "name": ["x"], "iscurrent": [True], "batchid": [1],
                       "effectivedate": [dt.date(2000, 1, 1)], "enddate": [END]})
    other = broker.set_column(1, "brokerid", pa.array([8]))
    with pytest.raises(psycopg.errors.NotNullViolation):
        replace_tables(url, "atomic", {"dimbroker": other, "dimcompany": broken}, no_rejects,
                       "^$")
    with psycopg.connect(url) as con:
        assert con.execute("SELECT brokerid FROM atomic.dimbroker").fetchall() == [(7,)]
