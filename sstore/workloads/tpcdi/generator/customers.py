"""Customer and account records, the actions and CDC rows that carry them, and their values.

The records hold complete current values: a CustomerMgmt action writes only what it changed
(``Action.changed``), a Customer.txt or Account.txt row writes everything. The values have the
layouts document's shapes; updates never change a value to empty, which sidesteps the
"present but empty element" ambiguity of UPDCUST/UPDACCT. Tiers and birth dates are always
valid, so DimCustomer raises no alerts (DIGen's SF 10 Batch1 audit also counts none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from .people import email, person, place
from .rand import Draw
from .reference_data import CA_BRACKETS, US_BRACKETS, US_COUNTRY

T = TypeVar("T")

NEW, ADDACCT, UPDACCT, CLOSEACCT, UPDCUST, INACT = (
    "NEW", "ADDACCT", "UPDACCT", "CLOSEACCT", "UPDCUST", "INACT")
ACTION_TYPES = (NEW, ADDACCT, UPDACCT, CLOSEACCT, UPDCUST, INACT)


@dataclass(frozen=True)
class Phone:
    """One of a customer's three phones; empty strings are empty elements/fields."""

    ctry_code: str
    area_code: str
    local: str
    ext: str


NO_PHONE = Phone("", "", "", "")
#: DIGen leaves C_TIER empty like other optional items (PERCENT_NULL 0.05; its audit counts
#: those as C_TIER_INV: 251 at SF 3) and writes a birth date out of range for about one
#: customer in a thousand each way (CMAcctDOBErrPct 0.001; C_DOB_TO 4, C_DOB_TY 4 at SF 3).
TIER_NULL_SHARE = 0.05
DOB_ERROR_SHARE = 0.001
VALID_TIERS = ("1", "2", "3")


@dataclass(frozen=True)
class Customer:
    """A customer's complete current values (what a Customer.txt row carries)."""

    c_id: int
    tax_id: str
    status: str
    l_name: str
    f_name: str
    m_name: str
    gender: str
    tier: str
    dob: str
    adline1: str
    adline2: str
    zipcode: str
    city: str
    state_prov: str
    ctry: str
    phones: tuple[Phone, Phone, Phone]
    email1: str
    email2: str
    lcl_tx_id: str
    nat_tx_id: str


@dataclass(frozen=True)
class Account:
    """An account's complete current values (what an Account.txt row carries)."""

    ca_id: int
    c_id: int
    b_id: int
    name: str
    tax_st: int
    status: str


@dataclass(frozen=True)
class Action:
    """One TPCDI:Action: the customer (and account) after it, and which items it changed."""

    kind: str
    ts: int
    customer: Customer
    account: Account | None
    changed: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CdcRow:
    """One Customer.txt or Account.txt row."""

    flag: str
    dsn: int
    record: Customer | Account


@dataclass(frozen=True)
class BatchChanges:
    """The Customer.txt and Account.txt rows of one incremental batch, in CDC_DSN order."""

    batch: int
    customers: tuple[CdcRow, ...]
    accounts: tuple[CdcRow, ...]


@dataclass(frozen=True)
class AccountTimeline:
    """Days on which a new trade may use each account: valid_from <= day < valid_to."""

    account_ids: np.ndarray
    valid_from_day: np.ndarray
    valid_to_day: np.ndarray


@dataclass(frozen=True)
class CustomerHistory:
    """Everything the customer files, the audit and the trades need."""

    actions: tuple[Action, ...]
    batches: dict[int, BatchChanges]
    accounts: AccountTimeline


def _other(draw: Draw, make: Callable[[], T], current: T) -> T:
    """A fresh value different from ``current`` (changes must change something)."""
    while True:
        value = make()
        if value != current:
            return value


