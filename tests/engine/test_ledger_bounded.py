"""The border batch-ids a service has taken stay bounded in memory (sstore.storage.ingested), and
every re-send keeps its outcome: a batch-id ingested weeks ago is still a no-op, a lower id never
ingested is still refused, during the run and after a restart."""

from __future__ import annotations

import functools
import time

import duckdb
import pytest

from sstore import Engine, OutOfOrderBatchError
from sstore.storage import systables
from sstore.storage.ingested import RANGES
from sstore.storage.ledger import Ledger

RUNS = 100_000  # runs of two consecutive ids, a gap after each: 200,000 ids, 100,000 ranges
FIRST = 1_000


def weeks_of_batches(path: str, step: int = 3) -> int:
    """A state file whose border stream took 3 batches, then 200,000 more in 100,000 pairs
    (FIRST + step k, FIRST + step k + 1: runs with gaps for step 3, one run for step 2), all
    garbage-collected, as a service of some weeks leaves it (written in SQL: ingesting them
    one by one would take minutes). Returns the last id."""
    eng = Engine(path)
    eng.stream("votes", {"phone": "BIGINT"})
    for b in (1, 2, 3):
        eng.ingest("votes", [(b,)], batch_id=b)
    eng.close()
    last = FIRST + step * (RUNS - 1) + 1
    with duckdb.connect(path) as con:
        con.execute("INSERT INTO sstore_sys.commits (node, batch_id, n_rows) "
                    "SELECT 'votes', ? + ? * k + j, 1 FROM range(?) r(k), range(2) s(j)",
                    [FIRST, step, RUNS])
        con.execute("DELETE FROM votes")
        con.execute("INSERT INTO sstore_sys.collected VALUES ('votes', ?) ON CONFLICT (stream) "
                    "DO UPDATE SET through = excluded.through", [last])
    return last


def stored(eng: Engine) -> list[int]:
    return [r["phone"] for r in eng.query("SELECT phone FROM votes ORDER BY phone").to_pylist()]


def test_a_restart_after_weeks_of_batches_keeps_memory_small_and_old_ids_known(
        state_path: str) -> None:
    last = weeks_of_batches(state_path)
    began = time.perf_counter()
    eng = Engine(state_path)
    eng.stream("votes", {"phone": "BIGINT"})
    ledger = eng._runtime().ledger
    opened = time.perf_counter() - began
    # bounded: at most RANGES runs of ids, and none of the collected batches listed
    assert len(ledger.ingested["votes"]) == RANGES
    assert ledger.batches["votes"].ids == []
    assert ledger.last_ingested["votes"] == last
    assert opened < 10, f"opening took {opened:.1f} s"
    # the oldest ids (the first ones, the first of the SQL runs) are re-sends: no-ops
    for old in (1, 3, FIRST, FIRST + 1, FIRST + 3 * 5_000, last - 1, last):
        again = eng.ingest("votes", [(old,)], batch_id=old)  # batch b's row is (b,)
        assert again.duplicate and again.rows == 0 and again == old
    # an old id that was never ingested (a gap) is refused, as before
    for gap in (4, FIRST - 1, FIRST + 2, FIRST + 3 * 5_000 + 2, last - 2):
        with pytest.raises(OutOfOrderBatchError, match=f"batch-id {gap} is lower"):
            eng.ingest("votes", [(-gap,)], batch_id=gap)
    assert eng.ingest("votes", [(7,)]) == last + 1
    assert stored(eng) == [7]
    eng.close()
    # and once more after that restart
    eng = Engine(state_path)
    eng.stream("votes", {"phone": "BIGINT"})
    assert eng.ingest("votes", [(8,)], batch_id=FIRST).duplicate
    with pytest.raises(OutOfOrderBatchError):
        eng.ingest("votes", [(8,)], batch_id=FIRST + 2)
    assert eng.ingest("votes", [(9,)]) == last + 2
    assert len(eng._runtime().ledger.ingested["votes"]) == RANGES
    assert stored(eng) == [7, 9]
    eng.close()


def test_the_running_ledger_keeps_the_newest_runs_and_asks_the_table_for_older(
        engine: Engine) -> None:
    engine.stream("votes", {"phone": "BIGINT"})
    rt = engine._runtime()
    ledger = Ledger(rt.graph, functools.partial(systables.was_ingested, rt.con), ranges=8)
    ids = [b for k in range(1_000) for b in (10 * k + 1, 10 * k + 2, 10 * k + 3)]
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        systables.insert_commits(rt.con, [("votes", b, 1) for b in chunk])
        for b in chunk:
            ledger.record("votes", b, 1)
    held = ledger.ingested["votes"]
    assert len(held) == 8 and held.floor == 10 * 991 + 3
    assert all(ledger.was_ingested("votes", b) for b in (1, 2, 3, 5_002, 9_903, 9_993))
    assert not any(ledger.was_ingested("votes", b) for b in (4, 10, 5_004, 9_910, 9_994))
    # a group commit that led with a new id and rolled back: the id is gone, the last one back
    ledger.begin_journal()
    ledger.record("votes", 10_050, 1)
    assert ledger.was_ingested("votes", 10_050) and len(held) == 8
    ledger.rollback_journal()
    assert not ledger.was_ingested("votes", 10_050)
    assert ledger.last_ingested["votes"] == 9_993 and held.lasts[-1] == 9_993
    assert ledger.was_ingested("votes", 9_992)


