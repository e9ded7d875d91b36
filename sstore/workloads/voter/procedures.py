"""The voter dataflow: S-Store's voter-with-leaderboard, declared on an ``Engine``.

Four stored procedures, each one transaction per batch, run in this order for every batch::

    votes ─validate_votes─┬─▶ valid_votes ─count_votes─▶ vote_counts ─remove_lowest─┐
                          │        │                                                 ▼
                          │        └─▶ window trending ─update_trending      removed_contestants
                          └─▶ rejected_votes ─trigger─▶ table vote_rejections

- ``validate_votes`` rejects votes for unknown or removed contestants and votes from phones that
  already used their ``max_votes_per_phone`` valid votes; it counts the valid ones per phone.
- ``count_votes`` adds the valid votes to the contestants' totals and reports the running count.
- ``remove_lowest`` removes the contestant with the fewest votes each time the running count
  crosses a multiple of ``remove_every`` (never the last one standing).
- ``update_trending`` recounts the trending window (the last ``window_rows`` valid votes, minus
  removed contestants) into ``trending_leaderboard``.

A batch is atomic, so removals take effect at batch boundaries: the votes of the batch that
crosses a multiple of ``remove_every`` are all judged against the contestants as they stood when
the batch began. Every procedure is a few set-oriented statements over the whole batch, because
each DuckDB statement costs about a millisecond whatever its size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sstore.base.sql import ident
from sstore.engine import Engine
from sstore.execution.transaction import Transaction
from sstore.workloads.voter.generator import VOTE_COLUMNS

# Names of the streams, window, tables and procedures (one namespace in the state file).
VOTES = "votes"
VALID_VOTES = "valid_votes"
REJECTED_VOTES = "rejected_votes"
VOTE_COUNTS = "vote_counts"
REMOVED = "removed_contestants"
TRENDING = "trending"
CONTESTANTS = "contestants"
PHONE_VOTES = "phone_votes"
VOTE_TOTALS = "vote_totals"
TRENDING_LEADERBOARD = "trending_leaderboard"
REJECTIONS = "vote_rejections"

#: Why a vote was rejected, in the order the checks apply.
REASONS = ("unknown_contestant", "removed_contestant", "over_phone_limit")

#: The contestants of S-Store's voter benchmark; more than twelve get numbered names.
CONTESTANT_NAMES = (
    "Edwina Burnam", "Tabatha Gehling", "Kelly Clauss", "Jessie Alloway", "Alana Bregman",
    "Jessie Eichman", "Allie Rogalski", "Nita Coster", "Kurt Walser", "Ericka Dieter",
    "Loraine Nygren", "Tania Mattioli",
)


@dataclass(frozen=True)
class VoterConfig:
    """The knobs of one declaration; the procedures close over it (it is not stored)."""

    contestants: int = 12
    max_votes_per_phone: int = 2
    remove_every: int = 1000
    window_rows: int = 100


def contestant_name(number: int) -> str:
    return CONTESTANT_NAMES[number - 1] if number <= len(CONTESTANT_NAMES) else \
        f"Contestant {number}"


def declare(engine: Engine, contestants: int = 12, max_votes_per_phone: int = 2,
            remove_every: int = 1000, window_rows: int = 100) -> VoterConfig:
    """Declare the voter tables, streams, window, trigger and procedures on ``engine``.

    Call it each time the program starts, before the engine's first ingest, run or query (the
    engine's rule for declarations). Tables are created only when missing and contestants are
    seeded only when absent, so declaring again on an existing state file changes no state.
    """
    for name, value in (("contestants", contestants), ("max_votes_per_phone", max_votes_per_phone),
                        ("remove_every", remove_every), ("window_rows", window_rows)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    config = VoterConfig(contestants, max_votes_per_phone, remove_every, window_rows)
    _declare_dataflow(engine, config)  # first: on a started engine it fails before any write
    _create_tables(engine, config)
    return config


def _create_tables(engine: Engine, config: VoterConfig) -> None:
    engine.execute(f"CREATE TABLE IF NOT EXISTS {ident(CONTESTANTS)} ("
                   "contestant INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
                   "removed_at_votes BIGINT, removed_batch BIGINT)")
    engine.execute(f"CREATE TABLE IF NOT EXISTS {ident(VOTE_TOTALS)} ("
                   "contestant INTEGER PRIMARY KEY, votes BIGINT NOT NULL)")
    engine.execute(f"CREATE TABLE IF NOT EXISTS {ident(TRENDING_LEADERBOARD)} ("
                   "contestant INTEGER PRIMARY KEY, votes BIGINT NOT NULL)")
    engine.execute(f"CREATE TABLE IF NOT EXISTS {ident(PHONE_VOTES)} ("
                   "phone BIGINT PRIMARY KEY, votes INTEGER NOT NULL)")
    engine.execute(f"CREATE TABLE IF NOT EXISTS {ident(REJECTIONS)} (batch_id BIGINT NOT NULL, "
                   "vote_id BIGINT, phone BIGINT, state VARCHAR, contestant INTEGER, "
                   "ts TIMESTAMP, reason VARCHAR NOT NULL)")
    numbers = list(range(1, config.contestants + 1))
    names = [contestant_name(n) for n in numbers]
    zeros = [0] * len(numbers)
    engine.execute(f"INSERT INTO {ident(CONTESTANTS)} (contestant, name) "
                   "SELECT unnest(?::INTEGER[]), unnest(?::VARCHAR[]) ON CONFLICT DO NOTHING",
                   numbers, names)
    for table in (VOTE_TOTALS, TRENDING_LEADERBOARD):
        engine.execute(f"INSERT INTO {ident(table)} SELECT unnest(?::INTEGER[]), "
                       "unnest(?::BIGINT[]) ON CONFLICT DO NOTHING", numbers, zeros)


def _declare_dataflow(engine: Engine, config: VoterConfig) -> None:
    engine.stream(VOTES, VOTE_COLUMNS)
    engine.stream(VALID_VOTES, VOTE_COLUMNS)
    engine.stream(REJECTED_VOTES, {**VOTE_COLUMNS, "reason": "VARCHAR"})
    engine.stream(VOTE_COUNTS, {"valid_before": "BIGINT", "valid_after": "BIGINT"})
    engine.stream(REMOVED, {"contestant": "INTEGER", "name": "VARCHAR",
                            "removed_at_votes": "BIGINT"})
    engine.window(TRENDING, VALID_VOTES, rows=config.window_rows, slide=1)
    # Rejected votes are kept for good: the stream itself only keeps what a reader still needs.
    engine.trigger(REJECTED_VOTES, f"INSERT INTO {ident(REJECTIONS)} SELECT $batch_id, "
                                   "vote_id, phone, state, contestant, ts, reason FROM new_rows")

    @engine.procedure(input=VOTES, output=(VALID_VOTES, REJECTED_VOTES))
    def validate_votes(tx: Transaction, batch: pa.Table) -> dict[str, pa.Table]:
        """Reject unknown/removed contestants and over-limit phones; count valid votes per phone."""
        judged = tx.sql(VALIDATE_SQL, config.max_votes_per_phone)
        ok = pc.is_null(judged["reason"])
        valid = judged.filter(ok).drop_columns(["reason"])
        if valid.num_rows:
            per_phone = valid.group_by("phone").aggregate([("phone", "count")])
            tx.execute(f"INSERT INTO {ident(PHONE_VOTES)} AS p SELECT unnest(?::BIGINT[]), "
                       "unnest(?::INTEGER[]) ON CONFLICT (phone) DO UPDATE "
                       "SET votes = p.votes + excluded.votes",
                       per_phone["phone"].to_pylist(), per_phone["phone_count"].to_pylist())
        return {VALID_VOTES: valid, REJECTED_VOTES: judged.filter(pc.invert(ok))}

    @engine.procedure(input=VALID_VOTES, output=VOTE_COUNTS)
    def count_votes(tx: Transaction, batch: pa.Table) -> list[tuple[int, int]] | None:
        """Add the batch's valid votes to the totals; report the running count of valid votes."""
        if not batch.num_rows:
            return None
        tx.execute(f"INSERT INTO {ident(VOTE_TOTALS)} AS t SELECT contestant, count(*) "
                   "FROM batch GROUP BY contestant ON CONFLICT (contestant) DO UPDATE "
                   "SET votes = t.votes + excluded.votes")
        after = int(tx.fetchall(f"SELECT sum(votes) FROM {ident(VOTE_TOTALS)}")[0][0])
        return [(after - batch.num_rows, after)]

    @engine.procedure(input=VOTE_COUNTS, output=REMOVED)
    def remove_lowest(tx: Transaction, batch: pa.Table) -> list[tuple[Any, ...]] | None:
        """Every ``remove_every`` valid votes, remove the contestant with the fewest votes."""
        if not batch.num_rows:
            return None
        before, after = batch["valid_before"][0].as_py(), batch["valid_after"][0].as_py()
        due = after // config.remove_every - before // config.remove_every
        if due <= 0:
            return None
        removed = tx.fetchall(REMOVE_SQL, after, tx.batch_id, due)
        return [(number, name, after) for number, name in removed]

    @engine.procedure(input=TRENDING)
    def update_trending(tx: Transaction, batch: pa.Table) -> None:
        """Recount the trending leaderboard from the window's last W valid votes."""
        tx.execute(TRENDING_SQL)