class Values:
    """Draws customer and account contents (new ones and changed versions)."""

    def __init__(self, draw: Draw, brokers: np.ndarray) -> None:
        self.d = draw
        self.brokers = brokers.tolist()

    def phone(self) -> Phone:
        d = self.d
        return Phone("1" if d.chance(0.5) else "", d.digits(3) if d.chance(0.8) else "",
                     f"{d.digits(3)}-{d.digits(4)}", d.digits(3) if d.chance(0.1) else "")

    def _taxes(self, state: str, country: str) -> tuple[str, str]:
        brackets = US_BRACKETS if country == US_COUNTRY else CA_BRACKETS
        national = "US" if country == US_COUNTRY else "CN"
        return (f"{state}{self.d.integer(1, brackets)}",
                f"{national}{self.d.integer(1, brackets)}")

    def customer(self, c_id: int) -> Customer:
        d = self.d
        first, last, middle = person(d)
        gender = "U" if d.chance(0.02) else d.pick(("M", "F"))
        # an error DOB is before 1900 (over 100 years before any action) or after 2017
        year = d.integer(1930, 1999)
        if d.chance(2 * DOB_ERROR_SHARE):
            year = d.integer(1850, 1899) if d.chance(0.5) else d.integer(2018, 2030)
        dob = f"{year}-{d.integer(1, 12):02d}-{d.integer(1, 28):02d}"
        tier = "" if d.chance(TIER_NULL_SHARE) else str(d.weighted((1, 2, 3), (0.2, 0.5, 0.3)))
        where = place(d)
        lcl, nat = self._taxes(where.state_province, where.country)
        phones = (self.phone(), self.phone() if d.chance(0.7) else NO_PHONE,
                  self.phone() if d.chance(0.3) else NO_PHONE)
        alt = email(d, first, last) if d.chance(0.5) else ""
        return Customer(c_id, f"{d.digits(3)}-{d.digits(2)}-{d.digits(4)}", "ACTV", last, first,
                        middle, gender, tier, dob,
                        where.line1, where.line2, where.postal_code, where.city,
                        where.state_province, where.country, phones, email(d, first, last),
                        alt, lcl, nat)

    def account(self, ca_id: int, c_id: int) -> Account:
        d = self.d
        name = d.text(30, 50) if d.chance(0.95) else ""
        return Account(ca_id, c_id, d.pick(self.brokers), name, d.integer(0, 2), "ACTV")

    def change_customer(self, c: Customer) -> tuple[Customer, frozenset[str]]:
        """A new version of ``c`` with one or two groups of items changed (never to empty)."""
        d = self.d
        groups = ["tier", "address", "email", "phone", "name", "tax"]
        chosen = {d.pick(groups) for _ in range(d.integer(1, 2))}
        changed: set[str] = set()
        if "tier" in chosen:
            c = replace(c, tier=d.pick([t for t in VALID_TIERS if t != c.tier]))
            changed.add("C_TIER")
        if "address" in chosen:
            where = place(d, canadian_share=0.0 if c.ctry == US_COUNTRY else 1.0)
            lcl, _ = self._taxes(where.state_province, where.country)
            c = replace(c, adline1=where.line1, adline2=where.line2 or c.adline2,
                        zipcode=where.postal_code, city=where.city,
                        state_prov=where.state_province, lcl_tx_id=lcl)
            changed |= {"C_ADLINE1", "C_ZIPCODE", "C_CITY", "C_STATE_PROV", "C_LCL_TX_ID"}
            if where.line2:
                changed.add("C_ADLINE2")
        if "email" in chosen:
            if d.chance(0.5):
                c = replace(c, email1=email(d, c.f_name, c.l_name))
                changed.add("C_PRIM_EMAIL")
            else:
                c = replace(c, email2=email(d, c.f_name, c.l_name))
                changed.add("C_ALT_EMAIL")
        if "phone" in chosen:
            k = d.integer(0, 2)
            phones = list(c.phones)
            phones[k] = self.phone()
            c = replace(c, phones=(phones[0], phones[1], phones[2]))
            changed.add(f"C_PHONE_{k + 1}")
        if "name" in chosen:
            c = replace(c, l_name=_other(d, lambda: person(d)[1], c.l_name))
            changed.add("C_L_NAME")
        if "tax" in chosen:
            national = c.nat_tx_id[:2]
            brackets = US_BRACKETS if national == "US" else CA_BRACKETS
            options = [f"{national}{k}" for k in range(1, brackets + 1)
                       if f"{national}{k}" != c.nat_tx_id]
            c = replace(c, nat_tx_id=d.pick(options))
            changed.add("C_NAT_TX_ID")
        return c, frozenset(changed)

    def change_account(self, a: Account) -> tuple[Account, frozenset[str]]:
        """A new version of ``a`` with one to three items changed (never to empty)."""
        d = self.d
        changed: set[str] = set()
        while not changed:
            if d.chance(0.5) and len(self.brokers) > 1:
                a = replace(a, b_id=_other(d, lambda: d.pick(self.brokers), a.b_id))
                changed.add("CA_B_ID")
            if d.chance(0.4):
                a = replace(a, name=d.text(30, 50))
                changed.add("CA_NAME")
            if d.chance(0.4):
                a = replace(a, tax_st=d.pick([t for t in (0, 1, 2) if t != a.tax_st]))
                changed.add("CA_TAX_ST")
        return a, frozenset(changed)
