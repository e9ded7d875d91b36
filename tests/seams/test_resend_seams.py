"""A border batch re-sent under the same batch-id: a no-op when it carries the same rows (that
is what makes re-sends exactly once), a loud ``ResendMismatchError`` when its rows differ
(a corrected file, another chunking, another source reusing ids). It used to be a no-op
either way: the changed rows were dropped with no error.

Every path an ingest takes is covered: ``ingest`` and ``ingest_and_run`` (whose group commit
records the batch in its own statement), full and weak durability, and a restart in between.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from sstore import Engine, ResendMismatchError, TerminalError
from sstore.base.fingerprint import fingerprint
from sstore.execution import gc
from sstore.storage import systables

COLUMNS = {"phone": "BIGINT", "contestant": "INTEGER", "note": "VARCHAR"}
FIRST = [(1, 1, "a"), (2, 2, None), (3, 1, "c")]
SECOND = [(4, 3, "d")]


@contextmanager
def program(tmp_path: Path, durability: str) -> Iterator[Engine]:
    """The same program every time it starts: a border stream and a procedure that counts
    the votes per contestant (so a dropped or doubled batch shows in its table too)."""
    if durability == "full":
        eng = Engine(str(tmp_path / "state.duckdb"))
    else:
        eng = Engine(":memory:", input_log=str(tmp_path / "in.log"))
    eng.stream("votes", COLUMNS)
    eng.execute("CREATE TABLE IF NOT EXISTS totals (contestant INTEGER PRIMARY KEY, n BIGINT)")

    @eng.procedure(input="votes")
    def count(tx, batch):  # noqa: ANN001, ANN202 (a procedure's signature)
        tx.execute("INSERT INTO totals SELECT contestant, count(*) FROM batch GROUP BY ALL "
                   "ON CONFLICT (contestant) DO UPDATE SET n = totals.n + excluded.n")

    try:
        yield eng
    finally:
        eng.close()


def send(eng: Engine, how: str, rows: object, batch_id: int) -> int:
    if how == "ingest":
        done = eng.ingest("votes", rows, batch_id=batch_id)
        eng.run_until_idle()
        return done
    return eng.ingest_and_run("votes", rows, batch_id=batch_id)


def totals(eng: Engine) -> list[tuple[int, int]]:
    return [(r["contestant"], r["n"]) for r in
            eng.query("SELECT contestant, n FROM totals ORDER BY contestant").to_pylist()]


def ingested(eng: Engine) -> list[tuple[int, int]]:
    return [(r["batch_id"], r["n_rows"]) for r in eng.query(
        "SELECT batch_id, n_rows FROM sstore_sys.commits WHERE node = ? ORDER BY batch_id",
        "votes").to_pylist()]


MODES = [("full", "ingest"), ("full", "ingest_and_run"), ("weak", "ingest"),
         ("weak", "ingest_and_run")]
BEFORE = [(1, 2), (2, 1), (3, 1)]  # totals after FIRST and SECOND


@pytest.mark.parametrize("durability, how", MODES)
def test_identical_resend_is_a_noop_in_any_layout(tmp_path: Path, durability: str,
                                                  how: str) -> None:
    """The same rows, as tuples, dicts, an Arrow table in other chunks or a slice of a bigger
    table: the same fingerprint, so a no-op, before and after a restart."""
    with program(tmp_path, durability) as eng:
        assert send(eng, how, FIRST, 1) == 1
        assert send(eng, how, SECOND, 2) == 2
        assert totals(eng) == BEFORE
        as_arrow = pa.Table.from_pylist([dict(zip(COLUMNS, r)) for r in FIRST],
                                        schema=eng.schema("votes"))
        bigger = pa.concat_tables([as_arrow, as_arrow])
        for same in (FIRST, [dict(zip(COLUMNS, r)) for r in FIRST],
                     pa.Table.from_batches(as_arrow.to_batches(max_chunksize=1)),
                     bigger.slice(3, 3)):
            again = eng.ingest("votes", same, batch_id=1)
            assert again.duplicate and again == 1
            again = eng.ingest_and_run("votes", same, batch_id=1)
            assert again.duplicate and again.executions == 0
        assert totals(eng) == BEFORE
    with program(tmp_path, durability) as eng:
        assert send(eng, how, FIRST, 1) == 1  # after the restart (weak: replayed log)
        assert eng.ingest_and_run("votes", SECOND, batch_id=2).duplicate
        assert totals(eng) == BEFORE
        assert ingested(eng) == [(1, 3), (2, 1)]


CHANGED = [
    pytest.param([(1, 1, "a"), (2, 2, None)], "ingested with 3 rows and is re-sent with 2",
                 id="fewer-rows"),
    pytest.param(FIRST + [(5, 2, "e")], "ingested with 3 rows and is re-sent with 4",
                 id="more-rows"),
    pytest.param([(1, 1, "a"), (2, 2, "corrected"), (3, 1, "c")],
                 "re-sent with as many rows but other values", id="a-value"),
    pytest.param([(1, 1, "a"), (2, 2, ""), (3, 1, "c")], "other values", id="null-to-empty"),
    pytest.param([(2, 2, None), (1, 1, "a"), (3, 1, "c")], "or another row order",
                 id="row-order"),
]


@pytest.mark.parametrize("durability, how", MODES)
@pytest.mark.parametrize("rows, what", CHANGED)
def test_a_resend_with_other_rows_is_refused_and_ingests_nothing(
        tmp_path: Path, durability: str, how: str, rows: list[tuple[object, ...]],
        what: str) -> None:
    with program(tmp_path, durability) as eng:
        send(eng, how, FIRST, 1)
        send(eng, how, SECOND, 2)
        with pytest.raises(ResendMismatchError, match=what) as raised:
            send(eng, how, rows, 1)
        error = raised.value
        assert isinstance(error, TerminalError)
        assert (error.stream, error.batch_id, error.ingested_rows) == ("votes", 1, 3)
        assert error.sent_rows == len(rows)
        assert "batch-id 1 was already ingested with other rows" in str(error)
        assert "was NOT ingested" in str(error) and "above 2 (or without one)" in str(error)
        assert totals(eng) == BEFORE and ingested(eng) == [(1, 3), (2, 1)]
        assert send(eng, how, SECOND, 3) == 3  # the stream goes on as before
        assert totals(eng) == [(1, 2), (2, 1), (3, 2)]
    with program(tmp_path, durability) as eng:  # nothing of it was logged or stored
        eng.run_until_idle()  # weak: the log's last batch is replayed, its TE runs now
        assert totals(eng) == [(1, 2), (2, 1), (3, 2)]
        with pytest.raises(ResendMismatchError, match=what):
            send(eng, how, rows, 1)
        assert totals(eng) == [(1, 2), (2, 1), (3, 2)]


def test_an_empty_batch_resent_with_rows_is_refused(tmp_path: Path) -> None:
    with program(tmp_path, "full") as eng:
        eng.ingest_and_run("votes", [], batch_id=1)
        assert eng.ingest_and_run("votes", None, batch_id=1).duplicate
        with pytest.raises(ResendMismatchError, match="ingested with 0 rows and is re-sent "
                                                      "with 1"):
            eng.ingest("votes", SECOND, batch_id=1)
        assert totals(eng) == []


def test_the_fingerprint_is_recorded_with_the_commit_record(tmp_path: Path) -> None:
    """In the batch's own commit record (no statement of its own), for border batches only."""
    with program(tmp_path, "full") as eng:
        send(eng, "ingest", FIRST, 1)
        send(eng, "ingest_and_run", SECOND, 2)
        table = eng.query("SELECT node, batch_id, fingerprint FROM sstore_sys.commits "
                          "ORDER BY node, batch_id").to_pylist()
        prints = {(r["node"], r["batch_id"]): r["fingerprint"] for r in table}
        schema = eng.schema("votes")
        assert schema is not None
        assert prints[("votes", 1)] == fingerprint(pa.Table.from_pylist(
            [dict(zip(COLUMNS, r)) for r in FIRST], schema=schema))
        assert prints[("votes", 2)] is not None and prints[("count", 2)] is None


