"""The voter workload against an independent, plain-Python recomputation from its input."""

from __future__ import annotations

import collections
import datetime
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from sstore import Engine
from sstore.workloads.voter import (
    VoterHalted,
    batches,
    declare,
    generate_votes,
    leaderboard,
    run_voter,
    voter_counts,
)
from sstore.workloads.voter.generator import AREA_CODES, VOTE_SCHEMA, state_of

CONTESTANTS = 6
MAX_PER_PHONE = 2
REMOVE_EVERY = 250
WINDOW = 40
BATCH = 50


@dataclass
class Expected:
    """What the voter state must be, recomputed vote by vote in Python."""

    totals: dict[int, int] = field(default_factory=dict)
    phone_votes: collections.Counter[int] = field(default_factory=collections.Counter)
    removed: dict[int, tuple[int, int]] = field(default_factory=dict)  # -> (at votes, batch)
    valid: list[dict] = field(default_factory=list)
    rejected: dict[int, str] = field(default_factory=dict)  # vote_id -> reason

    @property
    def valid_count(self) -> int:
        return len(self.valid)

    def trending(self, window: int) -> dict[int, int]:
        last = self.valid[-window:]
        counts = collections.Counter(v["contestant"] for v in last
                                     if v["contestant"] not in self.removed)
        return {c: counts.get(c, 0) for c in self.totals}