def test_a_ledger_without_lookup_keeps_every_id(engine: Engine) -> None:
    """Built by hand, with no table to ask: nothing is dropped, the answer stays exact."""
    engine.stream("votes", {"phone": "BIGINT"})
    ledger = Ledger(engine._runtime().graph, ranges=2)
    for b in range(1, 100, 2):
        ledger.record("votes", b, 1)
    assert len(ledger.ingested["votes"]) == 50
    assert ledger.was_ingested("votes", 1) and not ledger.was_ingested("votes", 2)


def commit_records(eng: Engine, node: str) -> int:
    return eng.query("SELECT count(*) AS n FROM sstore_sys.commits WHERE node = ?",
                     node).column("n")[0].as_py()


def count_voters(eng: Engine) -> None:
    eng.stream("votes", {"phone": "BIGINT"})
    eng.execute("CREATE TABLE IF NOT EXISTS voters (phone BIGINT)")

    @eng.procedure(input="votes")
    def count(tx, batch):
        tx.execute("INSERT INTO voters SELECT phone FROM batch")


def more_weeks(path: str, first: int, n: int) -> int:
    """``n`` more consecutive batches from ``first``, collected (in SQL, as above)."""
    with duckdb.connect(path) as con:
        con.execute("INSERT INTO sstore_sys.commits (node, batch_id, n_rows) "
                    "SELECT 'votes', ? + k, 1 FROM range(?) r(k)", [first, n])
        con.execute("UPDATE sstore_sys.collected SET through = ? WHERE stream = 'votes'",
                    [first + n - 1])
    return first + n - 1


def runs(eng: Engine) -> list[tuple[int, int]]:
    return [tuple(r.values()) for r in eng.query(
        "SELECT first_batch, last_batch FROM sstore_sys.ingested_runs ORDER BY 1").to_pylist()]


def resends_keep_their_outcomes(eng: Engine, ingested: list[int], gaps: list[int]) -> None:
    """Each ingested id, re-sent with its rows (batch b's only row is (b,), the records made
    in SQL have its row count and no fingerprint): a no-op; each gap: refused."""
    for old in ingested:
        again = eng.ingest("votes", [(old,)], batch_id=old)
        assert again.duplicate and again.rows == 0, old
    for gap in gaps:
        with pytest.raises(OutOfOrderBatchError, match=f"batch-id {gap} is lower"):
            eng.ingest("votes", [(-gap,)], batch_id=gap)


@pytest.mark.parametrize("step", [2, 3])
def test_gc_compacts_the_records_of_collected_border_batches_into_runs(
        state_path: str, step: int) -> None:
    """The durable side: one commit record per border batch for good becomes a few runs of
    batch-ids (one per gap), and every re-send keeps its outcome, after restarts too."""
    last = weeks_of_batches(state_path, step)
    ingested = [1, 3, FIRST, FIRST + step * 777 + 1, last - 1, last]
    gaps = [4, FIRST - 1] + ([FIRST + 2, last - 2] if step == 3 else [])
    eng = Engine(state_path, gc_every=1)
    count_voters(eng)
    assert commit_records(eng, "votes") == 200_003
    assert eng.ingest_and_run("votes", [(last + 1,)]) == last + 1  # GC runs after it
    assert commit_records(eng, "votes") == 1  # the newest: its id and time for status
    if step == 2:  # consecutive ids: two runs
        assert runs(eng) == [(1, 3), (FIRST, last)]
    else:  # a run per pair: no smaller than before, but no bigger either
        assert len(runs(eng)) == RUNS + 1 and runs(eng)[-1] == (last - 1, last)
    assert eng.status().streams[0].last_batch == last + 1
    resends_keep_their_outcomes(eng, [*ingested, last + 1], gaps)
    eng.close()
    # more weeks: the newest run grows, it gets no new row
    newest = more_weeks(state_path, last + 2, 5_000)
    eng = Engine(state_path, gc_every=1)
    count_voters(eng)
    resends_keep_their_outcomes(eng, [*ingested, last + 1, last + 2, newest], gaps)
    assert eng.ingest_and_run("votes", [(newest + 1,)]) == newest + 1
    assert commit_records(eng, "votes") == 1
    assert runs(eng)[-1] == ((FIRST if step == 2 else last - 1), newest)
    assert len(runs(eng)) == (2 if step == 2 else RUNS + 1)
    eng.close()
    eng = Engine(state_path)  # and after a restart
    count_voters(eng)
    resends_keep_their_outcomes(eng, [*ingested, last + 1, newest, newest + 1], gaps)
    assert eng.ingest("votes", [(newest + 2,)]) == newest + 2
    assert eng.query("SELECT count(*) AS n FROM voters").to_pylist() == [{"n": 2}]
    eng.close()
