"""The audit CSVs DIGen writes beside the data, with counts taken from what was generated.

TPC-DI's automated audit (Appendix A) compares the warehouse with these files, so the counts
must be exactly those of the data files: they are computed from the same arrays and records
the data files were written from. Names and places follow DIGen: ``Generator_audit.csv`` and
``BatchN_audit.csv`` (FirstDay/LastDay) beside the batch folders, ``<Name>_audit.csv`` inside
them: one ``FINWIRE<yyyy>Q<q>_audit.csv`` per FINWIRE file with that file's counts, and a
header-only file for each reference table (Date, Time, StatusType, TradeType, Industry,
TaxRate), as DIGen 1.1.0 writes them. The header keeps DIGen's odd spacing. Files end lines
with CRLF like every other file.

Attributes with fixed sentinel values (``CA_ID_HIST`` -1, ``C_ID_HIST`` 0, ``FW_*_DUP`` -1)
are written as DIGen writes them; the audit queries add them in.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .customers import VALID_TIERS, Customer, CustomerHistory
from .dates import (
    BATCH_DATES,
    DATE_TABLE_FIRST,
    DATE_TABLE_LAST,
    FINWIRE_QUARTERS,
    SECONDS_PER_DAY,
    date_of_day,
)
from .finwire import FinwireFiles
from .report import FileReport, TradeCounts
from .scale import TRADE_DAYS, Sizes
from .writer import write_lines

HEADER = "DataSet, BatchID ,Date , Attribute , Value, DValue"


@dataclass(frozen=True)
class AuditRow:
    """One audit line: ``DataSet,BatchID,Date,Attribute,Value,DValue``."""

    dataset: str
    batch: int
    attribute: str
    value: int | None = None
    date: str = ""
    dvalue: str = ""

    def line(self) -> str:
        value = "" if self.value is None else str(self.value)
        return f"{self.dataset},{self.batch},{self.date},{self.attribute},{value},{self.dvalue}"


def _write(root: Path, relative: str, rows: list[AuditRow]) -> FileReport:
    return write_lines(root, relative, [HEADER, *(r.line() for r in rows)])


def _trade_rows(counts: TradeCounts) -> list[AuditRow]:
    b = counts.batch
    return [AuditRow("DimTrade", b, "T_Records", counts.records),
            AuditRow("DimTrade", b, "T_NEW", counts.new),
            AuditRow("DimTrade", b, "T_CanceledTrades", counts.canceled),
            AuditRow("DimTrade", b, "T_InvalidCommision", counts.invalid_commission),
            AuditRow("DimTrade", b, "T_InvalidCharge", counts.invalid_charge)]


def hundred_years_before(day: dt.date) -> dt.date:
    """The same day 100 years earlier (29 February becomes the 28th if that year has none)."""
    try:
        return day.replace(year=day.year - 100)
    except ValueError:
        return day.replace(year=day.year - 100, day=28)


def customer_errors(versions: list[tuple[Customer, dt.date]]) -> tuple[int, int, int]:
    """C_DOB_TO, C_DOB_TY, C_TIER_INV of customer versions (each with the date it is made
    on): a birth date more than 100 years before that date, one after it, a tier that is not
    1, 2 or 3 (empty included, as DIGen counts it)."""
    too_old = too_young = tier = 0
    for customer, day in versions:
        dob = dt.date.fromisoformat(customer.dob)
        too_old += dob < hundred_years_before(day)
        too_young += dob > day
        tier += customer.tier not in VALID_TIERS
    return too_old, too_young, tier


def _customer_rows(batch: int, new: int, updated: int, inactivated: int,
                   errors: tuple[int, int, int]) -> list[AuditRow]:
    too_old, too_young, tier = errors
    return [AuditRow("DimCustomer", batch, "C_NEW", new),
            AuditRow("DimCustomer", batch, "C_UPDCUST", updated),
            AuditRow("DimCustomer", batch, "C_ID_HIST", 0),
            AuditRow("DimCustomer", batch, "C_INACT", inactivated),
            AuditRow("DimCustomer", batch, "C_DOB_TO", too_old),
            AuditRow("DimCustomer", batch, "C_DOB_TY", too_young),
            AuditRow("DimCustomer", batch, "C_TIER_INV", tier)]


def _account_rows(batch: int, added: int, closed: int, updated: int) -> list[AuditRow]:
    return [AuditRow("DimAccount", batch, "CA_ADDACCT", added),
            AuditRow("DimAccount", batch, "CA_CLOSEACCT", closed),
            AuditRow("DimAccount", batch, "CA_UPDACCT", updated),
            AuditRow("DimAccount", batch, "CA_ID_HIST", -1)]


def _generator_rows(sizes: Sizes) -> list[AuditRow]:
    """A subset of DIGen's Generator_audit.csv (SF in DIGen's internal units: 1000 x SF)."""
    def param(name: str, value: float) -> AuditRow:
        return AuditRow("Generator", 1, name, dvalue=str(float(value)))
    return [param("SF", sizes.scale_factor * 1000),
            AuditRow("Generator", 1, "FIRST_BATCH_DATE_START", date=BATCH_DATES[1].isoformat()),
            param("NUMBER_OF_INCREMENTAL_BATCHES", len(BATCH_DATES) - 1),
            AuditRow("Generator", 1, "DateBeginDate", date=DATE_TABLE_FIRST.isoformat()),
            AuditRow("Generator", 1, "DateEndDate",  # DIGen: the day after the last date
                     date=(DATE_TABLE_LAST + dt.timedelta(days=1)).isoformat()),
            # DIGen counts the quarters after the first (203 files, FWQuarters 202)
            AuditRow("Generator", 1, "FWQuarters", dvalue=str(FINWIRE_QUARTERS - 1)),
            param("THistScaling", 130.0),
            param("TLBPerc", 0.3), param("TLSPerc", 0.3), param("TMBPerc", 0.2),
            param("TMSPerc", 0.2), param("TSUpdateCount", TRADE_DAYS),
            AuditRow("Generator", 1, "TSTradesPerDay",   # DIGen: an integer in DValue
                     dvalue=str(sizes.trades_per_incremental_batch))]


#: Reference files DIGen writes an audit file for that states nothing but the header.
REFERENCE_AUDITS = ("Date", "Time", "StatusType", "TradeType", "Industry", "TaxRate")


def write_audits(root: Path, sizes: Sizes, brokers: int, finwire: FinwireFiles,
                 customers: CustomerHistory, trades: dict[int, TradeCounts],
                 history: dict[str, int]) -> list[FileReport]:
    """Write every audit file and return their reports."""
    files = [_write(root, "Generator_audit.csv", _generator_rows(sizes))]
    for batch, day in BATCH_DATES.items():
        files.append(_write(root, f"Batch{batch}_audit.csv", [
            # DIGen: Batch1 starts with the Date table, an incremental batch on its own day
            AuditRow("Batch", batch, "FirstDay",
                     date=(DATE_TABLE_FIRST if batch == 1 else day).isoformat()),
            AuditRow("Batch", batch, "LastDay", date=day.isoformat())]))
    files.append(_write(root, "Batch1/HR_audit.csv",
                        [AuditRow("DimBroker", 1, "HR_BROKERS", brokers)]))
    files += [_write(root, f"Batch1/{name}_audit.csv", []) for name in REFERENCE_AUDITS]
    for quarter, counts in finwire.per_quarter:
        files.append(_write(root, f"Batch1/FINWIRE{quarter}_audit.csv", [
            AuditRow("DimSecurity", 1, "FW_SEC", counts.sec),
            AuditRow("DimSecurity", 1, "FW_SEC_DUP", -1),
            AuditRow("DimCompany", 1, "FW_CMP", counts.cmp),
            AuditRow("DimCompany", 1, "FW_CMP_DUP", -1),
            AuditRow("Financial", 1, "FW_FIN", counts.fin),
            AuditRow("Financial", 1, "FW_FIN_DUP", -1)]))
    kinds = Counter(a.kind for a in customers.actions)
    files.append(_write(root, "Batch1/CustomerMgmt_audit.csv",
                        _account_rows(1, kinds["ADDACCT"], kinds["CLOSEACCT"], kinds["UPDACCT"])
                        + _customer_rows(1, kinds["NEW"], kinds["UPDCUST"], kinds["INACT"],
                                         customer_errors(
                                             [(a.customer, date_of_day(a.ts // SECONDS_PER_DAY))
                                              for a in customers.actions
                                              if a.kind in ("NEW", "UPDCUST")]))))
    files.append(_write(root, "Batch1/Trade_audit.csv", _trade_rows(trades[1])))
    files.append(_write(root, "Batch1/TradeHistory_audit.csv",
                        [AuditRow("DimTradeHistory", 1, k, v) for k, v in history.items()]))
    for batch, changes in customers.batches.items():
        rows = Counter(
            (r.flag, r.record.status, isinstance(r.record, Customer))
            for r in (*changes.customers, *changes.accounts))
        errors = customer_errors([(r.record, BATCH_DATES[batch]) for r in changes.customers
                                  if isinstance(r.record, Customer)])
        files.append(_write(root, f"Batch{batch}/Customer_audit.csv", _customer_rows(
            batch, rows["I", "ACTV", True], rows["U", "ACTV", True], rows["U", "INAC", True],
            errors)))
        files.append(_write(root, f"Batch{batch}/Account_audit.csv", _account_rows(
            batch, rows["I", "ACTV", False], rows["U", "INAC", False],
            rows["U", "ACTV", False])))
        files.append(_write(root, f"Batch{batch}/Trade_audit.csv", _trade_rows(trades[batch])))
    return files