def recompute(votes: pa.Table, batch_size: int, contestants: int = CONTESTANTS,
              max_per_phone: int = MAX_PER_PHONE, remove_every: int = REMOVE_EVERY) -> Expected:
    """The voter semantics, one vote at a time: contestants are checked against the state at the
    start of each batch, and removals happen at the end of the batch that crosses a multiple."""
    exp = Expected(totals={c: 0 for c in range(1, contestants + 1)})
    for batch_id, batch in enumerate(batches(votes, batch_size), start=1):
        before = exp.valid_count
        for vote in batch.to_pylist():
            c = vote["contestant"]
            if c not in exp.totals:
                exp.rejected[vote["vote_id"]] = "unknown_contestant"
            elif c in exp.removed:
                exp.rejected[vote["vote_id"]] = "removed_contestant"
            elif exp.phone_votes[vote["phone"]] >= max_per_phone:
                exp.rejected[vote["vote_id"]] = "over_phone_limit"
            else:
                exp.phone_votes[vote["phone"]] += 1
                exp.totals[c] += 1
                exp.valid.append(vote)
        after = exp.valid_count
        for _ in range(after // remove_every - before // remove_every):
            active = [c for c in exp.totals if c not in exp.removed]
            if len(active) <= 1:
                break
            lowest = min(active, key=lambda c: (exp.totals[c], c))
            exp.removed[lowest] = (after, batch_id)
    return exp


def open_voter(path: str, **overrides: int) -> Engine:
    engine = Engine(path)
    declare(engine, **{"contestants": CONTESTANTS, "max_votes_per_phone": MAX_PER_PHONE,
                       "remove_every": REMOVE_EVERY, "window_rows": WINDOW, **overrides})
    return engine


def assert_state_matches(engine: Engine, exp: Expected) -> None:
    totals = engine.query("SELECT contestant, votes FROM vote_totals ORDER BY contestant")
    assert dict(zip(*(totals[c].to_pylist() for c in ("contestant", "votes")))) == exp.totals
    removed = engine.query("SELECT contestant, removed_at_votes, removed_batch FROM contestants "
                           "WHERE removed_at_votes IS NOT NULL")
    assert {r["contestant"]: (r["removed_at_votes"], r["removed_batch"])
            for r in removed.to_pylist()} == exp.removed
    rejected = engine.query("SELECT vote_id, reason FROM vote_rejections")
    assert dict(zip(rejected["vote_id"].to_pylist(), rejected["reason"].to_pylist())) \
        == exp.rejected
    phones = engine.query("SELECT phone, votes FROM phone_votes")
    assert dict(zip(phones["phone"].to_pylist(), phones["votes"].to_pylist())) \
        == dict(exp.phone_votes)
    trending = engine.query("SELECT contestant, votes FROM trending_leaderboard")
    assert dict(zip(trending["contestant"].to_pylist(), trending["votes"].to_pylist())) \
        == exp.trending(WINDOW)


@pytest.fixture(scope="module")
def votes() -> pa.Table:
    return generate_votes(3000, seed=7, contestants=CONTESTANTS, invalid_share=0.1)


@pytest.fixture(scope="module")
def expected(votes: pa.Table) -> Expected:
    exp = recompute(votes, BATCH)
    assert len(exp.removed) >= 3 and set(exp.rejected.values()) == {
        "unknown_contestant", "removed_contestant", "over_phone_limit"}  # the tests have teeth
    return exp


@pytest.fixture(scope="module")
def voter_run(tmp_path_factory, votes: pa.Table) -> Iterator[tuple[Engine, dict]]:
    """One whole run on a state file, shared by the tests that only read its result."""
    engine = open_voter(str(tmp_path_factory.mktemp("voter") / "v.duckdb"))
    result = run_voter(engine, votes, BATCH)
    yield engine, result
    engine.close()


# ------------------------------------------------------------------------------- generator
def test_generator_is_deterministic_and_well_formed() -> None:
    a = generate_votes(2000, seed=3)
    assert a.equals(generate_votes(2000, seed=3))
    assert not a.equals(generate_votes(2000, seed=4))
    assert a.schema.equals(VOTE_SCHEMA)
    assert a["vote_id"].to_pylist() == list(range(1, 2001))
    rows = a.to_pylist()
    assert all(r["state"] == state_of(r["phone"]) and r["phone"] // 10**7 in AREA_CODES
               for r in rows)
    times = [r["ts"] for r in rows]
    assert times == sorted(times) and times[0] > datetime.datetime(2025, 1, 1)
    unknown = sum(r["contestant"] > 12 for r in rows)
    assert 0 < unknown < 2000 * 0.05  # about half of the 5% invalid share
    per_phone = collections.Counter(r["phone"] for r in rows)
    assert max(per_phone.values()) > 2  # superfans go over a small per-phone limit
    assert generate_votes(0).num_rows == 0


def test_a_longer_run_extends_a_shorter_one() -> None:
    """The first k votes do not depend on how many follow: a demo run again with more votes on
    the same state file re-sends its first batches with the same rows (a re-send with other
    rows is refused, ``ResendMismatchError``)."""
    short = generate_votes(600, seed=2)
    assert generate_votes(1000, seed=2).slice(0, 600).equals(short)
    assert generate_votes(50_000, seed=2).slice(0, 600).equals(short)


def test_batches_cut_in_order() -> None:
    table = generate_votes(105, seed=1)
    parts = list(batches(table, 50))
    assert [p.num_rows for p in parts] == [50, 50, 5]
    assert pa.concat_tables(parts).equals(table)
    with pytest.raises(ValueError):
        list(batches(table, 0))


# ------------------------------------------------------------------------------- validation
def vote(vote_id: int, phone: int, contestant: int) -> dict:
    return {"vote_id": vote_id, "phone": phone, "state": state_of(phone),
            "contestant": contestant,
            "ts": datetime.datetime(2025, 1, 1) + datetime.timedelta(seconds=vote_id)}


def test_validation_rejects_the_right_votes(tmp_path) -> None:
    engine = open_voter(str(tmp_path / "v.duckdb"), contestants=3, remove_every=4)
    a, b, c, d = 2125550001, 2125550002, 3125550003, 4155550004
    # batch 1: phone a votes three times (the third is over the limit), contestant 9 is unknown;
    # four valid votes cross remove_every=4, so contestant 3 (no votes) is removed afterwards.
    engine.ingest("votes", [vote(1, a, 1), vote(2, a, 2), vote(3, b, 9), vote(4, a, 1),
                            vote(5, b, 1), vote(6, c, 2)])
    engine.run_until_idle()
    # batch 2: phone a is still over the limit; contestant 3 is now removed.
    engine.ingest("votes", [vote(7, a, 2), vote(8, d, 3), vote(9, d, 2), vote(10, b, 2),
                            vote(11, b, 1)])
    engine.run_until_idle()
    rejected = engine.query("SELECT vote_id, reason FROM vote_rejections")
    reasons = dict(zip(rejected["vote_id"].to_pylist(), rejected["reason"].to_pylist()))
    assert reasons == {3: "unknown_contestant", 4: "over_phone_limit", 7: "over_phone_limit",
                       8: "removed_contestant", 11: "over_phone_limit"}
    totals = engine.query("SELECT contestant, votes FROM vote_totals ORDER BY contestant")
    assert totals["votes"].to_pylist() == [2, 4, 0]
    removed = engine.query("SELECT contestant, removed_at_votes, removed_batch FROM contestants "
                           "WHERE removed_at_votes IS NOT NULL").to_pylist()
    assert removed == [{"contestant": 3, "removed_at_votes": 4, "removed_batch": 1}]
    phones = engine.query("SELECT phone, votes FROM phone_votes ORDER BY phone").to_pylist()
    assert phones == [{"phone": a, "votes": 2}, {"phone": b, "votes": 2},
                      {"phone": c, "votes": 1}, {"phone": d, "votes": 1}]
    counts = voter_counts(engine)
    assert counts == {"valid": 6, "rejected": {"unknown_contestant": 1,
                                              "removed_contestant": 1, "over_phone_limit": 3},
                      "removed": [3]}
    # batch 3 has no valid vote at all (the window does not slide); batch 4 has one again
    engine.ingest("votes", [vote(12, a, 1), vote(13, c, 7)])
    engine.ingest("votes", [vote(14, 2015550005, 1)])
    engine.run_until_idle()
    assert voter_counts(engine)["valid"] == 7
    trending = engine.query("SELECT contestant, votes FROM trending_leaderboard "
                            "ORDER BY contestant")
    assert trending["votes"].to_pylist() == [3, 4, 0]  # window of 100 holds every valid vote
    progress = {p.name: p.last_batch for p in engine.status().procedures}
    assert progress == {"validate_votes": 4, "count_votes": 4, "remove_lowest": 4,
                        "update_trending": 4}
    engine.close()


# ------------------------------------------------------------------------------- whole runs
def test_run_matches_a_plain_python_recomputation(voter_run, votes, expected) -> None:
    engine, result = voter_run
    assert result["votes"] == votes.num_rows and result["batches"] == 60
    assert result["skipped_batches"] == 0
    assert result["valid"] == expected.valid_count
    assert sum(result["rejected"].values()) == len(expected.rejected)
    assert result["rejected"]["over_phone_limit"] == \
        sum(r == "over_phone_limit" for r in expected.rejected.values())
    assert result["removed"] == sorted(expected.removed, key=lambda c: expected.removed[c])
    assert result["executions"] >= 3 * result["batches"]
    assert result["votes_per_s"] > 0 and result["executions_per_s"] > 0
    assert_state_matches(engine, expected)


def test_totals_match_duckdb_over_the_valid_votes(voter_run, votes) -> None:
    """Totals equal a GROUP BY over the input minus the rejected votes, in DuckDB itself."""
    engine, _ = voter_run
    with engine.transaction() as tx:
        tx.execute("CREATE TEMP TABLE input_votes (vote_id BIGINT, contestant INTEGER)")
        tx.execute("INSERT INTO input_votes SELECT unnest(?::BIGINT[]), unnest(?::INTEGER[])",
                   votes["vote_id"].to_pylist(), votes["contestant"].to_pylist())
        mismatches = tx.fetchall(
            "SELECT t.contestant, t.votes, count(i.vote_id) AS recount FROM vote_totals t "
            "LEFT JOIN input_votes i ON i.contestant = t.contestant AND i.vote_id NOT IN "
            "(SELECT vote_id FROM vote_rejections) GROUP BY t.contestant, t.votes "
            "HAVING t.votes <> count(i.vote_id)")
        tx.execute("DROP TABLE input_votes")
    assert mismatches == []


def test_lowest_contestant_removed_every_n_valid_votes(voter_run, expected) -> None:
    engine, _ = voter_run
    valid = voter_counts(engine)["valid"]
    removed = engine.query("SELECT contestant, removed_at_votes FROM contestants WHERE "
                           "removed_at_votes IS NOT NULL ORDER BY removed_at_votes").to_pylist()
    # one removal per multiple of N crossed, never the last contestant standing
    assert len(removed) == min(CONTESTANTS - 1, valid // REMOVE_EVERY)
    # each removal happened in the batch that crossed the next multiple of N
    for k, row in enumerate(removed, start=1):
        assert row["removed_at_votes"] >= k * REMOVE_EVERY > row["removed_at_votes"] - BATCH
    # and removed the contestant who was lowest at that moment
    assert [r["contestant"] for r in removed] == sorted(expected.removed,
                                                        key=lambda c: expected.removed[c])


def test_leaderboard_orders_active_contestants_by_votes(voter_run, expected) -> None:
    engine, _ = voter_run
    board = leaderboard(engine).to_pylist()
    assert [r["rank"] for r in board] == list(range(1, CONTESTANTS + 1))
    active = [r for r in board if r["removed_at_votes"] is None]
    assert board[:len(active)] == active  # active first
    assert [r["votes"] for r in active] == sorted((r["votes"] for r in active), reverse=True)
    assert {r["contestant"]: r["votes"] for r in board} == expected.totals
    assert {r["contestant"]: r["trending"] for r in board} == expected.trending(WINDOW)
    assert board[0]["name"] and leaderboard(engine, limit=2).num_rows == 2


def test_last_contestant_is_never_removed(tmp_path) -> None:
    votes = generate_votes(600, seed=2, contestants=3, invalid_share=0.0)
    engine = open_voter(str(tmp_path / "v.duckdb"), contestants=3, remove_every=20)
    run_voter(engine, votes, 100)
    board = leaderboard(engine)
    assert board["removed_at_votes"].null_count == 1
    assert board["rank"].to_pylist() == [1, 2, 3]
    assert board["removed_at_votes"][0].as_py() is None  # the survivor is ranked first
    engine.close()


def test_window_leaderboard_is_the_last_w_valid_votes(tmp_path, votes, expected) -> None:
    engine = open_voter(str(tmp_path / "v.duckdb"))
    checked = 0
    # check after every batch, not only at the end: the window slides with each batch
    for batch_id, batch in enumerate(batches(votes, BATCH), start=1):
        engine.ingest("votes", batch, batch_id=batch_id)
        engine.run_until_idle()
        if batch_id % 10 == 0:
            so_far = recompute(votes.slice(0, batch_id * BATCH), BATCH)
            window = engine.query("SELECT vote_id FROM trending ORDER BY vote_id")
            assert window["vote_id"].to_pylist() == [v["vote_id"] for v in so_far.valid[-WINDOW:]]
            trending = engine.query("SELECT contestant, votes FROM trending_leaderboard")
            assert dict(zip(trending["contestant"].to_pylist(),
                            trending["votes"].to_pylist())) == so_far.trending(WINDOW)
            checked += 1
    assert checked == 6
    assert_state_matches(engine, expected)
    engine.close()


# ------------------------------------------------------------------------------- restarts
def test_restart_on_the_same_file_resumes(tmp_path, votes, expected) -> None:
    path = str(tmp_path / "v.duckdb")
    engine = open_voter(path)
    first = run_voter(engine, votes.slice(0, 20 * BATCH), BATCH)
    assert first["batches"] == 20
    # batch 21 arrives but the process stops before the dataflow runs it
    engine.ingest("votes", votes.slice(20 * BATCH, BATCH), batch_id=21)
    engine.close()

    engine = open_voter(path)  # the program declares everything again on start
    assert engine.query("SELECT count(*) AS n FROM contestants")["n"][0].as_py() == CONTESTANTS
    second = run_voter(engine, votes, BATCH)  # the same votes again: resume, exactly once
    assert second["skipped_batches"] == 21 and second["batches"] == 39
    assert second["skipped_votes"] == 21 * BATCH and second["votes"] == 39 * BATCH
    assert first["valid"] + second["valid"] == expected.valid_count  # batch 21 ran in the 2nd
    assert_state_matches(engine, expected)
    engine.close()

    engine = open_voter(path)
    third = run_voter(engine, votes, BATCH)  # nothing left to do
    assert third["votes"] == 0 and third["valid"] == 0 and third["executions"] == 0
    assert_state_matches(engine, expected)
    engine.close()


def test_run_reports_a_halted_procedure(tmp_path) -> None:
    engine = open_voter(str(tmp_path / "v.duckdb"))
    engine.execute("DROP TABLE trending_leaderboard")  # update_trending will fail on batch 1
    with pytest.raises(VoterHalted, match=r"update_trending at batch 1: .*trending_leaderboard"):
        run_voter(engine, generate_votes(300, seed=1), 100)
    # a halt stops only the failing procedure and what follows it: counting went on
    assert voter_counts(engine)["valid"] > 0
    engine.close()


def test_declare_rejects_nonsense(tmp_path) -> None:
    engine = Engine(str(tmp_path / "v.duckdb"))
    with pytest.raises(ValueError, match="remove_every"):
        declare(engine, remove_every=0)
    engine.close()
