"""Trades: accounts, securities and amounts for every lifecycle, and the Trade.txt /
TradeHistory.txt lines of each batch with their audit counts.

Each trade gets an account and a security that are valid on its creation day (see
``AccountTimeline`` and ``SecurityTimeline``): for Batch1 the DimAccount/DimSecurity version
of that day, for incremental batches the current one. Amounts are integer cents, so the alert
conditions (T_COMM or T_CHRG > T_TRADE_PRICE * T_QTY) are exact and the audit counts computed
here are the ones a reader recomputes from the text.

About 1 in 10,000 trades has a commission and 1 in 10,000 a fee of 1.01..10 times the trade
value (DIGen's rate). On top, every batch is given a minimum of such trades among those that
complete in it (see ``MIN_ALERTS``), because at small scale factors chance would give none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from .dates import SECONDS_PER_DAY, batch_of, format_datetimes
from .lifecycles import CMPT, CNCL, DSN_STEP, STATES, TYPES, Lifecycles
from .report import TradeCounts
from .writer import money_list

ALERT_RATE = 1e-4
#: batch -> (commission alerts, fee alerts, trades with both) that the batch must contain.
MIN_ALERTS: Mapping[int, tuple[int, int, int]] = MappingProxyType(
    {1: (3, 3, 1), 2: (1, 1, 0), 3: (1, 1, 0)})
_MAX_REJECTION_ROUNDS = 200


@dataclass(frozen=True)
class TradeBook:
    """Every trade (row = T_ID) with its lifecycle and its unchanging fields."""

    life: Lifecycles
    account: np.ndarray      # T_CA_ID
    symbol: np.ndarray       # index into symbols
    symbols: tuple[str, ...]
    is_cash: np.ndarray      # bool
    quantity: np.ndarray
    bid: np.ndarray          # cents
    price: np.ndarray        # cents
    charge: np.ndarray       # cents
    commission: np.ndarray   # cents
    tax: np.ndarray          # cents
    executor: np.ndarray     # T_EXEC_NAME: a broker's EmployeeID

    @property
    def gross(self) -> np.ndarray:
        """T_TRADE_PRICE * T_QTY in cents."""
        gross: np.ndarray = self.price * self.quantity
        return gross


@dataclass(frozen=True)
class TradeLines:
    """The text lines of the trade files and what the audit needs about them."""

    batch1: list[str]
    history: list[str]
    incremental: dict[int, list[str]]
    counts: dict[int, TradeCounts]
    history_counts: dict[str, int]


def pick_valid(rng: np.random.Generator, valid_from: np.ndarray, valid_to: np.ndarray,
               days: np.ndarray) -> np.ndarray:
    """For each day, a uniformly random index i with valid_from[i] <= day < valid_to[i].

    Rejection sampling keeps this vectorized: most candidates are valid on most days. Days
    that stay unlucky are settled exactly at the end; a day with no valid item is a bug in the
    simulations and raises.
    """
    m = len(valid_from)
    idx = rng.integers(0, m, len(days))
    bad = ~((valid_from[idx] <= days) & (days < valid_to[idx]))
    for _ in range(_MAX_REJECTION_ROUNDS):
        where = np.flatnonzero(bad)
        if len(where) == 0:
            return idx
        idx[where] = rng.integers(0, m, len(where))
        chosen, on = idx[where], days[where]
        bad[where] = ~((valid_from[chosen] <= on) & (on < valid_to[chosen]))
    for i in np.flatnonzero(bad).tolist():
        eligible = np.flatnonzero((valid_from <= days[i]) & (days[i] < valid_to))
        if len(eligible) == 0:
            raise RuntimeError(f"no valid account or security on day {int(days[i])}")
        idx[i] = eligible[int(rng.integers(0, len(eligible)))]
    return idx


def _completion_batch(life: Lifecycles) -> np.ndarray:
    """The batch in which each trade completes (0 if it does not within Batch3)."""
    batches = batch_of(life.time)
    completed = (life.state == CMPT) & (batches > 0)
    return np.where(completed.any(axis=1), np.where(completed, batches, 0).max(axis=1), 0)


def _alert_flags(rng: np.random.Generator, life: Lifecycles) -> tuple[np.ndarray, np.ndarray]:
    """Which trades get an invalid commission and which an invalid fee."""
    commission = rng.random(life.n) < ALERT_RATE
    charge = rng.random(life.n) < ALERT_RATE
    done_in = _completion_batch(life)
    for batch, (n_commission, n_charge, n_both) in MIN_ALERTS.items():
        pool = np.flatnonzero(done_in == batch)
        for flags, need in (((commission, charge), n_both), ((commission,), n_commission),
                            ((charge,), n_charge)):
            have = np.all([f[pool] for f in flags], axis=0).sum() if len(pool) else 0
            free = pool[~(commission[pool] | charge[pool])]
            k = min(max(0, need - int(have)), len(free))
            for i in rng.choice(free, size=k, replace=False).tolist():
                for f in flags:
                    f[i] = True
    return commission, charge


def build_trades(life: Lifecycles, accounts_from: np.ndarray, accounts_to: np.ndarray,
                 account_ids: np.ndarray, symbols: tuple[str, ...], symbols_from: np.ndarray,
                 symbols_to: np.ndarray, brokers: np.ndarray,
                 rng: np.random.Generator) -> TradeBook:
    """Give every lifecycle its account, security and amounts."""
    n = life.n
    days = life.time[:, 0] // SECONDS_PER_DAY
    account = account_ids[pick_valid(rng, accounts_from, accounts_to, days)]
    symbol = pick_valid(rng, symbols_from, symbols_to, days)
    quantity = rng.integers(10, 10_001, n)
    bid = rng.integers(101, 1_001, n)
    price = np.rint(bid * rng.uniform(0.95, 1.05, n)).astype(np.int64)
    gross = price * quantity
    charge = np.rint(gross * rng.uniform(0.0001, 0.005, n)).astype(np.int64)
    commission = np.rint(gross * rng.uniform(0.0001, 0.005, n)).astype(np.int64)
    tax = np.rint(gross * rng.uniform(0.05, 0.40, n)).astype(np.int64)
    is_cash = rng.random(n) < 0.2
    executor = brokers[rng.integers(0, len(brokers), n)]
    bad_commission, bad_charge = _alert_flags(rng, life)
    commission = np.where(bad_commission,
                          np.ceil(gross * rng.uniform(1.01, 10.0, n)).astype(np.int64), commission)
    charge = np.where(bad_charge,
                      np.ceil(gross * rng.uniform(1.01, 10.0, n)).astype(np.int64), charge)
    return TradeBook(life, account, symbol, symbols, is_cash, quantity, bid, price, charge,
                     commission, tax, executor)


def _lines(book: TradeBook, tids: np.ndarray, steps: np.ndarray, cdc: bool) -> list[str]:
    """Trade.txt lines of (trade, state step) pairs; with CDC_FLAG and CDC_DSN if ``cdc``."""
    life = book.life
    states = life.state[tids, steps]
    dts = format_datetimes(life.time[tids, steps])
    completed = states == CMPT
    amounts = ["|||"] * len(tids)
    where = np.flatnonzero(completed)
    t = tids[where]
    for k, p, c, m, x in zip(where.tolist(), money_list(book.price[t]),
                             money_list(book.charge[t]), money_list(book.commission[t]),
                             money_list(book.tax[t])):
        amounts[k] = f"{p}|{c}|{m}|{x}"
    fixed = zip(life.type_code[tids].tolist(), book.is_cash[tids].tolist(),
                book.symbol[tids].tolist(), book.quantity[tids].tolist(),
                money_list(book.bid[tids]), book.account[tids].tolist(),
                book.executor[tids].tolist())
    middles = [f"{TYPES[ty]}|{int(cash)}|{book.symbols[s]}|{q}|{b}|{a}|{e}"
               for ty, cash, s, q, b, a, e in fixed]
    names = [STATES[s] for s in states.tolist()]
    tid_list = tids.tolist()
    if not cdc:
        return [f"{tid}|{d}|{st}|{mid}|{am}"
                for tid, d, st, mid, am in zip(tid_list, dts, names, middles, amounts)]
    flags = ["I" if s == 0 else "U" for s in steps.tolist()]
    dsns = [4 * tid + DSN_STEP[s] for tid, s in zip(tid_list, states.tolist())]
    return [f"{fl}|{dsn}|{tid}|{d}|{st}|{mid}|{am}"
            for fl, dsn, tid, d, st, mid, am in zip(flags, dsns, tid_list, dts, names, middles,
                                                     amounts)]


def _counts(book: TradeBook, batch: int, tids: np.ndarray, steps: np.ndarray,
            new: int) -> TradeCounts:
    states = book.life.state[tids, steps]
    completed = states == CMPT
    gross = book.gross[tids]
    return TradeCounts(batch, len(tids), new, int((states == CNCL).sum()),
                       int((completed & (book.commission[tids] > gross)).sum()),
                       int((completed & (book.charge[tids] > gross)).sum()))


def trade_lines(book: TradeBook) -> TradeLines:
    """Batch1 Trade.txt and TradeHistory.txt, and Trade.txt of Batch2 and Batch3."""
    life = book.life
    batches = batch_of(life.time)
    in_batch1 = batches == 1
    first = np.flatnonzero(life.created_in == 1)
    last_step = in_batch1[first].sum(axis=1) - 1
    batch1 = _lines(book, first, last_step, cdc=False)
    counts = {1: _counts(book, 1, first, last_step, len(first))}
    h_tids, h_steps = np.nonzero(in_batch1)
    h_states = life.state[h_tids, h_steps]
    history = [f"{tid}|{d}|{STATES[s]}" for tid, d, s in
               zip(h_tids.tolist(), format_datetimes(life.time[h_tids, h_steps]),
                   h_states.tolist())]
    h_types = life.type_code[h_tids]
    history_counts = {"TH_Records": len(history)}
    for code, name in enumerate(TYPES):
        history_counts[f"TH_{name}Trades"] = int((h_types == code).sum())
    history_counts["TH_CanceledLTrades"] = int((h_states == CNCL).sum())
    incremental: dict[int, list[str]] = {}
    for batch in (2, 3):
        tids, steps = np.nonzero(batches == batch)
        incremental[batch] = _lines(book, tids, steps, cdc=True)
        counts[batch] = _counts(book, batch, tids, steps, int((steps == 0).sum()))
    return TradeLines(batch1, history, incremental, counts, history_counts)
