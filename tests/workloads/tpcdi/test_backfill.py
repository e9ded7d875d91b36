"""``migrators.backfill`` on its own (real PostgreSQL, no Spark): sealing, refusals, the one
transaction that replaces an interval, and which rows of other intervals it keeps."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from migrators.backfill import (
    Interval,
    IntervalNotSealed,
    IntervalOverlap,
    Slice,
    StagedRowsOutside,
    replace,
    seal,
    versions,
)

ROOT = Path(__file__).resolve().parents[3]
ROWS = pa.schema([("id", pa.int64()), ("b", pa.int32()), ("v", pa.string())])


def table(rows: list[tuple[int, int, str]]) -> pa.Table:
    return pa.table({n: [r[i] for r in rows] for i, n in enumerate(ROWS.names)}, schema=ROWS)


def contents(url: str) -> list[tuple]:
    with psycopg.connect(url) as con:
        return con.execute("SELECT id, b, v FROM w.t ORDER BY id").fetchall()


@pytest.fixture
def url(pg_url: str) -> str:
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE SCHEMA w")
        con.execute("CREATE TABLE w.t (id bigint PRIMARY KEY, b int NOT NULL, v text)")
        con.execute("INSERT INTO w.t VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 2, 'BAD'), "
                    "(5, 3, 'newer'), (6, 1, 'stale'), (8, 2, 'gone'), (9, 3, 'c')")
    return pg_url


def piece(batch: int) -> Slice:
    return Slice("w.t", Interval(f"batch {batch}", "b", batch, batch), key=("id",))


def test_an_interval_the_stream_has_not_sealed_is_refused_and_nothing_changes(url: str
                                                                              ) -> None:
    before = contents(url)
    with psycopg.connect(url) as con:
        assert seal(con, [piece(1), piece(2)]) == [1, 1]
    with pytest.raises(IntervalNotSealed, match="'batch 3' of w.t: the stream has not"):
        replace(url, [(piece(3), table([(9, 3, 'x')]))])
    # rows of another interval in the stage: refused inside the transaction
    with pytest.raises(StagedRowsOutside, match="1 rebuilt row"):
        replace(url, [(piece(2), table([(2, 2, 'ok'), (4, 1, 'wrong interval')]))])
    assert contents(url) == before
    with psycopg.connect(url) as con:
        assert [(v["interval"], v["version"], v["source"], v["rows"])
                for v in versions(con, "w.t")] == [("batch 1", 1, "stream", 2),
                                                   ("batch 2", 1, "stream", 3)]
        assert con.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE "
                           "'backfill_stage%'").fetchone()[0] == 0


def test_replace_swaps_the_interval_and_keeps_newer_rows_of_later_intervals(url: str) -> None:
    with psycopg.connect(url) as con:
        seal(con, [piece(2)])
    seen: list[list[tuple]] = []

    def look_from_outside(_con: psycopg.Connection) -> None:
        seen.append(contents(url))  # another session, while the swap is open

    staged = table([(2, 2, 'b'), (3, 2, 'fixed'), (5, 2, 'older than batch 3'),
                    (6, 2, 'batch 2 touched it'), (7, 2, 'lost by the stream')])
    [done] = replace(url, [(piece(2), staged)], before_commit=look_from_outside)
    assert seen == [[(1, 1, 'a'), (2, 2, 'b'), (3, 2, 'BAD'), (5, 3, 'newer'), (6, 1, 'stale'),
                     (8, 2, 'gone'), (9, 3, 'c')]]  # all old until COMMIT
    assert contents(url) == [(1, 1, 'a'), (2, 2, 'b'), (3, 2, 'fixed'), (5, 3, 'newer'),
                             (6, 2, 'batch 2 touched it'), (7, 2, 'lost by the stream'),
                             (9, 3, 'c')]
    assert (done.version, done.rows_before, done.rows_deleted, done.rows_inserted,
            done.rows_kept_newer, done.rows_after) == (2, 3, 3, 4, 1, 4)
    again = replace(url, [(piece(2), staged)])
    assert again[0].version == 3 and again[0].rows_after == 4
    with psycopg.connect(url) as con:
        [v] = versions(con, "w.t")
        assert (v["version"], v["source"], v["rows"]) == (3, "backfill", 4)
        assert con.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE "
                           "'backfill_stage%'").fetchone()[0] == 0


def test_a_failed_swap_changes_nothing(url: str) -> None:
    with psycopg.connect(url) as con:
        seal(con, [piece(2)])
    before = contents(url)

    def fail(_con: psycopg.Connection) -> None:
        raise RuntimeError("injected before COMMIT")

    with pytest.raises(RuntimeError, match="injected"):
        replace(url, [(piece(2), table([(3, 2, 'fixed')]))], before_commit=fail)
    assert contents(url) == before
    with psycopg.connect(url) as con:
        assert versions(con, "w.t")[0]["version"] == 1


def test_an_interval_is_a_closed_range() -> None:
    with pytest.raises(ValueError, match="below low"):
        Interval("backwards", "b", 3, 2)
    assert Interval("q3", "d", 20170701, 20170930).predicate() == \
        ('"d" BETWEEN %s AND %s', (20170701, 20170930))


def sstore(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sstore.cli", *args], capture_output=True,
                          check=False,
                          text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_cli_refuses_an_unsealed_batch_and_shows_the_versions(url: str,
                                                                  tmp_path: Path) -> None:
    with psycopg.connect(url) as con:
        seal(con, [piece(2)])
    refused = sstore("backfill", "run", "--input", str(tmp_path), "--batch", "2", "--schema",
                     "w", "--postgres", url)
    assert refused.returncode == 1
    assert "refusing to backfill Batch2 of w.dimtrade: the stream has not finished loading " \
           "it (the stream has delivered nothing to it)" in " ".join(refused.stderr.split())
    shown = sstore("backfill", "status", "--postgres", url, "--json")
    assert shown.returncode == 0, shown.stderr
    assert [(r["target"], r["interval"], r["version"], r["source"], r["rows"])
            for r in json.loads(shown.stdout)] == [("w.t", "batch 2", 1, "stream", 3)]
    table = sstore("backfill", "status", "--postgres", url, "--schema", "w")
    assert "w.t" in table.stdout and "batch 2" in table.stdout and "b 2..2" in table.stdout
    assert "sstore backfill run --input" in sstore("backfill", "--help").stdout


def test_a_date_range_and_a_batch_range_are_intervals_too(url: str) -> None:
    with psycopg.connect(url) as con:
        con.execute("CREATE TABLE w.e (id bigint, d date NOT NULL, v text)")
        con.execute("INSERT INTO w.e VALUES (1, '2017-06-30', 'june'), (2, '2017-07-01', 'x'), "
                    "(3, '2017-07-31', 'y'), (4, '2017-08-01', 'august')")
        con.commit()
        july = Slice("w.e", Interval("2017-07", "d", dt.date(2017, 7, 1), dt.date(2017, 7, 31)))
        batches = Slice("w.t", Interval("batches 2-3", "b", 2, 3), key=("id",))
        seal(con, [july, batches])
    rows = pa.table({"id": [5], "d": [dt.date(2017, 7, 15)], "v": ["rebuilt"]})
    [e, t] = replace(url, [(july, rows), (batches, table([(2, 3, 'b'), (9, 2, 'c')]))])
    with psycopg.connect(url) as con:
        assert con.execute("SELECT id, v FROM w.e ORDER BY id").fetchall() == [
            (1, "june"), (4, "august"), (5, "rebuilt")]
    assert contents(url) == [(1, 1, 'a'), (2, 3, 'b'), (6, 1, 'stale'), (9, 2, 'c')]
    assert (e.rows_deleted, e.rows_inserted, t.rows_deleted, t.rows_inserted) == (2, 1, 5, 2)
    assert (e.version, t.version) == (2, 2)


def test_an_overlapping_interval_with_other_bounds_is_refused_and_nothing_changes(
        url: str) -> None:
    """Seen: "batch 2" sealed, then "batches 2-3" backfilled: both versions claimed rows of
    batch 2, and neither said what they were."""
    with psycopg.connect(url) as con:
        seal(con, [piece(2), piece(3)])
    before = contents(url)
    wide = Slice("w.t", Interval("batches 2-3", "b", 2, 3), key=("id",))
    with pytest.raises(IntervalOverlap, match=r"'batches 2-3' of w.t \(b 2..3\): it overlaps "
                                              r"interval 'batch 2' \(b 2..2, version 1, stream\)"):
        replace(url, [(wide, table([(2, 2, 'b')]))])
    renamed = Slice("w.t", Interval("batch 2", "b", 2, 4), key=("id",))  # a name, new bounds
    with pytest.raises(IntervalOverlap, match="'batch 2' of w.t"):
        replace(url, [(renamed, table([(2, 2, 'b')]))])
    with psycopg.connect(url) as con, pytest.raises(IntervalOverlap):
        seal(con, [wide])
    assert contents(url) == before
    # exact intervals go on; so does one of another column (not comparable)
    assert replace(url, [(piece(2), table([(2, 2, 'b'), (3, 2, 'fixed')]))])[0].version == 2
    with psycopg.connect(url) as con:
        assert [(v["interval"], v["version"], v["column"], v["low"], v["high"])
                for v in versions(con, "w.t")] == [("batch 2", 2, "b", "2", "2"),
                                                   ("batch 3", 1, "b", "3", "3")]
    ids = Slice("w.t", Interval("ids 1-3", "id", 1, 3), sealed=False)
    [done] = replace(url, [(ids, table([(1, 1, 'a'), (2, 2, 'b'), (3, 2, 'fixed')]))])
    assert (done.version, done.rows_after) == (1, 3)


def test_rows_newer_than_the_rebuild_are_kept_whatever_the_interval(url: str) -> None:
    """A date-like interval the stream never seals: its rows of batches after the rebuild's
    source (batch 3 here) were written since; they stay, and no staged row doubles them."""
    ids = Slice("w.t", Interval("ids 2-5", "id", 2, 5), key=("id",), newer=("b", 2),
                sealed=False)
    [done] = replace(url, [(ids, table([(2, 2, 'b'), (3, 2, 'fixed'), (5, 2, 'rebuilt')]))])
    assert contents(url) == [(1, 1, 'a'), (2, 2, 'b'), (3, 2, 'fixed'), (5, 3, 'newer'),
                             (6, 1, 'stale'), (8, 2, 'gone'), (9, 3, 'c')]
    assert (done.rows_deleted, done.rows_inserted, done.rows_kept_newer) == (2, 2, 1)


def test_an_old_intervals_table_gets_its_bounds(pg_url: str) -> None:
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE SCHEMA sstore")
        con.execute("CREATE TABLE sstore.intervals (target TEXT NOT NULL, interval TEXT NOT "
                    "NULL, version INTEGER NOT NULL, source TEXT NOT NULL, rows BIGINT NOT "
                    "NULL, replaced_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY "
                    "(target, interval))")
        con.execute("INSERT INTO sstore.intervals VALUES ('w.t', 'batch 2', 2, 'backfill', 3)")
        con.execute("CREATE SCHEMA w")
        con.execute("CREATE TABLE w.t (id bigint PRIMARY KEY, b int NOT NULL, v text)")
        con.commit()
        assert seal(con, [piece(2)]) == [2]  # the version stays; the bounds are filled in
        [v] = versions(con, "w.t")
        assert (v["column"], v["low"], v["high"]) == ("b", "2", "2")


def test_migrate_reset_over_backfilled_intervals_is_refused(tmp_path: Path, pg_url: str
                                                            ) -> None:
    """Seen: `sstore migrate --reset` delivered the engine's batches again over a target
    whose interval a backfill had replaced: every row twice, exit 0."""
    from migrators import StreamToPostgres
    from sstore import Engine

    state = str(tmp_path / "s.duckdb")
    eng = Engine(state)
    eng.stream("out", {"id": "BIGINT"})
    for b in range(3):
        eng.ingest("out", [(i,) for i in range(b * 10, b * 10 + 10)])
    assert StreamToPostgres(eng, "out", pg_url, "s.out").run_once().rows == 30
    eng.close()
    first = Slice("s.out", Interval("ids 0-9", "id", 0, 9))
    with psycopg.connect(pg_url) as con:
        seal(con, [first])
    replace(pg_url, [(first, pa.table({"id": pa.array(range(10), pa.int64())}))])

    def count() -> tuple:
        with psycopg.connect(pg_url) as con:
            return con.execute("SELECT count(*), count(DISTINCT id) FROM s.out").fetchone()

    refused = sstore("migrate", state, "--stream", "out", "--postgres", pg_url, "--table",
                     "s.out", "--reset")
    assert refused.returncode == 1
    said = " ".join(refused.stderr.split())
    assert "refusing to reset the sink of s.out: it holds rows of versioned intervals " \
           "'ids 0-9' (version 2, backfill)" in said, said
    assert count() == (30, 30)
    # emptied on purpose: the reset goes on, the intervals go with the rows they counted
    with psycopg.connect(pg_url) as con:
        con.execute("TRUNCATE s.out")
    done = sstore("migrate", state, "--stream", "out", "--postgres", pg_url, "--table",
                  "s.out", "--reset")
    assert done.returncode == 0, done.stderr
    assert count() == (30, 30)
    with psycopg.connect(pg_url) as con:
        assert versions(con, "s.out") == []


def test_the_cli_takes_one_interval_and_says_what_is_wrong(tmp_path: Path) -> None:
    run = ("backfill", "run", "--input", str(tmp_path))
    for args, said in [
            ((), ("name the interval exactly one way: --batch N (repeatable), --batches "
                 "FIRST-LAST or --from-date D --to-date D")),
            (("--batch", "2", "--batches", "2-3"), "(got --batch and --batches)"),
            (("--batches", "2-3", "--from-date", "2017-07-07", "--to-date", "2017-07-08"),
             "(got --batches and --from-date/--to-date)"),
            (("--from-date", "2017-07-07"), ("a date range needs both --from-date and "
                                            "--to-date")),
            (("--from-date", "2017-07-08", "--to-date", "2017-07-07"),
             "2017-07-07 is before --from-date 2017-07-08"),
            (("--batches", "3-2"), ("batch range '3-2': batches are 1, 2, ... and FIRST must "
                                   "not exceed LAST")),
            (("--batches", "two"), "batch range 'two' is not FIRST-LAST")]:
        done = sstore(*run, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert said in " ".join(done.stderr.split()), (args, done.stderr)


def test_a_reset_during_a_swap_waits_for_it_and_is_refused(url: str) -> None:
    """``check_reset`` (``sstore migrate --reset``) while a backfill's swap records the first
    interval of the table: the reset used to see no interval (the swap had not committed),
    forget the watermarks, and let the sink deliver its batches again over the backfilled
    rows. It takes the target's lock as ``seal`` and ``replace`` do: it waits for the swap,
    then sees the interval and refuses."""
    import threading

    from migrators.backfill import ResetRefused, check_reset

    outcome: list[object] = []

    def reset() -> None:
        with psycopg.connect(url) as con:
            try:
                outcome.append(check_reset(con, "w.t"))
            except ResetRefused as exc:
                outcome.append(exc)

    waiting: list[bool] = []

    def during_the_swap(con: psycopg.Connection) -> None:
        resetter.start()
        resetter.join(timeout=3.0)  # long enough for an unlocked check to be done
        waiting.append(resetter.is_alive())

    resetter = threading.Thread(target=reset)
    ids = Slice("w.t", Interval("ids 2-5", "id", 2, 5), key=("id",), sealed=False)
    replace(url, [(ids, table([(2, 2, 'b'), (3, 2, 'fixed')]))], before_commit=during_the_swap)
    resetter.join(timeout=60)
    assert waiting == [True]
    assert len(outcome) == 1 and isinstance(outcome[0], ResetRefused), outcome
    with psycopg.connect(url) as con:
        assert [v["interval"] for v in versions(con, "w.t")] == ["ids 2-5"]
