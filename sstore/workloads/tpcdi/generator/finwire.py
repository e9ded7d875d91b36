"""The FINWIRE files: one per quarter, FINWIRE1967Q1 .. FINWIRE2017Q3, no extension.

CMP and SEC records come from the market simulation; FIN records (quarterly financials, most of
the volume) are drawn here, one per company that exists for the whole quarter (the last,
partial quarter: up to the end of Batch1). Records of a file are ordered by posting time. All
203 files are always written, so loaders see DIGen's file set at every scale factor (an early
quarter may be empty at a very small SF). Each file's record counts go into its own
``FINWIRE<yyyy>Q<q>_audit.csv``, as DIGen writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .dates import (
    FINWIRE_FIRST_YEAR,
    FINWIRE_QUARTERS,
    SECONDS_PER_DAY,
    date_of_day,
    format_compact_date,
    format_pts,
    quarter_end,
    quarter_name,
    quarter_of,
    quarter_start,
)
from .finwire_layout import CMP_FIELDS, company_reference, format_record
from .market import FOREVER, Company, CompanySpan, Market, Posting, Security
from .report import FileReport
from .writer import money, money_list, write_lines


@dataclass(frozen=True)
class FinwireCounts:
    """Records written per type (an audit file's FW_CMP, FW_SEC, FW_FIN)."""

    cmp: int
    sec: int
    fin: int


@dataclass(frozen=True)
class FinwireFiles:
    """The files written and their record counts, in total and per file (quarter name ->
    counts, for the per-quarter audit files)."""

    files: tuple[FileReport, ...]
    counts: FinwireCounts
    per_quarter: tuple[tuple[str, FinwireCounts], ...] = ()


def cmp_line(pts: int, c: Company) -> str:
    """One CMP record, 543 characters."""
    a = c.address
    return format_record(CMP_FIELDS, {
        "PTS": format_pts(pts), "RecType": "CMP", "CompanyName": c.name, "CIK": c.cik,
        "Status": c.status, "IndustryID": c.industry_id, "SPrating": c.sp_rating,
        "FoundingDate": c.founding_date, "AddrLine1": a.line1, "AddrLine2": a.line2,
        "PostalCode": a.postal_code, "City": a.city, "StateProvince": a.state_province,
        "Country": a.country, "CEOname": c.ceo_name, "Description": c.description})


def sec_line(pts: int, s: Security) -> str:
    """One SEC record, 170 characters (company by CIK) or 220 (by name)."""
    fields, company = company_reference(s.company_cik, s.company_name, s.by_name)
    return format_record(fields, {
        "PTS": format_pts(pts), "RecType": "SEC", "Symbol": s.symbol, "IssueType": s.issue_type,
        "Status": s.status, "Name": s.name, "ExID": s.exchange, "ShOut": s.shares_outstanding,
        "FirstTradeDate": s.first_trade_date, "FirstTradeExchg": s.first_trade_exchange,
        "Dividend": money(s.dividend_cents), "CoNameOrCIK": company})


def _posting_line(p: Posting) -> str:
    return cmp_line(p.pts, p.record) if isinstance(p.record, Company) else sec_line(p.pts, p.record)


def _fin_lines(quarter: int, companies: tuple[CompanySpan, ...], created: np.ndarray,
               deleted: np.ndarray, rng: np.random.Generator) -> list[tuple[int, str]]:
    """(pts, line) of the FIN records of one quarter, values drawn as arrays."""
    start, end = quarter_start(quarter), quarter_end(quarter)
    which = np.flatnonzero((created < start) & (deleted >= end))
    n = len(which)
    if n == 0:
        return []
    pts = start + (rng.random(n) * (end - start)).astype(np.int64)
    revenue = rng.integers(1_000_000, 1_000_000_000_000, n)          # cents
    earnings = (revenue * rng.uniform(-0.2, 0.3, n)).astype(np.int64)
    shares = rng.integers(100_000, 1_000_000_000, n)
    diluted = (shares * rng.uniform(1.0, 1.1, n)).astype(np.int64)
    eps = earnings / 100 / shares
    diluted_eps = earnings / 100 / diluted
    margin = earnings / revenue
    inventory = (revenue * rng.uniform(0.0, 0.5, n)).astype(np.int64)
    assets = (revenue * rng.uniform(0.5, 5.0, n)).astype(np.int64)
    liabilities = (assets * rng.uniform(0.1, 0.9, n)).astype(np.int64)
    by_name = rng.random(n) < 0.5
    iso = np.datetime_as_string(pts.astype("datetime64[s]"), unit="s").tolist()
    year, q = divmod(quarter, 4)
    quarter_day = format_compact_date(date_of_day(start // SECONDS_PER_DAY))
    head = f"{FINWIRE_FIRST_YEAR + year:4d}{q + 1}{quarter_day}"
    columns = zip(which.tolist(), iso, money_list(revenue), earnings.tolist(),
                  eps.tolist(), diluted_eps.tolist(), margin.tolist(), money_list(inventory),
                  money_list(assets), money_list(liabilities), shares.tolist(),
                  diluted.tolist(), by_name.tolist(), pts.tolist())
    out: list[tuple[int, str]] = []
    for (c, s, rev, earn, e, de, m, inv, ast, liab, sh, dsh, named, t) in columns:
        co = companies[c]
        company = co.name.ljust(60) if named else co.cik
        line = (f"{s[0:4]}{s[5:7]}{s[8:10]}-{s[11:13]}{s[14:16]}{s[17:19]}FIN{head}"
                f"{s[0:4]}{s[5:7]}{s[8:10]}{rev:>17}{money(earn):>17}{e:>12.2f}"
                f"{de:>12.2f}{m:>12.2f}{inv:>17}{ast:>17}{liab:>17}{sh:>13}{dsh:>13}"
                f"{company}")
        out.append((t, line))
    return out


def write_finwire(root: Path, market: Market, rng: np.random.Generator) -> FinwireFiles:
    """Write Batch1/FINWIRE<yyyy>Q<q> for all 203 quarters."""
    companies = market.companies
    created = np.array([c.created for c in companies], dtype=np.int64)
    deleted = np.array([FOREVER if c.deleted is None else c.deleted for c in companies],
                       dtype=np.int64)
    by_quarter: dict[int, list[Posting]] = {}
    for p in market.postings:
        by_quarter.setdefault(quarter_of(p.pts), []).append(p)
    files: list[FileReport] = []
    per_quarter: list[tuple[str, FinwireCounts]] = []
    for quarter in range(FINWIRE_QUARTERS):
        postings = by_quarter.get(quarter, [])
        keyed = [(p.pts, 0, i, _posting_line(p)) for i, p in enumerate(postings)]
        fins = _fin_lines(quarter, companies, created, deleted, rng)
        keyed += [(t, 1, i, line) for i, (t, line) in enumerate(fins)]
        keyed.sort()
        per_quarter.append((quarter_name(quarter), FinwireCounts(
            sum(isinstance(p.record, Company) for p in postings),
            sum(isinstance(p.record, Security) for p in postings), len(fins))))
        files.append(write_lines(root, f"Batch1/FINWIRE{quarter_name(quarter)}",
                                 (k[3] for k in keyed)))
    total = FinwireCounts(*(sum(getattr(c, k) for _, c in per_quarter)
                            for k in ("cmp", "sec", "fin")))
    return FinwireFiles(tuple(files), total, tuple(per_quarter))