# The checks in order; a phone's n-th valid vote (counting earlier batches) fails over the limit.
VALIDATE_SQL = f"""
WITH checked AS (
    SELECT b.vote_id, b.phone, b.state, b.contestant, b.ts,
           CASE WHEN c.contestant IS NULL THEN 'unknown_contestant'
                WHEN c.removed_at_votes IS NOT NULL THEN 'removed_contestant' END AS reason
    FROM batch AS b LEFT JOIN {ident(CONTESTANTS)} AS c ON c.contestant = b.contestant
), numbered AS (
    SELECT k.*, coalesce(p.votes, 0) + row_number() OVER (
               PARTITION BY k.phone, k.reason IS NULL ORDER BY k.vote_id) AS nth
    FROM checked AS k LEFT JOIN {ident(PHONE_VOTES)} AS p ON p.phone = k.phone
)
SELECT vote_id, phone, state, contestant, ts,
       coalesce(reason, CASE WHEN nth > ? THEN 'over_phone_limit' END) AS reason
FROM numbered ORDER BY vote_id
"""

# Lowest total first, ties to the lower number; never the last active contestant.
REMOVE_SQL = f"""
UPDATE {ident(CONTESTANTS)} SET removed_at_votes = ?, removed_batch = ?
WHERE contestant IN (
    SELECT contestant FROM (
        SELECT c.contestant,
               row_number() OVER (ORDER BY t.votes, c.contestant) AS place,
               count(*) OVER () AS active
        FROM {ident(CONTESTANTS)} AS c JOIN {ident(VOTE_TOTALS)} AS t USING (contestant)
        WHERE c.removed_at_votes IS NULL)
    WHERE place <= ? AND place < active)
RETURNING contestant, name
"""