def test_records_from_before_fingerprints_are_checked_by_row_count(tmp_path: Path) -> None:
    """A state file written before the column existed gets it at open (NULL for its old
    records): their re-sends are checked by row count only, and new batches get their
    fingerprint."""
    with program(tmp_path, "full") as eng:
        send(eng, "ingest", FIRST, 1)
        eng.connection.execute("ALTER TABLE sstore_sys.commits DROP COLUMN fingerprint")
    with program(tmp_path, "full") as eng:
        assert eng.ingest("votes", [(7, 7, "same count")] * 3, batch_id=1).duplicate
        with pytest.raises(ResendMismatchError, match="re-sent with 1"):
            eng.ingest("votes", SECOND, batch_id=1)
        send(eng, "ingest_and_run", SECOND, 2)
        with pytest.raises(ResendMismatchError, match="other values"):
            eng.ingest("votes", [(4, 3, "other")], batch_id=2)
        assert totals(eng) == BEFORE


@pytest.mark.parametrize("durability, how", MODES)
def test_a_resend_of_a_compacted_batch_is_still_checked(tmp_path: Path, durability: str,
                                                        how: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Once GC compacted the commit records of collected batches into runs of ids
    (``systables.compact_statements``), a re-send of such an old id is still compared with the
    rows first sent (their count and fingerprint moved to ``sstore_sys.ingested_prints``):
    identical, a no-op; changed, refused. It used to be a no-op either way (a source that
    resets its ids after weeks lost its rows without a word). Also after a restart."""
    monkeypatch.setattr(gc, "COMPACT_EVERY", 4)
    for attempt in range(2):
        with program(tmp_path, durability) as eng:
            if attempt == 0:
                for batch_id in range(1, 9):
                    send(eng, how, [(batch_id, 1, None)], batch_id)
            eng.collect_garbage()
            assert ingested(eng)[0][0] > 1  # batch 1's record is compacted away
            assert eng.ingest("votes", [(1, 1, None)], batch_id=1).duplicate
            assert eng.ingest_and_run("votes", [(1, 1, None)], batch_id=1).duplicate
            for changed in ([(99, 9, "changed")] * 5, [(99, 9, "changed")],
                            [(1, 1, "a value")]):
                with pytest.raises(ResendMismatchError):
                    send(eng, how, changed, 1)
            with pytest.raises(ResendMismatchError):
                eng.ingest("votes", [(99, 9, "changed")], batch_id=8)
            assert totals(eng) == [(1, 8)]


def test_a_record_compacted_before_prints_were_kept_is_a_logged_noop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A state file whose records an older sstore compacted has only the ids of those
    batches: a re-send of one cannot be compared, stays a no-op, and says so in the log."""
    monkeypatch.setattr(gc, "COMPACT_EVERY", 4)
    with program(tmp_path, "full") as eng:
        for batch_id in range(1, 9):
            send(eng, "ingest_and_run", [(batch_id, 1, None)], batch_id)
        eng.collect_garbage()
        eng.connection.execute("DELETE FROM sstore_sys.ingested_prints")  # as an older one left it
        with caplog.at_level("WARNING", logger="sstore"):
            assert eng.ingest("votes", [(99, 9, "changed")], batch_id=1).duplicate
        assert "cannot be compared with the rows first sent" in caplog.text
        assert totals(eng) == [(1, 8)]


def test_compacted_prints_cost_about_ten_bytes_a_batch(tmp_path: Path) -> None:
    """What keeping every border batch's count and fingerprint costs, measured in the state
    file's used blocks: a million compacted batches (a month of one batch every 2.6 s),
    checkpointed. Compacted in bigger passes than GC's 4,096 to keep the test short (DuckDB
    appends each pass to the same row groups either way)."""
    con = duckdb.connect(str(tmp_path / "prints.duckdb"))
    systables.create(con)
    con.execute("CHECKPOINT")
    used = "SELECT used_blocks * block_size FROM pragma_database_size()"
    before = con.execute(used).fetchall()[0][0]
    n, step = 1_000_000, 65_536
    for after in range(0, n, step):
        through = min(n, after + step)
        con.execute("INSERT INTO sstore_sys.commits (node, batch_id, n_rows, fingerprint) "
                    "SELECT 'trades', i, 250 + i % 7, (hash(i) // 2)::BIGINT "
                    "FROM range(?, ?) r(i)", [after + 1, through + 1])
        for sql, params in systables.compact_statements("trades", after, through):
            con.execute(sql, params)
    con.execute("CHECKPOINT")
    kept = con.execute("SELECT count(*), count(DISTINCT batch_id) FROM "
                       "sstore_sys.ingested_prints").fetchall()[0]
    assert kept == (n, n)
    assert con.execute("SELECT count(*) FROM sstore_sys.commits").fetchall()[0][0] == 0
    per_batch = (con.execute(used).fetchall()[0][0] - before) / n
    con.close()
    assert per_batch < 11, f"{per_batch:.1f} bytes per compacted border batch"
