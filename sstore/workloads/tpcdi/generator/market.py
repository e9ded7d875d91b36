"""Companies and securities from 1967 to mid-2017: the events FINWIRE's CMP and SEC report.

The simulation walks through time, so every rule that DimCompany, DimSecurity and DimTrade
rely on holds by construction: a security's company exists (ACTV, created on an earlier day)
when the security is posted; a company with active securities is never deleted; an entity gets
at most one record per day (no same-day versions to consolidate).

The mix is DIGen's, as its SF 3 output shows it: ``Sizes.companies`` CMP records, the same
number k = records // 202 in each quarter after the first and the rest (86 at SF 3) in 1967Q1;
of the later ones 1/7 change a company and 1/7 delete one, the rest are new companies (1,096
companies from 1,500 records at SF 3). SEC likewise from 1967Q2 (``Sizes.securities`` records,
k = records // 201 per later quarter, 1/11 changes, 1/11 deletes). A delete that finds no
company without active securities is dropped. Besides, four events are placed on purpose inside the
trade window (2013-2017), on securities that already trade there: a security moving to another
company (the SK_CompanyID check depends on it), a plain security change, a security delete, and a
change of a company whose securities trade (DimSecurity rows must be split there).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Final

import numpy as np

from .dates import (
    FINWIRE_QUARTERS,
    SECONDS_PER_DAY,
    TRADES_FIRST,
    date_of_day,
    format_compact_date,
    quarter_end,
    quarter_of,
    quarter_start,
    seconds,
)
from .people import Place, company_name, person, place
from .rand import Draw, IndexPool
from .reference_data import INDUSTRIES
from .scale import Sizes

SP_RATINGS = ("AAA", "AA+", "AA", "AA-", "A+", "A", "A-", "BBB+", "BBB", "BBB-", "BB+", "BB",
              "BB-", "B+", "B", "B-", "CCC+", "CCC", "CCC-", "CC", "C", "D")
ISSUE_TYPES = ("COMMON", "PREF_A", "PREF_B", "PREF_C", "PREF_D")
_ISSUE_NAMES: Mapping[str, str] = MappingProxyType({
    "COMMON": "Common Stock", "PREF_A": "Preferred Class A", "PREF_B": "Preferred Class B",
    "PREF_C": "Preferred Class C", "PREF_D": "Preferred Class D"})
_ISSUE_WEIGHTS = (0.73, 0.15, 0.07, 0.04, 0.01)
EXCHANGES = ("NYSE", "NASDAQ", "AMEX", "PCX")
#: valid_to_day of a security that is never deleted.
FOREVER: Final = 1 << 40

NEW_CMP, NEW_SEC, CHG_CMP, DEL_CMP, CHG_SEC, DEL_SEC = range(6)
#: Share of the CMP (SEC) records after the first quarter that change an entity; the same
#: share deletes one (DIGen SF 3: 202 of 1,414 CMP records, 201 of 2,211 SEC records).
CMP_CHANGE_SHARE, SEC_CHANGE_SHARE = 1 / 7, 1 / 11
MOVE_SEC_FORCED, CHG_SEC_FORCED, DEL_SEC_FORCED, CHG_CMP_FORCED = range(6, 10)


@dataclass(frozen=True)
class Company:
    """The content of one CMP record."""

    cik: str
    name: str
    status: str
    industry_id: str
    sp_rating: str
    founding_date: str
    address: Place
    ceo_name: str
    description: str


@dataclass(frozen=True)
class Security:
    """The content of one SEC record; the company is named by CIK or by name."""

    symbol: str
    issue_type: str
    status: str
    name: str
    exchange: str
    shares_outstanding: int
    first_trade_date: str
    first_trade_exchange: str
    dividend_cents: int
    company_cik: str
    company_name: str
    by_name: bool


@dataclass(frozen=True)
class Posting:
    """One CMP or SEC record with its posting time."""

    pts: int
    record: Company | Security


@dataclass(frozen=True)
class CompanySpan:
    """When a company existed (for FIN records): created and deleted posting times."""

    cik: str
    name: str
    created: int
    deleted: int | None


@dataclass(frozen=True)
class SecurityTimeline:
    """Days on which a new trade may use each security: valid_from <= day < valid_to."""

    symbols: tuple[str, ...]
    valid_from_day: np.ndarray
    valid_to_day: np.ndarray


@dataclass(frozen=True)
class Market:
    """Everything FINWIRE and the trades need from the simulation."""

    postings: tuple[Posting, ...]
    companies: tuple[CompanySpan, ...]
    securities: SecurityTimeline


@dataclass
class _Co:
    record: Company
    created: int
    last_day: int
    active: bool = True
    deleted: int | None = None
    securities: set[int] = field(default_factory=set)


@dataclass
class _Sec:
    record: Security
    company: int
    created: int
    last_day: int
    active: bool = True
    deleted: int | None = None


def _symbol(number: int) -> str:
    """DIGen-style symbol: base-26 letters, left-padded with 'A' to 15 characters."""
    letters = ""
    while number:
        number, digit = divmod(number, 26)
        letters = chr(65 + digit) + letters
    return letters.rjust(15, "A")


def _day_text(day: int) -> str:
    return format_compact_date(date_of_day(day))


class _Simulation:
    """The state of one run; lives only inside ``simulate_market``."""

    def __init__(self, sizes: Sizes, draw: Draw) -> None:
        self.draw = draw
        rng = draw.rng
        self.ciks = [f"{c:010d}" for c in rng.permutation(
            rng.integers(1_000, 10_000) + np.cumsum(rng.integers(1, 1_000, sizes.companies)))]
        self.symbols = [_symbol(int(n)) for n in rng.permutation(
            26 ** 2 + np.cumsum(rng.integers(1, 40, sizes.securities)))]
        self.names: set[str] = set()
        self.companies: list[_Co] = []
        self.securities: list[_Sec] = []
        self.active_companies = IndexPool()
        self.active_securities = IndexPool()
        self.postings: list[Posting] = []
        self.protected: set[int] = {0}  # securities random deletes must spare
        self.trades_first_day = seconds(TRADES_FIRST) // SECONDS_PER_DAY

    # -- record contents ---------------------------------------------------------------------
    def _company_fields(self, pts: int, cik: str, name: str) -> Company:
        d = self.draw
        day = pts // SECONDS_PER_DAY
        rating = d.letters(4) if d.chance(0.1) else d.pick(SP_RATINGS)
        founded = _day_text(day - d.integer(0, 36_500)) if d.chance(0.9) else ""
        address = place(d, canadian_share=0.15)
        if d.chance(0.03):
            address = replace(address, country="")
        first, last, _ = person(d)
        return Company(cik, name, "ACTV", d.pick(INDUSTRIES)[0], rating, founded, address,
                       f"{first} {last}", d.text(40, 150))

    def _security_fields(self, pts: int, symbol: str, company: Company) -> Security:
        d = self.draw
        day = pts // SECONDS_PER_DAY
        issue = d.weighted(ISSUE_TYPES, _ISSUE_WEIGHTS)
        first_trade = day - d.integer(0, 1_800)
        return Security(symbol, issue, "ACTV", f"{_ISSUE_NAMES[issue]} of {company.name}"[:70],
                        d.pick(EXCHANGES), d.integer(100_000, 1_000_000_000),
                        _day_text(first_trade), _day_text(first_trade + d.integer(0, 30)),
                        d.integer(0, 300), company.cik, company.name, d.chance(0.5))

    # -- events ------------------------------------------------------------------------------
    def new_company(self, pts: int) -> None:
        index = len(self.companies)
        record = self._company_fields(pts, self.ciks[index], company_name(self.draw, self.names))
        self.companies.append(_Co(record, pts, pts // SECONDS_PER_DAY))
        self.active_companies.add(index)
        self.postings.append(Posting(pts, record))

    def new_security(self, pts: int) -> None:
        day = pts // SECONDS_PER_DAY
        owner = self.active_companies.choose(
            self.draw, lambda c: self.companies[c].created // SECONDS_PER_DAY < day)
        if owner is None or len(self.securities) == len(self.symbols):
            return
        index = len(self.securities)
        record = self._security_fields(pts, self.symbols[index], self.companies[owner].record)
        self.securities.append(_Sec(record, owner, pts, day))
        self.companies[owner].securities.add(index)
        self.active_securities.add(index)
        self.postings.append(Posting(pts, record))

    def change_company(self, pts: int, forced: bool) -> bool:
        day = pts // SECONDS_PER_DAY
        ok: Callable[[int], bool] = lambda c: self.companies[c].last_day < day
        if forced:
            ok = lambda c: self.companies[c].last_day < day and any(
                self.securities[s].created // SECONDS_PER_DAY < self.trades_first_day
                for s in self.companies[c].securities)
        target = self.active_companies.choose(self.draw, ok)
        if target is None:
            return False
        co = self.companies[target]
        fresh = self._company_fields(pts, co.record.cik, co.record.name)
        co.record = replace(fresh, founding_date=co.record.founding_date)
        co.last_day = day
        self.postings.append(Posting(pts, co.record))
        return True

    def delete_company(self, pts: int) -> None:
        day = pts // SECONDS_PER_DAY
        target = self.active_companies.choose(
            self.draw,
            lambda c: self.companies[c].last_day < day and not self.companies[c].securities)
        if target is None:
            return
        co = self.companies[target]
        co.record = replace(co.record, status="INAC")
        co.active, co.deleted, co.last_day = False, pts, day
        self.active_companies.remove(target)
        self.postings.append(Posting(pts, co.record))

    def _security_ok(self, forced: bool) -> Callable[[int, int], bool]:
        def ok(s: int, day: int) -> bool:
            sec = self.securities[s]
            if sec.last_day >= day:
                return False
            if forced:
                return (s not in self.protected
                        and sec.created // SECONDS_PER_DAY < self.trades_first_day)
            return True
        return ok

    def change_security(self, pts: int, move: bool | None, forced: bool) -> bool:
        """Change a security; ``move`` True/False forces a company change or none."""
        day = pts // SECONDS_PER_DAY
        ok = self._security_ok(forced)
        target = self.active_securities.choose(self.draw, lambda s: ok(s, day))
        if target is None:
            return False
        sec = self.securities[target]
        if move is None:
            move = self.draw.chance(0.3)
        owner = sec.company
        if move:
            found = self.active_companies.choose(
                self.draw, lambda c: c != sec.company
                and self.companies[c].created // SECONDS_PER_DAY < day)
            if found is None and forced:
                return False
            owner = sec.company if found is None else found
        company = self.companies[owner].record
        fresh = self._security_fields(pts, sec.record.symbol, company)
        record = replace(fresh, first_trade_date=sec.record.first_trade_date,
                         first_trade_exchange=sec.record.first_trade_exchange)
        if owner != sec.company:
            self.companies[sec.company].securities.discard(target)
            self.companies[owner].securities.add(target)
            sec.company = owner
        sec.record, sec.last_day = record, day
        if forced:
            self.protected.add(target)
        self.postings.append(Posting(pts, record))
        return True

    def delete_security(self, pts: int, forced: bool) -> bool:
        day = pts // SECONDS_PER_DAY
        ok = self._security_ok(forced)
        target = self.active_securities.choose(
            self.draw, lambda s: ok(s, day) and s not in self.protected)
        if target is None:
            return False
        sec = self.securities[target]
        sec.record = replace(sec.record, status="INAC")
        sec.active, sec.deleted, sec.last_day = False, pts, day
        self.active_securities.remove(target)
        self.companies[sec.company].securities.discard(target)
        if forced:
            self.protected.add(target)
        self.postings.append(Posting(pts, sec.record))
        return True


def _schedule(sizes: Sizes, rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """(pts, order, kind) of every event, sorted; see the module docstring for the mix."""
    q = FINWIRE_QUARTERS
    starts = np.array([quarter_start(i) for i in range(q)] + [quarter_end(q - 1)],
                      dtype=np.int64)

    def times(quarters: np.ndarray) -> np.ndarray:
        span = starts[quarters + 1] - starts[quarters]
        at: np.ndarray = starts[quarters] + (rng.random(len(quarters)) * span).astype(np.int64)
        return at

    kinds: list[tuple[int, np.ndarray]] = []
    for first, records, (new, change, delete), share in (
            (0, sizes.companies, (NEW_CMP, CHG_CMP, DEL_CMP), CMP_CHANGE_SHARE),
            (1, sizes.securities, (NEW_SEC, CHG_SEC, DEL_SEC), SEC_CHANGE_SHARE)):
        later = q - 1 - first
        k = records // later
        n = k * later
        changes = deletes = round(n * share)
        mix = rng.permutation(np.repeat([new, change, delete], [n - changes - deletes, changes,
                                                                deletes]))
        quarters = first + 1 + np.arange(n) // max(k, 1)
        kinds.append((new, np.full(records - n, first)))
        kinds += [(kind, quarters[mix == kind]) for kind in (new, change, delete)]
    low, high = quarter_of(seconds(TRADES_FIRST)) + 2, FINWIRE_QUARTERS - 2
    forced = rng.choice(np.arange(low, high + 1), size=4, replace=False)
    for kind, quarter in zip((MOVE_SEC_FORCED, CHG_SEC_FORCED, DEL_SEC_FORCED, CHG_CMP_FORCED),
                             forced):
        kinds.append((kind, np.array([quarter])))
    events: list[tuple[int, int, int]] = []
    for kind, quarters in kinds:
        for pts in times(quarters.astype(np.int64)).tolist():
            events.append((pts, len(events), kind))
    events.sort()
    return events


def simulate_market(sizes: Sizes, draw: Draw) -> Market:
    """Run the simulation; raises RuntimeError if a forced event finds no candidate."""
    sim = _Simulation(sizes, draw)
    for pts, _, kind in _schedule(sizes, draw.rng):
        done = True
        if kind == NEW_CMP:
            sim.new_company(pts)
        elif kind == NEW_SEC:
            sim.new_security(pts)
        elif kind == CHG_CMP:
            sim.change_company(pts, forced=False)
        elif kind == DEL_CMP:
            sim.delete_company(pts)
        elif kind == CHG_SEC:
            sim.change_security(pts, move=None, forced=False)
        elif kind == DEL_SEC:
            sim.delete_security(pts, forced=False)
        elif kind == MOVE_SEC_FORCED:
            done = sim.change_security(pts, move=True, forced=True)
        elif kind == CHG_SEC_FORCED:
            done = sim.change_security(pts, move=False, forced=True)
        elif kind == DEL_SEC_FORCED:
            done = sim.delete_security(pts, forced=True)
        else:
            done = sim.change_company(pts, forced=True)
        if not done:
            raise RuntimeError(f"FINWIRE simulation: no candidate for forced event {kind}")
    secs = sim.securities
    timeline = SecurityTimeline(
        tuple(s.record.symbol for s in secs),
        np.array([s.created // SECONDS_PER_DAY + 1 for s in secs], dtype=np.int64),
        np.array([FOREVER if s.deleted is None else s.deleted // SECONDS_PER_DAY for s in secs],
                 dtype=np.int64))
    spans = tuple(CompanySpan(c.record.cik, c.record.name, c.created, c.deleted)
                  for c in sim.companies)
    return Market(tuple(sim.postings), spans, timeline)
