"""The DimTrade checks of TPC-DI Appendix A, run against a warehouse in PostgreSQL.

The checks follow the specification's audit query (``tpcdi_audit.sql``, DimTrade part) with the
same names, so a report reads like the official one; each says what it saw and what it expected.
Expected numbers come from the generator's audit data: the ``*_audit.csv`` files when a data
directory is given, else the warehouse's ``audit`` table, else the checks that need them are
*skipped* (never passed). Integrity checks (keys, joins, dates, names) count offending rows and
expect 0, so a failure says how many rows to look at; one defect makes exactly one check fail.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from os import PathLike
from typing import Any

import psycopg
from psycopg.rows import dict_row

from migrators.postgres import connect
from sstore.base.errors import TerminalError
from sstore.base.sql import ident
from sstore.workloads.tpcdi.sources import read_audit
from sstore.workloads.tpcdi.warehouse import existing_tables

STATUS_NAMES = ("Canceled", "Pending", "Submitted", "Active", "Completed")
TYPE_NAMES = ("Market Buy", "Market Sell", "Stop Loss", "Limit Sell", "Limit Buy")
DEFAULT_BATCHES = (1, 2, 3)
_NEEDED = ("dimtrade", "dimdate", "dimtime", "dimbroker", "dimcompany", "dimsecurity",
           "dimcustomer", "dimaccount", "dimessages")
# (check name, SK column, dimension): the SK must name a version valid on the create date.
_VERSIONED = (("SK_BrokerID", "DimBroker"), ("SK_CompanyID", "DimCompany"),
              ("SK_SecurityID", "DimSecurity"), ("SK_CustomerID", "DimCustomer"),
              ("SK_AccountID", "DimAccount"))
# (check name, dimension, its key, NULL allowed while the trade is open)
_CALENDAR = (("SK_CreateDateID", "DimDate", "sk_dateid", False),
             ("SK_CreateTimeID", "DimTime", "sk_timeid", False),
             ("SK_CloseDateID", "DimDate", "sk_dateid", True),
             ("SK_CloseTimeID", "DimTime", "sk_timeid", True))


class AuditError(TerminalError):
    """The audit cannot run: tables missing, or audit data asked for but not there."""


@dataclass(frozen=True)
class AuditCheck:
    """One check: ``outcome`` is "pass", "fail" or "skip" (no expected number known)."""

    name: str
    outcome: str
    observed: int | None
    expected: int | None
    description: str
    batch: int | None = None

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    @property
    def failed(self) -> bool:
        return self.outcome == "fail"


@dataclass(frozen=True)
class AuditReport:
    schema: str
    expectations: str          # where the expected numbers came from
    checks: tuple[AuditCheck, ...]

    @property
    def ok(self) -> bool:
        """No check failed (skipped ones do not count as failures, nor as passes)."""
        return not self.failed

    @property
    def failed(self) -> list[AuditCheck]:
        return [c for c in self.checks if c.failed]


@dataclass(frozen=True)
class AuditFacts:
    """The generator's audit numbers: (dataset, batch, attribute) -> value, batch dates."""

    values: dict[tuple[str, int, str], int]
    dates: dict[tuple[int, str], dt.date]
    source: str
    rejected_lines: int = 0

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]], source: str, rejected: int = 0
                  ) -> AuditFacts:
        values: dict[tuple[str, int, str], int] = {}
        dates: dict[tuple[int, str], dt.date] = {}
        for r in rows:
            key = (r["dataset"], int(r["batchid"]), r["attribute"])
            if r["value"] is not None:
                values[key] = values.get(key, 0) + int(r["value"])
            if r["dataset"] == "Batch" and r["date"] is not None:
                dates[(int(r["batchid"]), r["attribute"])] = r["date"]
        return cls(values, dates, source, rejected)

    def total(self, attribute: str, batch: int | None = None, dataset: str = "DimTrade"
              ) -> int | None:
        """Sum of an attribute over all batches (or one); None if the audit never states it."""
        hits = [v for (d, b, a), v in self.values.items()
                if d == dataset and a == attribute and (batch is None or b == batch)]
        return sum(hits) if hits else None

    @property
    def batches(self) -> tuple[int, ...]:
        return tuple(sorted({b for b, _ in self.dates})) or \
            tuple(sorted({b for _, b, _ in self.values}))

    def day(self, batch: int, which: str) -> dt.date | None:
        return self.dates.get((batch, which))

    def only(self, batches: Iterable[int]) -> AuditFacts:
        """The facts of some batches only: to audit a warehouse that has loaded those."""
        keep = set(batches)
        return AuditFacts({k: v for k, v in self.values.items() if k[1] in keep},
                          {k: v for k, v in self.dates.items() if k[0] in keep},
                          f"{self.source}, batches {', '.join(map(str, sorted(keep)))}",
                          self.rejected_lines)


