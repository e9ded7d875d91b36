"""Trade lifecycles: when each trade reaches each of its (up to three) states.

Limit orders (TLB, TLS) are PNDG at creation, then after 1 s .. 90 days either CNCL (10%) or
SBMT, and CMPT 1..300 s after SBMT. Market orders (TMB, TMS) are SBMT at creation and CMPT
1..300 s later. Batch1 creates ``trades_batch1`` trades between 2012-07-07 and the end of
2017-07-07; each incremental batch creates its share on its own day. T_IDs are given in
creation order from 0, so later batches always have higher ids.

A few lifecycles are then placed on purpose, because at small scale factors chance alone
would often leave them out, and the incremental DimTrade rules depend on them:
- in each incremental batch, Batch1 limit orders that were still pending reach their next
  state (one canceled, one submitted and completed the same day, one either way);
- a market order submitted just before midnight completes just after it, in the next batch
  (Batch1 -> Batch2 and Batch2 -> Batch3).
Everything is numpy arrays: SF 1 (130,000 trades) takes a few milliseconds here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from .dates import SECONDS_PER_DAY, batch_end, batch_start
from .scale import Sizes

TYPES = ("TLB", "TLS", "TMB", "TMS")
TYPE_SHARES = (0.3, 0.3, 0.2, 0.2)
TLB, TLS, TMB, TMS = range(4)
STATES = ("PNDG", "SBMT", "CNCL", "CMPT")
PNDG, SBMT, CNCL, CMPT = range(4)
#: DIGen's CDC_DSN = 4 * T_ID + k: k of each state.
DSN_STEP: Mapping[int, int] = MappingProxyType({PNDG: 0, SBMT: 1, CNCL: 1, CMPT: 2})

MAX_LIMIT_WAIT = 90 * SECONDS_PER_DAY
MAX_COMPLETION = 300
CANCEL_SHARE = 0.10
_PENDING_WINDOW = 60 * SECONDS_PER_DAY   # forced continuations are created in this window
_CONTINUATIONS = 3                       # per incremental batch


@dataclass(frozen=True)
class Lifecycles:
    """Per trade (row = T_ID): type, and the code and time of states 0..2 (-1 = none)."""

    type_code: np.ndarray   # int8, index into TYPES
    state: np.ndarray       # int8 (n, 3), index into STATES or -1
    time: np.ndarray        # int64 (n, 3), seconds, or -1
    created_in: np.ndarray  # int8, the batch that created the trade

    @property
    def n(self) -> int:
        return len(self.type_code)


@dataclass
class _Raw:
    """Unsorted lifecycles of one batch while they are being drawn and adjusted."""

    created: np.ndarray
    type_code: np.ndarray
    canceled: np.ndarray
    wait: np.ndarray        # limit orders: PNDG -> SBMT/CNCL
    completion: np.ndarray  # SBMT -> CMPT


def _draw(rng: np.random.Generator, n: int, start: int, end: int) -> _Raw:
    created = rng.integers(start, end, n)
    type_code = rng.choice(len(TYPES), size=n, p=TYPE_SHARES).astype(np.int8)
    canceled = (type_code <= TLS) & (rng.random(n) < CANCEL_SHARE)
    return _Raw(created, type_code, canceled, rng.integers(1, MAX_LIMIT_WAIT + 1, n),
                rng.integers(1, MAX_COMPLETION + 1, n))


def _continue_into(raw: _Raw, rng: np.random.Generator, batch: int, used: set[int]) -> None:
    """Make a few Batch1 limit orders created late in Batch1 move on during ``batch``."""
    end1 = batch_end(1)
    recent = np.flatnonzero(raw.created >= end1 - _PENDING_WINDOW)
    if len(recent) < 4 * _CONTINUATIONS:  # tiny batches: take the latest trades instead
        recent = np.argsort(raw.created, kind="stable")[-4 * _CONTINUATIONS:]
    candidates = [int(i) for i in rng.permutation(recent) if int(i) not in used]
    day = batch_start(batch)
    for k, i in enumerate(candidates[:_CONTINUATIONS]):
        used.add(i)
        if raw.created[i] < end1 - _PENDING_WINDOW:  # keep the wait within 90 days
            raw.created[i] = end1 - int(rng.integers(1, _PENDING_WINDOW))
        if raw.type_code[i] > TLS:
            raw.type_code[i] = rng.integers(TLB, TLS + 1)
        moment = day + int(rng.integers(0, SECONDS_PER_DAY - MAX_COMPLETION - 1))
        raw.wait[i] = moment - raw.created[i]
        raw.canceled[i] = k == 0 or (k == 2 and rng.random() < CANCEL_SHARE * 3)


def _cross_midnight(raw: _Raw, rng: np.random.Generator, midnight: int, used: set[int]) -> None:
    """Make the latest trade of a batch a market order that completes after ``midnight``."""
    order = np.argsort(raw.created, kind="stable")[::-1]
    i = next(int(j) for j in order if int(j) not in used)
    used.add(i)
    raw.type_code[i] = rng.integers(TMB, TMS + 1)
    raw.canceled[i] = False
    raw.created[i] = midnight - int(rng.integers(1, MAX_COMPLETION // 2))
    raw.completion[i] = midnight - raw.created[i] + int(rng.integers(0, MAX_COMPLETION // 2))


def _states(raw: _Raw) -> tuple[np.ndarray, np.ndarray]:
    n = len(raw.created)
    state = np.full((n, 3), -1, dtype=np.int8)
    time = np.full((n, 3), -1, dtype=np.int64)
    limit = raw.type_code <= TLS
    state[:, 0] = np.where(limit, PNDG, SBMT)
    time[:, 0] = raw.created
    # market orders: SBMT -> CMPT
    market = ~limit
    state[market, 1] = CMPT
    time[market, 1] = raw.created[market] + raw.completion[market]
    # limit orders: PNDG -> SBMT | CNCL (-> CMPT)
    state[limit, 1] = np.where(raw.canceled[limit], CNCL, SBMT)
    time[limit, 1] = raw.created[limit] + raw.wait[limit]
    done = limit & ~raw.canceled
    state[done, 2] = CMPT
    time[done, 2] = time[done, 1] + raw.completion[done]
    return state, time


def draw_lifecycles(sizes: Sizes, rng: np.random.Generator) -> Lifecycles:
    """Lifecycles of every trade of the three batches, indexed by T_ID."""
    batch1 = _draw(rng, sizes.trades_batch1, batch_start(1), batch_end(1))
    incremental = {b: _draw(rng, sizes.trades_per_incremental_batch, batch_start(b),
                            batch_end(b)) for b in (2, 3)}
    used: set[int] = set()
    for b in (2, 3):
        _continue_into(batch1, rng, b, used)
    _cross_midnight(batch1, rng, batch_end(1), used)
    _cross_midnight(incremental[2], rng, batch_end(2), set())
    types, states, times, created_in = [], [], [], []
    for batch, raw in ((1, batch1), (2, incremental[2]), (3, incremental[3])):
        order = np.argsort(raw.created, kind="stable")
        s, t = _states(raw)
        types.append(raw.type_code[order])
        states.append(s[order])
        times.append(t[order])
        created_in.append(np.full(len(order), batch, dtype=np.int8))
    return Lifecycles(np.concatenate(types), np.concatenate(states), np.concatenate(times),
                      np.concatenate(created_in))
