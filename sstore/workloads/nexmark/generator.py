"""The Nexmark event model (persons, auctions, bids), generated vectorised into Arrow batches.

Nexmark is the benchmark the stream processors are judged by (Flink, Spark, RisingWave,
Arroyo, Feldera). Its generator is a function of the event number ``n`` (0, 1, 2, ...); this
module follows the model of the public nexmark project's generator, written anew with numpy so
that it is never the bottleneck (well over 1M events/s) and so that any range of events can be
made on its own:

- **Kinds**: in every 50 events, 1 person, 3 auctions, 46 bids (``n % 50``: 0 person, 1-3
  auction, 4-49 bid).
- **Ids**: the person of epoch ``n // 50`` is ``1000 + n // 50``; auctions are numbered
  ``1000 + 3 * epoch + k``. A bid or auction names the *last* person / auction so far, or a
  random one among the active ones (the last 1000 people, the last 100 auctions in flight, plus
  10 not yet created: the model's deliberate "lead", so some references point forward).
- **Hot keys**: a seller is, with probability 1 - 1/``hot_sellers_ratio``, the first person of
  the last hundred; a bid's auction, with 1 - 1/``hot_auction_ratio``, the first auction of the
  last hundred; a bidder, with 1 - 1/``hot_bidders_ratio``, the second person of the last
  hundred (so hot bidders and hot sellers differ).
- **Prices**: ``round(10 ** (6 u) * 100)`` cents for a uniform ``u``, log-uniform over 1 cent to
  a million; an auction's reserve is its initial bid plus another such price.
- **Categories**: 10..14. **States**: AZ CA ID OR WA WY. **Cities**: ten of the US west.
- **Event time**: ``base_time + floor(n * 1e6 / rate) / 1000`` ms: ``rate`` events per second of
  event time, monotonic (the model's out-of-order groups of size 1). An auction expires a random
  time up to twice the time until 100 more auctions are made.

Randomness: each block of ``BLOCK`` events draws from its own ``numpy`` generator seeded by
``(seed, block)``, so the same seed gives the same events whatever the batch boundaries, and a
batch can be made without the ones before it. The numbers drawn are not the Java generator's
(its ``java.util.Random`` sequence is neither reproducible across parallel instances nor worth
copying); the distributions are.

One stream of events, flat (``EVENT_COLUMNS``): ``event_type`` (0 person, 1 auction, 2 bid),
``date_time``, and the fields of each kind prefixed ``p_``, ``a_``, ``b_`` (NULL for the other
kinds), as the nexmark project's ``ddl_gen.sql`` keeps one table and splits it with views.
``write_files`` writes the same events as CSV for Flink and Spark.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

PERSON, AUCTION, BID = 0, 1, 2
PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
TOTAL_PROPORTION = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
HOT_GROUP = 100  # hot sellers / bidders / auctions: the first (second) of the last hundred
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
BLOCK = 1 << 16
BASE_TIME_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend",
             "Redmond", "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
CHANNELS = ("Google", "Facebook", "Baidu", "Apple")

#: Column names and DuckDB types of an event, in stream order.
EVENT_COLUMNS: dict[str, str] = {
    "event_type": "TINYINT", "date_time": "TIMESTAMP",
    "p_id": "BIGINT", "p_name": "VARCHAR", "p_email": "VARCHAR", "p_credit_card": "VARCHAR",
    "p_city": "VARCHAR", "p_state": "VARCHAR", "p_extra": "VARCHAR",
    "a_id": "BIGINT", "a_item_name": "VARCHAR", "a_description": "VARCHAR",
    "a_initial_bid": "BIGINT", "a_reserve": "BIGINT", "a_expires": "TIMESTAMP",
    "a_seller": "BIGINT", "a_category": "BIGINT", "a_extra": "VARCHAR",
    "b_auction": "BIGINT", "b_bidder": "BIGINT", "b_price": "BIGINT", "b_channel": "VARCHAR",
    "b_url": "VARCHAR", "b_extra": "VARCHAR",
}
_ARROW = {"TINYINT": pa.int8(), "BIGINT": pa.int64(), "VARCHAR": pa.string(),
          "TIMESTAMP": pa.timestamp("ms")}
EVENT_SCHEMA = pa.schema([(c, _ARROW[t]) for c, t in EVENT_COLUMNS.items()])
#: The same events in files: times as epoch milliseconds (every reader parses a BIGINT alike).
FILE_SCHEMA = pa.schema([(f.name, pa.int64() if f.type == pa.timestamp("ms") else f.type)
                         for f in EVENT_SCHEMA])


@dataclass(frozen=True)
class NexmarkConfig:
    """What the events depend on (the nexmark project's defaults)."""

    seed: int = 1
    rate: float = 10_000.0  # events per second of event time
    base_time_ms: int = BASE_TIME_MS
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4

    def time_ms(self, n: np.ndarray) -> np.ndarray:
        """Event time (epoch ms) of event numbers ``n``."""
        delay_us = 1_000_000.0 / self.rate
        return self.base_time_ms + np.floor(n * delay_us).astype(np.int64) // 1000


def last_person(n: np.ndarray) -> np.ndarray:
    """Base-0 id of the newest person at event ``n`` (the person itself for a person event)."""
    return n // TOTAL_PROPORTION


def last_auction(n: np.ndarray) -> np.ndarray:
    """Base-0 id of the newest auction at event ``n`` (the auction itself for an auction)."""
    epoch, off = n // TOTAL_PROPORTION, n % TOTAL_PROPORTION
    return np.where(off < PERSON_PROPORTION, (epoch - 1) * AUCTION_PROPORTION + 2,
                    np.where(off >= PERSON_PROPORTION + AUCTION_PROPORTION,
                             epoch * AUCTION_PROPORTION + 2,
                             epoch * AUCTION_PROPORTION + off - PERSON_PROPORTION))


def _uniform_below(rng: np.random.Generator, bound: np.ndarray) -> np.ndarray:
    """One integer in [0, bound) per element (bound >= 1)."""
    below: np.ndarray = np.minimum((rng.random(len(bound)) * bound).astype(np.int64), bound - 1)
    return below


def _next_person(rng: np.random.Generator, n: np.ndarray, cfg: NexmarkConfig) -> np.ndarray:
    people = last_person(n) + 1
    active = np.minimum(people, cfg.num_active_people)
    person: np.ndarray = people - active + _uniform_below(rng, active + PERSON_ID_LEAD)
    return person


def _next_auction(rng: np.random.Generator, n: np.ndarray, cfg: NexmarkConfig) -> np.ndarray:
    newest = last_auction(n)
    oldest = np.maximum(newest - cfg.num_in_flight_auctions, 0)
    auction: np.ndarray = oldest + _uniform_below(rng, newest - oldest + 1 + AUCTION_ID_LEAD)
    return auction


def _prices(rng: np.random.Generator, k: int) -> np.ndarray:
    return np.round(10.0 ** (rng.random(k) * 6.0) * 100.0).astype(np.int64)


def _pool(rng: np.random.Generator, count: int, length: int) -> pa.Array:
    """``count`` random lowercase strings of ``length``: text columns are drawn from a pool
    (taking from an Arrow array is what keeps strings cheap)."""
    codes = rng.integers(97, 123, size=(count, length), dtype=np.uint8)
    return pa.array([row.tobytes().decode("ascii") for row in codes], pa.string())


class _Pools:
    """The strings every block draws from, made once per seed."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng([seed, 0x5EED])
        names = [f"{f} {last}" for f in FIRST_NAMES for last in LAST_NAMES]
        self.names = pa.array(names)
        self.emails = pa.array([f"{a}@{b}.com" for a, b in zip(
            _pool(rng, 1024, 7).to_pylist(), _pool(rng, 1024, 5).to_pylist(), strict=True)])
        cards = rng.integers(0, 10_000, size=(1024, 4))
        self.cards = pa.array([" ".join(f"{x:04d}" for x in row) for row in cards])
        self.cities, self.states = pa.array(US_CITIES), pa.array(US_STATES)
        self.channels = pa.array(CHANNELS)
        self.urls = pa.array([f"https://www.nexmark.com/{a}/item.htm?query=1" for a in
                              _pool(rng, 1024, 5).to_pylist()])
        self.item_names = _pool(rng, 1024, 20)
        self.descriptions = _pool(rng, 1024, 100)
        self.extra_small = _pool(rng, 1024, 50)    # bids: about 100 bytes in all
        self.extra_person = _pool(rng, 1024, 150)  # persons: about 200 bytes
        self.extra_auction = _pool(rng, 1024, 300)  # auctions: about 500 bytes


_POOLS: dict[int, _Pools] = {}


def _pools(seed: int) -> _Pools:
    if seed not in _POOLS:
        _POOLS[seed] = _Pools(seed)
    return _POOLS[seed]


def _spread(mask: np.ndarray, values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """A column of the flat table: ``values`` at the rows of ``mask``, NULL elsewhere."""
    full = np.zeros(len(mask), dtype=values.dtype)
    full[mask] = values
    return pa.array(full, type=arrow_type, mask=~mask)


def _spread_text(mask: np.ndarray, pool: pa.Array, picks: np.ndarray) -> pa.Array:
    """Strings of ``pool`` at ``picks`` on the rows of ``mask``, NULL elsewhere, built from
    buffers: the picked strings are copied once, the NULLs cost an offset each."""
    taken = pool.take(pa.array(picks))
    _, offsets_buf, data_buf = taken.buffers()
    picked = np.frombuffer(offsets_buf, dtype=np.int32, count=len(taken) + 1,
                           offset=taken.offset * 4)
    lengths = np.zeros(len(mask), dtype=np.int32)
    lengths[mask] = np.diff(picked)
    offsets = np.zeros(len(mask) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    offsets += picked[0]
    valid = pa.py_buffer(np.packbits(mask, bitorder="little"))
    return pa.StringArray.from_buffers(len(mask), pa.py_buffer(offsets), data_buf, valid)


def _block(cfg: NexmarkConfig, block: int, lo: int, hi: int) -> pa.Table:
    """Events ``lo <= n < hi`` of block ``block`` (all drawn, then cut: the draws of a block do
    not depend on which part of it is asked for)."""
    first = block * BLOCK
    n_all = np.arange(first, first + BLOCK, dtype=np.int64)
    rng = np.random.default_rng([cfg.seed, block])
    pools = _pools(cfg.seed)
    off = n_all % TOTAL_PROPORTION
    kind = np.where(off < PERSON_PROPORTION, PERSON,
                    np.where(off < PERSON_PROPORTION + AUCTION_PROPORTION, AUCTION, BID))
    is_p, is_a, is_b = kind == PERSON, kind == AUCTION, kind == BID
    ts = cfg.time_ms(n_all)
    cols: dict[str, pa.Array] = {"event_type": pa.array(kind.astype(np.int8)),
                                 "date_time": pa.array(ts, pa.int64()).cast(pa.timestamp("ms"))}
    # persons
    n_p = n_all[is_p]
    k = len(n_p)
    cols["p_id"] = _spread(is_p, last_person(n_p) + FIRST_PERSON_ID, pa.int64())
    cols["p_name"] = _spread_text(is_p, pools.names, rng.integers(0, len(pools.names), k))
    cols["p_email"] = _spread_text(is_p, pools.emails, rng.integers(0, 1024, k))
    cols["p_credit_card"] = _spread_text(is_p, pools.cards, rng.integers(0, 1024, k))
    cols["p_city"] = _spread_text(is_p, pools.cities, rng.integers(0, len(US_CITIES), k))
    cols["p_state"] = _spread_text(is_p, pools.states, rng.integers(0, len(US_STATES), k))
    cols["p_extra"] = _spread_text(is_p, pools.extra_person, rng.integers(0, 1024, k))
    # auctions
    n_a = n_all[is_a]
    k = len(n_a)
    hot = rng.integers(0, cfg.hot_sellers_ratio, k) > 0
    seller = np.where(hot, (last_person(n_a) // HOT_GROUP) * HOT_GROUP,
                      _next_person(rng, n_a, cfg))
    initial = _prices(rng, k)
    in_flight_events = cfg.num_in_flight_auctions * TOTAL_PROPORTION // AUCTION_PROPORTION
    horizon = cfg.time_ms(n_a + in_flight_events) - ts[is_a]
    expires = ts[is_a] + 1 + _uniform_below(rng, np.maximum(horizon * 2, 1))
    cols["a_id"] = _spread(is_a, last_auction(n_a) + FIRST_AUCTION_ID, pa.int64())
    cols["a_item_name"] = _spread_text(is_a, pools.item_names, rng.integers(0, 1024, k))
    cols["a_description"] = _spread_text(is_a, pools.descriptions, rng.integers(0, 1024, k))
    cols["a_initial_bid"] = _spread(is_a, initial, pa.int64())
    cols["a_reserve"] = _spread(is_a, initial + _prices(rng, k), pa.int64())
    cols["a_expires"] = _spread(is_a, expires, pa.int64()).cast(pa.timestamp("ms"))
    cols["a_seller"] = _spread(is_a, seller + FIRST_PERSON_ID, pa.int64())
    cols["a_category"] = _spread(is_a, FIRST_CATEGORY_ID + rng.integers(0, NUM_CATEGORIES, k),
                                 pa.int64())
    cols["a_extra"] = _spread_text(is_a, pools.extra_auction, rng.integers(0, 1024, k))
    # bids
    n_b = n_all[is_b]
    k = len(n_b)
    hot = rng.integers(0, cfg.hot_auction_ratio, k) > 0
    auction = np.where(hot, (last_auction(n_b) // HOT_GROUP) * HOT_GROUP,
                       _next_auction(rng, n_b, cfg))
    hot = rng.integers(0, cfg.hot_bidders_ratio, k) > 0
    bidder = np.where(hot, (last_person(n_b) // HOT_GROUP) * HOT_GROUP + 1,
                      _next_person(rng, n_b, cfg))
    cols["b_auction"] = _spread(is_b, auction + FIRST_AUCTION_ID, pa.int64())
    cols["b_bidder"] = _spread(is_b, bidder + FIRST_PERSON_ID, pa.int64())
    cols["b_price"] = _spread(is_b, _prices(rng, k), pa.int64())
    cols["b_channel"] = _spread_text(is_b, pools.channels, rng.integers(0, len(CHANNELS), k))
    cols["b_url"] = _spread_text(is_b, pools.urls, rng.integers(0, 1024, k))
    cols["b_extra"] = _spread_text(is_b, pools.extra_small, rng.integers(0, 1024, k))
    table = pa.Table.from_arrays([cols[c] for c in EVENT_COLUMNS], schema=EVENT_SCHEMA)
    return table.slice(lo - first, hi - lo)


def events(lo: int, hi: int, cfg: NexmarkConfig | None = None) -> pa.Table:
    """Events ``lo <= n < hi`` as one Arrow table (``EVENT_SCHEMA``, one chunk per block of
    the generator), in event order."""
    cfg = cfg or NexmarkConfig()
    parts = [_block(cfg, block, max(lo, block * BLOCK), min(hi, (block + 1) * BLOCK))
             for block in range(lo // BLOCK, (hi - 1) // BLOCK + 1)] if hi > lo else []
    return pa.concat_tables(parts) if parts else EVENT_SCHEMA.empty_table()


def batches(total: int, batch_events: int, cfg: NexmarkConfig | None = None
            ) -> Iterator[pa.Table]:
    """The first ``total`` events cut into batches of ``batch_events`` (the last may be
    shorter), each made when asked for; a block of the generator is made once."""
    cfg = cfg or NexmarkConfig()
    cached: tuple[int, pa.Table] | None = None
    for lo in range(0, total, batch_events):
        hi = min(total, lo + batch_events)
        parts = []
        for block in range(lo // BLOCK, (hi - 1) // BLOCK + 1):
            if cached is None or cached[0] != block:
                cached = (block, _block(cfg, block, block * BLOCK, (block + 1) * BLOCK))
            start = max(lo, block * BLOCK) - block * BLOCK
            parts.append(cached[1].slice(start, min(hi, (block + 1) * BLOCK) - block * BLOCK
                                         - start))
        yield parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def to_file_table(table: pa.Table) -> pa.Table:
    """The events as written to files: times as epoch milliseconds."""
    return pa.Table.from_arrays(
        [c.cast(pa.int64()) if c.type == pa.timestamp("ms") else c for c in table.columns],
        schema=FILE_SCHEMA)


def write_files(directory: str, total: int, batch_events: int,
                cfg: NexmarkConfig | None = None) -> list[str]:
    """Write the first ``total`` events as CSV files of ``batch_events`` each (the columns of
    ``FILE_SCHEMA`` without a header line, which Flink's CSV format cannot skip; NULL as an
    empty field; times as epoch ms), named so that their order is the event order; return
    their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
    for i, table in enumerate(batches(total, batch_events, cfg)):
        path = os.path.join(directory, f"events-{i:08d}.csv")
        pacsv.write_csv(to_file_table(table), path, write_options=options)
        paths.append(path)
    return paths