def load_facts(url: str, schema: str, data_dir: str | PathLike[str] | None) -> AuditFacts:
    """Audit numbers from the CSV files under ``data_dir``, else from the warehouse."""
    if data_dir is not None:
        read = read_audit(data_dir)
        if read.rows_in == 0:
            raise AuditError(f"no *_audit.csv files under {data_dir}")
        return AuditFacts.from_rows(read.table.to_pylist(), f"audit files in {data_dir}",
                                    read.rejects.num_rows)
    if "audit" not in existing_tables(url, schema):
        return AuditFacts({}, {}, "none")
    with connect(url) as con, con.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(f"SELECT dataset, batchid, date, attribute, value "
                           f"FROM {ident(schema)}.audit").fetchall()
    return AuditFacts.from_rows(rows, f"table {schema}.audit" if rows else "none")


def _compare(name: str, observed: int, expected: int | None, description: str,
             batch: int | None = None) -> AuditCheck:
    outcome = "skip" if expected is None else "pass" if observed == expected else "fail"
    return AuditCheck(name, outcome, observed, expected, description, batch)


class _Warehouse:
    """The queries of the checks, with the schema's tables quoted once."""

    def __init__(self, con: psycopg.Connection, schema: str) -> None:
        self.con = con
        self.t = {name: f"{ident(schema)}.{ident(name)}" for name in _NEEDED}

    def scalar(self, sql: str, *params: Any) -> int:
        row = self.con.execute(sql, params).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def batch_ids(self) -> list[int]:
        rows = self.con.execute(f"SELECT DISTINCT batchid FROM {self.t['dimtrade']} "
                                f"ORDER BY 1").fetchall()
        return [int(r[0]) for r in rows]


def _counts(w: _Warehouse, facts: AuditFacts) -> list[AuditCheck]:
    trade, msgs = w.t["dimtrade"], w.t["dimessages"]
    alerts = f"SELECT count(*) FROM {msgs} WHERE messagetype = 'Alert' AND messagetext = %s"
    return [
        _compare("DimTrade row count", w.scalar(f"SELECT count(*) FROM {trade}"),
                 facts.total("T_NEW"), "rows = new trades, all batches (T_NEW)"),
        _compare("DimTrade canceled trades",
                 w.scalar(f"SELECT count(*) FROM {trade} WHERE status = 'Canceled'"),
                 facts.total("T_CanceledTrades"), "Status Canceled = T_CanceledTrades"),
        _compare("DimTrade commission alerts", w.scalar(alerts, "Invalid trade commission"),
                 facts.total("T_InvalidCommision"), "commission alerts = T_InvalidCommision"),
        _compare("DimTrade charge alerts", w.scalar(alerts, "Invalid trade fee"),
                 facts.total("T_InvalidCharge"), "fee alerts = T_InvalidCharge"),
    ]


def _keys(w: _Warehouse, facts: AuditFacts, batches: list[int]) -> list[AuditCheck]:
    trade = w.t["dimtrade"]
    expected = set(facts.batches or DEFAULT_BATCHES)
    found = ", ".join(map(str, batches)) or "none"
    return [
        AuditCheck("DimTrade batches", "pass" if set(batches) == expected else "fail",
                   len(batches), len(expected),
                   f"BatchIDs {', '.join(map(str, sorted(expected)))} (found {found})"),
        _compare("DimTrade distinct keys",
                 w.scalar(f"SELECT count(DISTINCT tradeid) FROM {trade}"),
                 w.scalar(f"SELECT count(*) FROM {trade}"), "distinct TradeIDs = rows"),
    ]


def _joins(w: _Warehouse) -> list[AuditCheck]:
    trade, dimdate = w.t["dimtrade"], w.t["dimdate"]
    checks = []
    for name, dim in _VERSIONED:
        sk = ident(name.lower())
        bad = w.scalar(
            f"SELECT count(*) FROM {trade} t "
            f"LEFT JOIN {dimdate} d ON d.sk_dateid = t.sk_createdateid "
            f"WHERE NOT EXISTS (SELECT 1 FROM {w.t[dim.lower()]} x WHERE x.{sk} = t.{sk} "
            f"AND x.effectivedate <= d.datevalue AND d.datevalue <= x.enddate)")
        checks.append(_compare(f"DimTrade {name}", bad, 0,
                               f"rows without a {dim} version valid at create"))
    for name, dim, key, nullable in _CALENDAR:
        sk = ident(name.lower())
        open_ok = f"t.{sk} IS NOT NULL AND " if nullable else ""
        bad = w.scalar(f"SELECT count(*) FROM {trade} t WHERE {open_ok}NOT EXISTS "
                       f"(SELECT 1 FROM {w.t[dim.lower()]} x WHERE x.{key} = t.{sk})")
        checks.append(_compare(f"DimTrade {name}", bad, 0, f"rows not in {dim}"
                               + (" (NULL while open)" if nullable else "")))
    return checks