# One upsert covers every contestant, so contestants who left the window drop to zero.
TRENDING_SQL = f"""
INSERT INTO {ident(TRENDING_LEADERBOARD)} AS l
SELECT c.contestant, count(b.contestant) FILTER (WHERE c.removed_at_votes IS NULL)
FROM {ident(CONTESTANTS)} AS c LEFT JOIN batch AS b ON b.contestant = c.contestant
GROUP BY c.contestant
ON CONFLICT (contestant) DO UPDATE SET votes = excluded.votes
"""

LEADERBOARD_SQL = f"""
SELECT row_number() OVER (ORDER BY c.removed_at_votes IS NOT NULL, t.votes DESC,
                                   c.contestant)::INTEGER AS rank,
       c.contestant, c.name, t.votes, coalesce(l.votes, 0) AS trending, c.removed_at_votes
FROM {ident(CONTESTANTS)} AS c JOIN {ident(VOTE_TOTALS)} AS t USING (contestant)
     LEFT JOIN {ident(TRENDING_LEADERBOARD)} AS l USING (contestant)
ORDER BY rank
"""


def leaderboard(engine: Engine, limit: int | None = None) -> pa.Table:
    """Contestants by total valid votes, the active ones first, with their trending count.

    Columns: rank, contestant, name, votes, trending (votes among the last W valid votes),
    removed_at_votes (the running count of valid votes when removed; null while active).
    """
    table = engine.query(LEADERBOARD_SQL)
    return table if limit is None else table.slice(0, limit)


def voter_counts(engine: Engine) -> dict[str, Any]:
    """What the state says so far: valid votes, rejections by reason, removed contestants."""
    valid = engine.query(f"SELECT coalesce(sum(votes), 0)::BIGINT AS n FROM {ident(VOTE_TOTALS)}")
    reasons = engine.query(f"SELECT reason, count(*) AS n FROM {ident(REJECTIONS)} "
                           "GROUP BY reason ORDER BY reason")
    removed = engine.query(f"SELECT contestant FROM {ident(CONTESTANTS)} WHERE removed_at_votes "
                           "IS NOT NULL ORDER BY removed_at_votes, contestant")
    by_reason = {reason: 0 for reason in REASONS}
    by_reason.update(dict(zip(reasons["reason"].to_pylist(), reasons["n"].to_pylist())))
    return {"valid": int(valid["n"][0].as_py()), "rejected": by_reason,
            "removed": removed["contestant"].to_pylist()}
