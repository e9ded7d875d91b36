"""CustomerMgmt.xml (Batch1) and Customer.txt / Account.txt (Batch2, Batch3).

The XML has DIGen's shape: root ``TPCDI:Actions`` in the TPC-DI namespace, one
``TPCDI:Action`` per event in ActionTS order, unprefixed children, tab indentation, one element
per line, empty values as empty elements (``<C_M_NAME/>``). A NEW action writes everything, an
UPDCUST/UPDACCT only the changed items (a changed phone whole), CLOSEACCT an empty Account,
INACT an empty Customer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from .customers import (
    ADDACCT,
    CLOSEACCT,
    NEW,
    UPDACCT,
    UPDCUST,
    Account,
    Action,
    CdcRow,
    Customer,
    CustomerHistory,
    Phone,
)
from .dates import format_action_ts
from .report import FileReport
from .writer import CRLF, pipe, write_lines, write_text

NAMESPACE = "http://www.tpc.org/tpc-di"

#: Customer child groups and their elements, in document order, with how to read each value.
_GROUPS: tuple[tuple[str, tuple[tuple[str, Callable[[Customer], str]], ...]], ...] = (
    ("Name", (("C_L_NAME", lambda c: c.l_name), ("C_F_NAME", lambda c: c.f_name),
              ("C_M_NAME", lambda c: c.m_name))),
    ("Address", (("C_ADLINE1", lambda c: c.adline1), ("C_ADLINE2", lambda c: c.adline2),
                 ("C_ZIPCODE", lambda c: c.zipcode), ("C_CITY", lambda c: c.city),
                 ("C_STATE_PROV", lambda c: c.state_prov), ("C_CTRY", lambda c: c.ctry))),
    ("ContactInfo", (("C_PRIM_EMAIL", lambda c: c.email1), ("C_ALT_EMAIL", lambda c: c.email2),
                     ("C_PHONE_1", lambda c: ""), ("C_PHONE_2", lambda c: ""),
                     ("C_PHONE_3", lambda c: ""))),
    ("TaxInfo", (("C_LCL_TX_ID", lambda c: c.lcl_tx_id), ("C_NAT_TX_ID", lambda c: c.nat_tx_id))),
)
_ATTRIBUTES: tuple[tuple[str, Callable[[Customer], str]], ...] = (
    ("C_TAX_ID", lambda c: c.tax_id), ("C_GNDR", lambda c: c.gender),
    ("C_TIER", lambda c: c.tier), ("C_DOB", lambda c: c.dob),
)


def _element(indent: int, tag: str, value: str) -> str:
    tabs = "\t" * indent
    return f"{tabs}<{tag}>{escape(value)}</{tag}>" if value else f"{tabs}<{tag}/>"


def _phone(indent: int, tag: str, phone: Phone) -> list[str]:
    tabs = "\t" * indent
    return [f"{tabs}<{tag}>", _element(indent + 1, "C_CTRY_CODE", phone.ctry_code),
            _element(indent + 1, "C_AREA_CODE", phone.area_code),
            _element(indent + 1, "C_LOCAL", phone.local),
            _element(indent + 1, "C_EXT", phone.ext), f"{tabs}</{tag}>"]


def _account(indent: int, account: Account, changed: frozenset[str] | None) -> list[str]:
    """An Account element: whole (``changed`` None) or only the changed items."""
    tabs = "\t" * indent
    attrs = f"CA_ID={quoteattr(str(account.ca_id))}"
    if changed is None or "CA_TAX_ST" in changed:
        attrs += f" CA_TAX_ST={quoteattr(str(account.tax_st))}"
    children: list[str] = []
    if changed is None or "CA_B_ID" in changed:
        children.append(_element(indent + 1, "CA_B_ID", str(account.b_id)))
    if changed is None or "CA_NAME" in changed:
        children.append(_element(indent + 1, "CA_NAME", account.name))
    if not children:
        return [f"{tabs}<Account {attrs}/>"]
    return [f"{tabs}<Account {attrs}>", *children, f"{tabs}</Account>"]


def _customer(action: Action) -> list[str]:
    """The Customer element of one action (indented inside TPCDI:Action)."""
    c, kind = action.customer, action.kind
    full = kind == NEW
    include: Callable[[str], bool] = (lambda tag: True) if full else \
        (lambda tag: kind == UPDCUST and tag in action.changed)
    attrs = f"C_ID={quoteattr(str(c.c_id))}"
    for name, get in _ATTRIBUTES:
        if include(name) and get(c):
            attrs += f" {name}={quoteattr(get(c))}"
    body: list[str] = []
    for group, items in _GROUPS:
        inner: list[str] = []
        for tag, get in items:
            if not include(tag):
                continue
            if tag.startswith("C_PHONE_"):
                inner += _phone(4, tag, c.phones[int(tag[-1]) - 1])
            else:
                inner.append(_element(4, tag, get(c)))
        if inner:
            body += [f"\t\t\t<{group}>", *inner, f"\t\t\t</{group}>"]
    if action.account is not None:
        if kind in (NEW, ADDACCT):
            body += _account(3, action.account, None)
        elif kind == UPDACCT:
            body += _account(3, action.account, action.changed)
        elif kind == CLOSEACCT:
            body.append(f"\t\t\t<Account CA_ID={quoteattr(str(action.account.ca_id))}/>")
    if not body:
        return [f"\t\t<Customer {attrs}/>"]
    return [f"\t\t<Customer {attrs}>", *body, "\t\t</Customer>"]


def customer_mgmt_xml(actions: tuple[Action, ...]) -> str:
    """The whole CustomerMgmt.xml document (CRLF line ends)."""
    lines = ['<?xml version="1.0" encoding="UTF-8"?>',
             f'<TPCDI:Actions xmlns:TPCDI="{NAMESPACE}">']
    for action in actions:
        lines.append(f'\t<TPCDI:Action ActionType="{action.kind}" '
                     f'ActionTS="{format_action_ts(action.ts)}">')
        lines += _customer(action)
        lines.append("\t</TPCDI:Action>")
    lines.append("</TPCDI:Actions>")
    return CRLF.join(lines) + CRLF


def customer_fields(c: Customer) -> list[object]:
    """The 31 Customer.txt fields after CDC_FLAG and CDC_DSN."""
    phones: list[object] = []
    for p in c.phones:
        phones += [p.ctry_code, p.area_code, p.local, p.ext]
    return [c.c_id, c.tax_id, c.status, c.l_name, c.f_name, c.m_name, c.gender, c.tier, c.dob,
            c.adline1, c.adline2, c.zipcode, c.city, c.state_prov, c.ctry, *phones, c.email1,
            c.email2, c.lcl_tx_id, c.nat_tx_id]


def account_fields(a: Account) -> list[object]:
    """The 6 Account.txt fields after CDC_FLAG and CDC_DSN."""
    return [a.ca_id, a.b_id, a.c_id, a.name, a.tax_st, a.status]


def _cdc_line(row: CdcRow) -> str:
    record = row.record
    fields = customer_fields(record) if isinstance(record, Customer) else account_fields(record)
    return pipe([row.flag, row.dsn, *fields])


def write_customer_files(root: Path, history: CustomerHistory) -> list[FileReport]:
    """Write Batch1/CustomerMgmt.xml and Customer.txt, Account.txt of each later batch.

    The XML's row count in the report is its number of actions.
    """
    xml = write_text(root, "Batch1/CustomerMgmt.xml", customer_mgmt_xml(history.actions))
    files = [FileReport(xml.path, len(history.actions), xml.bytes)]
    for batch, changes in history.batches.items():
        files.append(write_lines(root, f"Batch{batch}/Customer.txt",
                                 (_cdc_line(r) for r in changes.customers)))
        files.append(write_lines(root, f"Batch{batch}/Account.txt",
                                 (_cdc_line(r) for r in changes.accounts)))
    return files