def _dates(w: _Warehouse, facts: AuditFacts, batches: list[int]) -> list[AuditCheck]:
    """Appendix A's date check: an open trade was created by the batch's LastDay; a closed one
    closed within [FirstDay, LastDay] of its batch and not before it was created."""
    trade, dimdate = w.t["dimtrade"], w.t["dimdate"]
    checks = []
    for b in sorted(set(facts.batches) | set(batches)):
        first, last, first1 = facts.day(b, "FirstDay"), facts.day(b, "LastDay"), \
            facts.day(1, "FirstDay")
        bad = w.scalar(
            f"SELECT count(*) FROM {trade} t JOIN {dimdate} c ON c.sk_dateid = t.sk_createdateid "
            f"LEFT JOIN {dimdate} x ON x.sk_dateid = t.sk_closedateid "
            f"WHERE t.batchid = %s AND ("
            f"(t.sk_closedateid IS NULL AND (c.datevalue > %s::date OR c.datevalue < "
            f"CASE WHEN t.type LIKE %s THEN %s::date ELSE %s::date END)) OR "
            f"(t.sk_closedateid IS NOT NULL AND (x.datevalue > %s::date "
            f"OR x.datevalue < %s::date OR x.datevalue < c.datevalue)))",
            b, last, "Limit%", first1, first, last, first)
        window = f"close <= LastDay {last} and >= create" if last else \
            "close >= create (LastDay unknown)"
        checks.append(_compare("DimTrade date check", bad, 0, window, batch=b))
    return checks


def _names(w: _Warehouse) -> list[AuditCheck]:
    trade = w.t["dimtrade"]
    out = []
    for name, column, allowed in (("Status", "status", STATUS_NAMES),
                                  ("Type", "type", TYPE_NAMES)):
        bad = w.scalar(f"SELECT count(*) FROM {trade} "
                       f"WHERE {column} IS NULL OR NOT ({column} = ANY(%s))", list(allowed))
        out.append(_compare(f"DimTrade {name}", bad, 0, f"rows with another {name} name"))
    return out


def _messages(w: _Warehouse, facts: AuditFacts, batches: list[int]) -> list[AuditCheck]:
    out = []
    for b in sorted(set(facts.batches) | set(batches)):
        observed = w.scalar(f"SELECT count(*) FROM {w.t['dimessages']} WHERE batchid = %s "
                            f"AND messagesource = 'DimTrade' AND messagetype = 'Alert'", b)
        parts = [facts.total(a, b) for a in ("T_InvalidCommision", "T_InvalidCharge")]
        expected = None if all(p is None for p in parts) else sum(p or 0 for p in parts)
        out.append(_compare("DImessages DimTrade alerts", observed, expected,
                            "alerts = T_InvalidCommision + T_InvalidCharge", batch=b))
    return out


def run_audit(url: str, schema: str = "tpcdi", data_dir: str | PathLike[str] | None = None,
              batches: Iterable[int] | None = None) -> AuditReport:
    """Run every DimTrade check; the report lists them in Appendix A's order. ``batches``:
    expect only those batches to be loaded (e.g. ``[1]`` after the historical load); default:
    every batch the audit data knows."""
    missing = [t for t in _NEEDED if t not in existing_tables(url, schema)]
    if missing:
        raise AuditError(f"schema {schema!r} lacks table(s) {', '.join(missing)} "
                         f"(create_warehouse makes them)")
    facts = load_facts(url, schema, data_dir)
    if batches is not None:
        facts = facts.only(batches)
    checks: list[AuditCheck] = []
    if data_dir is not None:
        checks.append(_compare("Audit files", facts.rejected_lines, 0,
                               "unreadable lines in the audit CSVs"))
    with connect(url) as con:
        con.read_only = True
        w = _Warehouse(con, schema)
        batches = w.batch_ids()
        checks += _counts(w, facts) + _keys(w, facts, batches) + _joins(w)
        checks += _dates(w, facts, batches) + _names(w) + _messages(w, facts, batches)
    return AuditReport(schema, facts.source, tuple(checks))
