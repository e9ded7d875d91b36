"""Deterministic votes for the voter workload: the same seed always gives the same table.

Determinism is what lets a test recompute the expected leaderboard from the input alone, and
what lets a demo be resumed on the same state file (batch-ids are positions in this table).

Most votes are valid. A share of ``invalid_share`` is made to fail validation on purpose, half
of it each way: votes for contestants that do not exist, and votes from a few "superfan" phones
that vote many times each and so go over any small per-phone limit. Votes for a contestant who
has been removed are rejected too, but those depend on the run, not on the generator.
"""

from __future__ import annotations

import datetime
import math
import random
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

#: One real area code per state (and DC): a phone's first three digits say where it votes from.
AREA_CODES: dict[int, str] = {
    205: "AL", 907: "AK", 602: "AZ", 501: "AR", 213: "CA", 415: "CA", 303: "CO", 203: "CT",
    302: "DE", 202: "DC", 305: "FL", 404: "GA", 808: "HI", 208: "ID", 312: "IL", 317: "IN",
    515: "IA", 316: "KS", 502: "KY", 504: "LA", 207: "ME", 410: "MD", 617: "MA", 313: "MI",
    612: "MN", 601: "MS", 314: "MO", 406: "MT", 402: "NE", 702: "NV", 603: "NH", 201: "NJ",
    505: "NM", 212: "NY", 919: "NC", 701: "ND", 216: "OH", 405: "OK", 503: "OR", 215: "PA",
    401: "RI", 803: "SC", 605: "SD", 615: "TN", 214: "TX", 801: "UT", 802: "VT", 804: "VA",
    206: "WA", 304: "WV", 414: "WI", 307: "WY",
}

#: Column names and DuckDB types of a vote, in stream order.
VOTE_COLUMNS: dict[str, str] = {
    "vote_id": "BIGINT", "phone": "BIGINT", "state": "VARCHAR", "contestant": "INTEGER",
    "ts": "TIMESTAMP",
}

VOTE_SCHEMA = pa.schema([
    ("vote_id", pa.int64()), ("phone", pa.int64()), ("state", pa.string()),
    ("contestant", pa.int32()), ("ts", pa.timestamp("us")),
])

START = datetime.datetime(2025, 1, 1, 20, 0, 0)
MEAN_GAP_MS = 5.0  # about 200 votes a second of show time
SUPERFAN_VOTES = 8  # how many votes each superfan phone casts, on average


def state_of(phone: int) -> str:
    """The 2-letter state of a phone number, from its area code."""
    return AREA_CODES[phone // 10_000_000]


def generate_votes(n: int, seed: int = 0, contestants: int = 12,
                   invalid_share: float = 0.05) -> pa.Table:
    """``n`` votes as an Arrow table (columns ``VOTE_COLUMNS``), the same for the same arguments;
    the first k of them are the same for every ``n >= k`` (same seed and options).

    Contestants are numbered 1..``contestants`` and get unequal popularity, so that the
    leaderboard has a clear order and a clear loser for the removal procedure to find. The
    columns are drawn with Arrow compute kernels, not a Python loop, so that a million votes
    take about a second: benchmarks should measure the engine, not the generator.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if contestants < 1:
        raise ValueError(f"contestants must be >= 1, got {contestants}")
    if not 0.0 <= invalid_share <= 1.0:
        raise ValueError(f"invalid_share must be between 0 and 1, got {invalid_share}")
    rng = random.Random(seed)
    ranks = list(range(1, contestants + 1))
    rng.shuffle(ranks)
    weights = [1.0 / rank ** 0.8 for rank in ranks]
    area_codes = sorted(AREA_CODES)
    per_vote = invalid_share / 2 / SUPERFAN_VOTES  # superfans per vote so far
    fans = [(rng.randrange(len(area_codes)), rng.randrange(10_000_000))
            for _ in range(max(1, math.ceil(n * per_vote)))]

    def uniform(stream: int) -> pa.Array:
        return pc.random(n, initializer=(seed * 7919 + stream) % 2 ** 63)

    def below(values: pa.Array, count: int) -> pa.Array:  # floor(u * count) as int64
        return pc.cast(pc.floor(pc.multiply(values, count)), pa.int64())

    # Which kind of vote each one is: for an unknown contestant, from a superfan, or ordinary.
    kind = uniform(0)
    unknown = pc.less(kind, invalid_share / 2)
    superfan = pc.and_(pc.invert(unknown), pc.less(kind, invalid_share))
    # Contestant: the number of cumulative-weight thresholds the draw passes (weighted choice).
    draw, total, contestant = uniform(1), sum(weights), pa.array([1] * n, pa.int64())
    running = 0.0
    for weight in weights[:-1]:
        running += weight
        contestant = pc.add(contestant, pc.cast(pc.greater_equal(draw, running / total),
                                                pa.int64()))
    contestant = pc.if_else(unknown, pc.add(below(uniform(2), 3), contestants + 1), contestant)
    # Phone: an area code and seven random digits, or one of the superfans' phones.
    # A superfan vote picks among the fans known at its position (their number grows with the
    # position), so the first k votes are the same whatever n: a longer run extends a shorter
    # one, and a demo run again with more votes re-sends its first batches unchanged.
    known = pc.min_element_wise(pc.max_element_wise(
        pc.ceil(pc.multiply(pa.array(range(1, n + 1), pa.float64()), per_vote)), 1.0),
        float(len(fans)))
    fan = pc.cast(pc.floor(pc.multiply(uniform(3), known)), pa.int64())
    area = pc.if_else(superfan, pc.take(pa.array([a for a, _ in fans], pa.int64()), fan),
                      below(uniform(4), len(area_codes)))
    local = pc.if_else(superfan, pc.take(pa.array([d for _, d in fans], pa.int64()), fan),
                       below(uniform(5), 10_000_000))
    phone = pc.add(pc.multiply(pc.take(pa.array(area_codes, pa.int64()), area), 10_000_000),
                   local)
    state = pc.take(pa.array([AREA_CODES[code] for code in area_codes], pa.string()), area)
    # Time: exponential gaps between votes, in microseconds since the show started.
    gaps = pc.multiply(pc.negate(pc.ln(pc.subtract(1.0, uniform(6)))), MEAN_GAP_MS * 1000)
    micros = pc.add(pc.cast(pc.round(pc.cumulative_sum(gaps)), pa.int64()),
                    int((START - datetime.datetime(1970, 1, 1)).total_seconds() * 1_000_000))
    return pa.table({
        "vote_id": pa.array(range(1, n + 1), pa.int64()),
        "phone": phone,
        "state": state,
        "contestant": pc.cast(contestant, pa.int32()),
        "ts": pc.cast(micros, pa.timestamp("us")),
    }, schema=VOTE_SCHEMA)


def batches(table: pa.Table, batch_size: int) -> Iterator[pa.Table]:
    """Cut ``table`` into consecutive slices of ``batch_size`` rows (the last may be shorter)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for start in range(0, table.num_rows, batch_size):
        yield table.slice(start, batch_size)
