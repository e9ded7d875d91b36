"""The walk through time that produces the CustomerMgmt actions (Batch1) and the Customer.txt /
Account.txt changes (Batch2, Batch3).

Walking in time order keeps the DimCustomer and DimAccount rules true by construction:
non-NEW actions name ids created earlier; nothing happens to a closed account or an inactive
customer; a customer together with its accounts changes at most once per day, so no same-day
versions need consolidating (also across Customer.txt and Account.txt of one batch); brokers
are HR job-code-314 employees.

Customer 0 and its account 0 are never closed, so that at every moment since 2007 at least one
account exists on which trades can be made, even at the smallest scale factor.

``AccountTimeline`` says on which days a new trade may use each account: from the day after it
was opened in Batch1, or from its batch day for accounts opened by Account.txt (DimAccount makes
them current before that batch's trades are loaded), up to (excluding) the day the account or
its customer was closed.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .customers import (
    ACTION_TYPES,
    ADDACCT,
    CLOSEACCT,
    INACT,
    NEW,
    UPDACCT,
    UPDCUST,
    Account,
    AccountTimeline,
    Action,
    BatchChanges,
    CdcRow,
    Customer,
    CustomerHistory,
    Values,
)
from .dates import (
    ACTIONS_FIRST,
    BATCH_DATES,
    INCREMENTAL_BATCHES,
    SECONDS_PER_DAY,
    batch_end,
    day_number,
    seconds,
)
from .market import FOREVER
from .rand import Draw, IndexPool
from .scale import Sizes

#: DIGen's Batch1 mix at SF 10: 15,280 / 15,190 / 8,680 / 4,340 / 4,340 / 2,170 of 50,000.
ACTION_MIX = (0.3056, 0.3038, 0.1736, 0.0868, 0.0868, 0.0434)


class _Book:
    """Current customers and accounts of one run, with what the timeline needs."""

    def __init__(self, values: Values, draw: Draw) -> None:
        self.values = values
        self.draw = draw
        self.customers: list[Customer] = []
        self.accounts: list[Account] = []
        self.owned: list[list[int]] = []
        self.last_day: list[int] = []
        self.valid_from: list[int] = []
        self.valid_to: list[int] = []
        self.active_customers = IndexPool()
        self.active_accounts = IndexPool()

    # -- choosing ----------------------------------------------------------------------------
    def choose_customer(self, day: int, protect: bool = False) -> int | None:
        """An active customer with no change yet today (never customer 0 if ``protect``)."""
        return self.active_customers.choose(
            self.draw, lambda c: self.last_day[c] < day and not (protect and c == 0))

    def choose_account(self, day: int, protect: bool = False) -> int | None:
        """An open account whose customer has no change yet today."""
        return self.active_accounts.choose(
            self.draw, lambda a: self.last_day[self.accounts[a].c_id] < day
            and not (protect and a == 0))

    # -- changing ----------------------------------------------------------------------------
    def open_account(self, c_id: int, day: int, valid_from: int) -> Account:
        account = self.values.account(len(self.accounts), c_id)
        self.accounts.append(account)
        self.owned[c_id].append(account.ca_id)
        self.valid_from.append(valid_from)
        self.valid_to.append(FOREVER)
        self.active_accounts.add(account.ca_id)
        self.last_day[c_id] = day
        return account

    def open_customer(self, day: int, valid_from: int) -> tuple[Customer, Account]:
        customer = self.values.customer(len(self.customers))
        self.customers.append(customer)
        self.owned.append([])
        self.last_day.append(day)
        self.active_customers.add(customer.c_id)
        return customer, self.open_account(customer.c_id, day, valid_from)

    def update_customer(self, c_id: int, day: int) -> tuple[Customer, frozenset[str]]:
        customer, changed = self.values.change_customer(self.customers[c_id])
        self.customers[c_id] = customer
        self.last_day[c_id] = day
        return customer, changed

    def inactivate_customer(self, c_id: int, day: int) -> Customer:
        customer = replace(self.customers[c_id], status="INAC")
        self.customers[c_id] = customer
        self.last_day[c_id] = day
        self.active_customers.remove(c_id)
        for ca_id in self.owned[c_id]:
            if self.accounts[ca_id].status == "ACTV":
                self._close(ca_id, day)
        return customer

    def update_account(self, ca_id: int, day: int) -> tuple[Account, frozenset[str]]:
        account, changed = self.values.change_account(self.accounts[ca_id])
        self.accounts[ca_id] = account
        self.last_day[account.c_id] = day
        return account, changed

    def close_account(self, ca_id: int, day: int) -> Account:
        self._close(ca_id, day)
        self.last_day[self.accounts[ca_id].c_id] = day
        return self.accounts[ca_id]

    def _close(self, ca_id: int, day: int) -> None:
        self.accounts[ca_id] = replace(self.accounts[ca_id], status="INAC")
        self.valid_to[ca_id] = day
        self.active_accounts.remove(ca_id)

    def timeline(self) -> AccountTimeline:
        return AccountTimeline(np.arange(len(self.accounts), dtype=np.int64),
                               np.array(self.valid_from, dtype=np.int64),
                               np.array(self.valid_to, dtype=np.int64))


def _action(book: _Book, kind: str, ts: int) -> Action | None:
    """Apply one Batch1 action at ``ts``; None when no entity qualifies (caller makes a NEW)."""
    day = ts // SECONDS_PER_DAY
    if kind == NEW:
        customer, account = book.open_customer(day, day + 1)
        return Action(NEW, ts, customer, account)
    if kind in (ADDACCT, UPDCUST, INACT):
        c_id = book.choose_customer(day, protect=kind == INACT)
        if c_id is None:
            return None
        if kind == ADDACCT:
            account = book.open_account(c_id, day, day + 1)
            return Action(ADDACCT, ts, book.customers[c_id], account)
        if kind == UPDCUST:
            customer, changed = book.update_customer(c_id, day)
            return Action(UPDCUST, ts, customer, None, changed)
        return Action(INACT, ts, book.inactivate_customer(c_id, day), None)
    ca_id = book.choose_account(day, protect=kind == CLOSEACCT)
    if ca_id is None:
        return None
    if kind == UPDACCT:
        account, changed = book.update_account(ca_id, day)
        return Action(UPDACCT, ts, book.customers[account.c_id], account, changed)
    account = book.close_account(ca_id, day)
    return Action(CLOSEACCT, ts, book.customers[account.c_id], account)


def _batch(book: _Book, sizes: Sizes, batch: int, dsn: dict[str, int]) -> BatchChanges:
    """One incremental batch's changes, all dated on its BatchDate."""
    day = day_number(BATCH_DATES[batch])
    customers: list[tuple[str, Customer]] = []
    accounts: list[tuple[str, Account]] = []
    for _ in range(sizes.new_customers):
        customer, account = book.open_customer(day, day)
        customers.append(("I", customer))
        accounts.append(("I", account))
    for _ in range(sizes.updated_customers):
        if (c_id := book.choose_customer(day)) is not None:
            customers.append(("U", book.update_customer(c_id, day)[0]))
    for _ in range(sizes.inactivated_customers):
        if (c_id := book.choose_customer(day, protect=True)) is not None:
            customers.append(("U", book.inactivate_customer(c_id, day)))
    for _ in range(sizes.added_accounts):
        if (c_id := book.choose_customer(day)) is not None:
            accounts.append(("I", book.open_account(c_id, day, day)))
    for _ in range(sizes.updated_accounts):
        if (ca_id := book.choose_account(day)) is not None:
            accounts.append(("U", book.update_account(ca_id, day)[0]))
    for _ in range(sizes.closed_accounts):
        if (ca_id := book.choose_account(day, protect=True)) is not None:
            accounts.append(("U", book.close_account(ca_id, day)))

    def numbered(kind: str, rows: list[tuple[str, Customer]] | list[tuple[str, Account]]
                 ) -> tuple[CdcRow, ...]:
        out: list[CdcRow] = []
        for i in book.draw.rng.permutation(len(rows)).tolist():
            dsn[kind] += 1
            out.append(CdcRow(rows[i][0], dsn[kind], rows[i][1]))
        return tuple(out)

    return BatchChanges(batch, numbered("customer", customers), numbered("account", accounts))


def simulate_customers(sizes: Sizes, brokers: np.ndarray, draw: Draw) -> CustomerHistory:
    """All customer and account events of the three batches."""
    book = _Book(Values(draw, brokers), draw)
    rng = draw.rng
    n = sizes.customer_actions
    times = np.sort(rng.integers(seconds(ACTIONS_FIRST), batch_end(1), n)).tolist()
    kinds = rng.choice(len(ACTION_TYPES), size=n, p=np.array(ACTION_MIX) / sum(ACTION_MIX))
    kinds[0] = ACTION_TYPES.index(NEW)
    actions: list[Action] = []
    for ts, k in zip(times, kinds.tolist()):
        action = _action(book, ACTION_TYPES[k], ts) or _action(book, NEW, ts)
        assert action is not None
        actions.append(action)
    dsn = {"customer": 0, "account": 0}
    batches = {b: _batch(book, sizes, b, dsn) for b in INCREMENTAL_BATCHES}
    return CustomerHistory(tuple(actions), batches, book.timeline())
