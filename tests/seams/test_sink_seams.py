"""Where the engine meets its sinks: identity, gaps, holds, widened targets, halting sinks.

Each test is a mistake a real user makes (rebuild a state file, drop the target, start a
consumer late, pass a wrong table name, widen a column) and checks that no row is lost
silently: either every row arrives exactly once, or the user gets a clear error and nothing
is acknowledged to the engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from migrators import MigrationError, StreamToPostgres
from migrators.errors import TargetClaimedError
from sstore import Engine
from sstore.base.errors import DeclarationError, GapError


def pg_rows(url: str, sql: str, *params: object) -> list[tuple]:
    with psycopg.connect(url) as con:
        return con.execute(sql, params).fetchall()


def out_engine(path: str, batches: int, rows_per_batch: int, start: int = 0,
               consumer: str | None = None) -> Engine:
    """A border stream ``out`` with ``batches`` batches of consecutive ids (and ``consumer``
    declared with the dataflow)."""
    eng = Engine(path)
    eng.stream("out", {"id": "BIGINT"})
    if consumer is not None:
        eng.consumer("out", consumer)
    for b in range(batches):
        first = start + b * rows_per_batch
        eng.ingest("out", [(i,) for i in range(first, first + rows_per_batch)])
    return eng


def sstore_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-m", "sstore.cli", *args], check=False,
                          capture_output=True,
                          text=True, env=env, timeout=120)


# -- 1. watermarks know which engine they came from -------------------------------------------
def test_engines_have_their_own_identity(tmp_path: Path) -> None:
    first = Engine(str(tmp_path / "a.duckdb"))
    again_id = first.engine_id
    first.close()
    with Engine(str(tmp_path / "a.duckdb")) as same, Engine(str(tmp_path / "b.duckdb")) as other:
        assert same.engine_id == again_id
        assert other.engine_id != again_id
    weak = Engine(":memory:", input_log=str(tmp_path / "in.log"))
    weak.stream("s", {"x": "INTEGER"})
    weak.ingest("s", [(1,)])
    weak_id = weak.engine_id
    weak.close()
    replayed = Engine(":memory:", input_log=str(tmp_path / "in.log"))
    assert replayed.engine_id == weak_id  # a replayed state is the same engine
    replayed.stream("s", {"x": "INTEGER"})
    replayed.checkpoint()  # the log starts over; the snapshot carries the identity
    replayed.close()
    assert Engine(":memory:", input_log=str(tmp_path / "in.log")).engine_id == weak_id
    assert Engine(":memory:", input_log=str(tmp_path / "fresh.log")).engine_id != weak_id


def test_a_rebuilt_state_file_is_not_taken_for_the_old_one(tmp_path: Path,
                                                           pg_url: str) -> None:
    """Seen: "Moved 0 rows ... watermark at batch 20", batch 20 acknowledged to the new
    engine, GC deleted 1,500 rows that never reached PostgreSQL."""
    old = out_engine(str(tmp_path / "old.duckdb"), 20, 75)
    assert StreamToPostgres(old, "out", pg_url, "s.out").run_once().rows == 1500
    old.close()
    new = out_engine(str(tmp_path / "new.duckdb"), 20, 75, start=10_000,
                     consumer="migrator:s.out")
    sink = StreamToPostgres(new, "out", pg_url, "s.out")
    with pytest.raises(TargetClaimedError, match="another source"):
        sink.run_once()
    assert new.acknowledged(sink.consumer) == 0  # nothing was taken for delivered
    new.collect_garbage()
    assert new.query("SELECT count(*) FROM out").column(0)[0].as_py() == 1500  # all kept
    # the user empties the target on purpose and resets the sink: every row arrives once
    with psycopg.connect(pg_url) as con:
        con.execute("TRUNCATE s.out")
    new.close()
    done = sstore_cli("migrate", str(tmp_path / "new.duckdb"), "--stream", "out",
                      "--postgres", pg_url, "--table", "s.out", "--reset")
    assert done.returncode == 0, done.stderr
    assert "Moved 1,500 rows" in done.stdout
    assert pg_rows(pg_url, "SELECT count(*), min(id), count(DISTINCT id) FROM s.out") == \
        [(1500, 10_000, 1500)]


def test_a_target_schema_dropped_by_hand_is_loaded_again_from_a_new_state_file(
        tmp_path: Path, pg_url: str) -> None:
    """Seen: the watermark outlived the dropped schema; the next state file's first batches
    were skipped (3,000 rows in, 2,000 loaded, exit 0)."""
    old = out_engine(str(tmp_path / "old.duckdb"), 2, 1000)
    StreamToPostgres(old, "out", pg_url, "s.out").run_once()
    old.close()
    with psycopg.connect(pg_url) as con:
        con.execute("DROP SCHEMA s CASCADE")  # the user's usual "reset"
    new = out_engine(str(tmp_path / "new.duckdb"), 3, 1000)
    assert StreamToPostgres(new, "out", pg_url, "s.out").run_once().rows == 3000
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM s.out") == [(3000, 3000)]
    new.close()


def test_a_target_dropped_while_the_engine_still_has_its_batches_is_refilled(
        state_path: str, pg_url: str) -> None:
    eng = out_engine(state_path, 3, 10)
    sink = StreamToPostgres(eng, "out", pg_url, "s.out")
    sink.run_once()
    assert eng.acknowledged(sink.consumer) == 3
    with psycopg.connect(pg_url) as con:
        con.execute("DROP TABLE s.out")
    eng.ingest("out", [(100,)])
    # GC has not run: batches 1-3 are still in the engine, so the target gets them again
    assert StreamToPostgres(eng, "out", pg_url, "s.out").run_once().rows == 31
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM s.out") == [(31, 31)]
    eng.close()


def test_a_target_dropped_after_its_batches_were_collected_is_a_loud_gap(
        state_path: str, pg_url: str) -> None:
    eng = out_engine(state_path, 3, 10)
    StreamToPostgres(eng, "out", pg_url, "s.out").run_once()
    eng.collect_garbage()  # batches 1-3 were acknowledged: collected
    assert eng.collected_through("out") == 3
    with psycopg.connect(pg_url) as con:
        con.execute("DROP TABLE s.out")
    eng.ingest("out", [(100,)])
    sink = StreamToPostgres(eng, "out", pg_url, "s.out")
    with pytest.raises(GapError, match=r"batches 1\.\.3 of stream 'out'"):
        sink.run_once()
    assert pg_rows(pg_url, "SELECT count(*) FROM s.out") == [(0,)]  # nothing half-loaded
    report = StreamToPostgres(eng, "out", pg_url, "s.out", accept_gap=True).run_once()
    assert report.rows == 1  # batch 4: what the engine still has
    gaps = eng.consumers()[0].gaps
    assert [(g["first_batch"], g["last_batch"]) for g in gaps] == [(1, 3)]
    eng.close()


@pytest.mark.parametrize("running", [False, True], ids=["new sink", "running sink"])
def test_a_target_truncated_while_the_engine_still_has_its_batches_is_refilled(
        state_path: str, pg_url: str, running: bool) -> None:
    """TRUNCATE keeps the table (same OID), so the watermark used to go on past batches the
    table no longer had: every row of batches 1-3 missing, exit 0. An emptied target whose
    watermark counts delivered rows now starts over, as a dropped one does."""
    eng = out_engine(state_path, 3, 10)
    sink = StreamToPostgres(eng, "out", pg_url, "s.out")
    sink.run_once()
    with psycopg.connect(pg_url) as con:
        con.execute("TRUNCATE s.out")
    eng.ingest("out", [(100,)])
    again = sink if running else StreamToPostgres(eng, "out", pg_url, "s.out")
    if running:  # the sink that delivered 1-3 goes on from its plan: the fast path sees it
        again.run_pending()
    else:
        again.run_once()
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM s.out") == [(31, 31)]
    eng.close()


def test_a_target_truncated_after_its_batches_were_collected_is_a_loud_gap(
        state_path: str, pg_url: str) -> None:
    eng = out_engine(state_path, 3, 10)
    StreamToPostgres(eng, "out", pg_url, "s.out").run_once()
    eng.collect_garbage()
    with psycopg.connect(pg_url) as con:
        con.execute("TRUNCATE s.out")
    eng.ingest("out", [(100,)])
    with pytest.raises(GapError, match=r"batches 1\.\.3 of stream 'out'"):
        StreamToPostgres(eng, "out", pg_url, "s.out").run_once()
    assert pg_rows(pg_url, "SELECT count(*) FROM s.out") == [(0,)]
    eng.close()


def test_a_drained_target_is_not_taken_for_a_truncated_one(state_path: str,
                                                            pg_url: str) -> None:
    """A staging table another process empties on purpose: ``drained_target=True`` goes on
    after the watermark (nothing delivered twice into it)."""
    eng = out_engine(state_path, 3, 10)
    sink = StreamToPostgres(eng, "out", pg_url, "s.out", drained_target=True)
    sink.run_once()
    with psycopg.connect(pg_url) as con:
        con.execute("DELETE FROM s.out")  # the downstream process took its rows
    eng.ingest("out", [(100,)])
    sink.run_once()
    assert pg_rows(pg_url, "SELECT id FROM s.out") == [(100,)]
    eng.close()


def test_two_sources_feed_one_table_only_on_purpose(tmp_path: Path, pg_url: str) -> None:
    a = out_engine(str(tmp_path / "a.duckdb"), 2, 10)
    b = out_engine(str(tmp_path / "b.duckdb"), 2, 10, start=1000)
    StreamToPostgres(a, "out", pg_url, "s.out").run_once()
    assert StreamToPostgres(b, "out", pg_url, "s.out", shared_target=True).run_once().rows == 20
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM s.out") == [(40, 40)]
    a.close()
    b.close()


# -- 2. GC before the first consumer ---------------------------------------------------------
def voter_like(path: str, retain: str = "latest") -> Engine:
    eng = Engine(path, gc_every=8)
    eng.stream("raw", {"x": "BIGINT"})
    eng.stream("out", {"x": "BIGINT"}, retain=retain)

    @eng.procedure(input="raw", output="out")
    def copy(tx, batch):
        return tx.sql("SELECT x FROM batch")

    return eng


def feed(eng: Engine, batches: int, start: int = 0) -> None:
    for b in range(start, start + batches):
        eng.ingest("raw", [(b * 10 + i,) for i in range(10)])
        eng.run_until_idle()


def test_a_late_consumer_fails_with_the_missing_range(tmp_path: Path, pg_url: str) -> None:
    """Seen: 255 batches collected before any migration existed; a later ``sstore migrate``
    reported "Moved 22,500 rows in 45 batches", watermark 0, no warning."""
    state = str(tmp_path / "state.duckdb")
    eng = voter_like(state)
    feed(eng, 30)
    collected = eng.collected_through("out")
    assert collected >= 20  # GC ran every 8 batches and kept only the latest one
    eng.close()
    refused = sstore_cli("migrate", state, "--stream", "out", "--postgres", pg_url,
                         "--table", "s.out")
    assert refused.returncode == 1
    assert f"would start after a gap: batches 1..{collected} of stream 'out'" in refused.stderr
    assert pg_rows(pg_url, "SELECT count(*) FROM s.out") == [(0,)]  # nothing was loaded
    accepted = sstore_cli("migrate", state, "--stream", "out", "--postgres", pg_url,
                          "--table", "s.out", "--accept-gap", "--json")
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["rows"] == (30 - collected) * 10  # what was left
    status = json.loads(sstore_cli("status", state, "--json").stdout)
    [consumer] = status["consumers"]
    assert consumer["consumer"] == "migrator:s.out" and consumer["acknowledged"] == 30
    assert (consumer["gaps"][0]["first_batch"], consumer["gaps"][0]["last_batch"]) == \
        (1, collected)
    text = sstore_cli("status", state).stdout
    assert "migrator:s.out" in text and f"1..{collected}" in text


def test_a_consumer_declared_with_the_dataflow_gets_every_batch(tmp_path: Path,
                                                                pg_url: str) -> None:
    eng = voter_like(str(tmp_path / "state.duckdb"))
    sink = StreamToPostgres(eng, "out", pg_url, "s.out")  # declared before the engine starts
    feed(eng, 30)
    eng.collect_garbage()
    assert eng.query("SELECT count(*) FROM out").column(0)[0].as_py() == 300  # all kept
    assert sink.run_once().rows == 300
    feed(eng, 2, start=30)
    eng.collect_garbage()
    assert eng.query("SELECT count(*) FROM out").column(0)[0].as_py() == 20  # acked: gone
    eng.close()
    again = voter_like(str(tmp_path / "state.duckdb"))  # the hold lasts across restarts
    feed(again, 5, start=32)
    again.collect_garbage()
    assert again.query("SELECT count(*) FROM out").column(0)[0].as_py() == 70
    assert StreamToPostgres(again, "out", pg_url, "s.out").run_once().rows == 70
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT x) FROM s.out") == [(370, 370)]
    again.close()


def test_retain_all_keeps_batches_for_a_consumer_declared_later(tmp_path: Path,
                                                                pg_url: str) -> None:
    eng = voter_like(str(tmp_path / "state.duckdb"), retain="all")
    feed(eng, 30)
    eng.collect_garbage()
    assert StreamToPostgres(eng, "out", pg_url, "s.out").run_once().rows == 300
    eng.close()


# -- 3. holds do not leak ----------------------------------------------------------------------
def test_a_failed_start_leaves_no_hold(tmp_path: Path, pg_url: str) -> None:
    state = str(tmp_path / "state.duckdb")
    out_engine(state, 3, 10).close()
    # the unreachable server is tried twice (one retry), not the default 8 times (16 s)
    bad = [("--table", "a.b.c"), ("--mode", "merge", "--key", "nope", "--table", "s.t"),
           ("--table", "s.t", "--postgres", "postgresql://postgres@127.0.0.1:1/x",
            "--attempts", "2")]
    for args in bad:
        full = ["migrate", state, "--stream", "out", "--postgres", pg_url, *args]
        result = sstore_cli(*full)
        assert result.returncode == 1, (args, result.stdout)
        assert "Error:" in result.stderr and "Traceback" not in result.stderr
    listed = sstore_cli("consumers", "list", state, "--json")
    assert json.loads(listed.stdout) == []
    with Engine.open_existing(state) as eng:
        assert eng.consumers() == []


def test_holds_are_listed_and_can_be_dropped(tmp_path: Path, pg_url: str) -> None:
    state = str(tmp_path / "state.duckdb")
    eng = voter_like(state)
    StreamToPostgres(eng, "out", pg_url, "s.out")
    feed(eng, 20)
    eng.collect_garbage()
    eng.close()
    listed = json.loads(sstore_cli("consumers", "list", state, "--json").stdout)
    assert listed == [{"stream": "out", "consumer": "migrator:s.out", "acknowledged": 0,
                       "pending_batches": 20, "pending_from": 1, "gaps": [],
                       "halted": None}]
    assert "migrator:s.out" in sstore_cli("consumers", "list", state).stdout
    unknown = sstore_cli("consumers", "drop", state, "migrator:nope")
    assert unknown.returncode == 1 and "consumers: migrator:s.out" in unknown.stderr
    dropped = sstore_cli("consumers", "drop", state, "migrator:s.out")
    assert dropped.returncode == 0, dropped.stderr
    again = voter_like(state)
    feed(again, 1)
    again.collect_garbage()
    assert again.query("SELECT count(*) FROM out").column(0)[0].as_py() == 10  # latest only
    again.close()


def test_bad_target_names_fail_before_the_engine_is_touched(engine: Engine, pg_url: str) -> None:
    engine.stream("out", {"id": "BIGINT"})
    for name in ("a.b.c", "", ".t", "s."):
        with pytest.raises(DeclarationError, match="SCHEMA.TABLE"):
            StreamToPostgres(engine, "out", pg_url, name)
    assert engine.consumers() == []


# -- 8. deterministic failures are not retried forever ------------------------------------------
def test_a_widened_target_column_takes_the_rows(state_path: str, pg_url: str) -> None:
    """Seen: bigint/numeric targets passed the check, then binary COPY failed ("insufficient
    data left in message") and was retried as transient, forever."""
    eng = Engine(state_path)
    eng.stream("out", {"n": "INTEGER", "small": "SMALLINT", "price": "DECIMAL(10,2)",
                       "f": "FLOAT"})
    eng.ingest("out", [(1, 2, "3.25", 0.5), (None, None, None, None)])
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE wide (n BIGINT, small NUMERIC(12,3), price NUMERIC(14,4), "
                    "f DOUBLE PRECISION)")
    assert StreamToPostgres(eng, "out", pg_url, "wide").run_once().rows == 2
    assert pg_rows(pg_url, "SELECT n, small::text, price::text, f FROM wide WHERE n = 1") == \
        [(1, "2.000", "3.2500", 0.5)]
    eng.close()


def test_a_sink_with_a_terminal_error_halts_and_says_so(state_path: str, pg_url: str) -> None:
    eng = Engine(state_path)
    eng.stream("out", {"id": "BIGINT"})
    sink = StreamToPostgres(eng, "out", pg_url, "s.out")
    sink.attach()
    eng.ingest("out", [(1,)])
    assert sink.flush(timeout=30)
    with psycopg.connect(pg_url) as con:  # someone makes the target unable to take rows
        con.execute("ALTER TABLE s.out ADD CONSTRAINT small CHECK (id < 100)")
    eng.ingest("out", [(500,)])
    with pytest.raises(MigrationError, match="halted.*small"):
        sink.flush(timeout=30)
    assert sink.halted and "check constraint" in sink.halted
    status = eng.status()
    assert status.errors[0]["procedure"] == "migrator:s.out"
    assert status.errors[0]["action"] == "halt"
    assert status.consumers[0].halted and "check constraint" in status.consumers[0].halted
    assert eng.query("SELECT count(*) FROM out WHERE id = 500").column(0)[0].as_py() == 1
    sink.detach()
    eng.close()
    # halted stays halted across restarts until resumed; then the batch arrives once
    with Engine.open_existing(state_path) as again:
        with pytest.raises(MigrationError, match="is halted since batch 1"):
            StreamToPostgres(again, "out", pg_url, "s.out").run_once()
    with psycopg.connect(pg_url) as con:
        con.execute("ALTER TABLE s.out DROP CONSTRAINT small")
    resumed = sstore_cli("resume", state_path, "migrator:s.out")
    assert resumed.returncode == 0, resumed.stderr
    with Engine.open_existing(state_path) as again:
        assert StreamToPostgres(again, "out", pg_url, "s.out").run_once().rows == 1
    assert pg_rows(pg_url, "SELECT id FROM s.out ORDER BY id") == [(1,), (500,)]


# -- 9. `--reset` re-delivers, never appends the same batches twice ---------------------------
def delivered_then_one_row_deleted(tmp_path: Path, pg_url: str, mode: str = "append"
                                   ) -> str:
    """A state file whose 9 batches of one row each went into ``s.out`` (``mode``; merge by
    ``id``), after which a user deleted one row by hand."""
    state = str(tmp_path / "s.duckdb")
    eng = out_engine(state, 9, 1)
    key = ("id",) if mode == "merge" else ()
    assert StreamToPostgres(eng, "out", pg_url, "s.out", mode, key).run_once().rows == 9
    eng.close()
    with psycopg.connect(pg_url) as con:
        con.execute("DELETE FROM s.out WHERE id = 4")
    return state


def test_migrate_reset_onto_an_append_target_with_rows_is_refused(tmp_path: Path,
                                                                  pg_url: str) -> None:
    """Seen following docs/migrators.md ("re-deliver with `sstore migrate --reset`") after
    deleting 1 of 9 rows: every batch appended again, 17 rows, 9 distinct, exit 0. Refused,
    nothing forgotten; the way the error gives (TRUNCATE, then --reset) loads each row once."""
    state = delivered_then_one_row_deleted(tmp_path, pg_url)
    refused = sstore_cli("migrate", state, "--stream", "out", "--postgres", pg_url, "--table",
                         "s.out", "--reset")
    assert refused.returncode == 1, refused.stdout
    said = " ".join(refused.stderr.split())
    assert "refusing to reset the sink of s.out: it holds 8 row(s)" in said, said
    assert "TRUNCATE s.out" in said and "--mode merge" in said, said
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM s.out") == [(8, 8)]
    assert pg_rows(pg_url, "SELECT batch_id FROM sstore.watermarks") == [(9,)]
    again = sstore_cli("migrate", state, "--stream", "out", "--postgres", pg_url, "--table",
                       "s.out")
    assert again.returncode == 0, again.stderr
    assert "Moved 0 rows" in again.stdout  # the watermark was kept: nothing appended
    with psycopg.connect(pg_url) as con:
        con.execute("TRUNCATE s.out")
    done = sstore_cli("migrate", state, "--stream", "out", "--postgres", pg_url, "--table",
                      "s.out", "--reset")
    assert done.returncode == 0, done.stderr
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM s.out") == [(9, 9)]


def test_migrate_reset_merging_by_key_puts_the_deleted_row_back_once(tmp_path: Path,
                                                                     pg_url: str) -> None:
    state = delivered_then_one_row_deleted(tmp_path, pg_url, "merge")
    done = sstore_cli("migrate", state, "--stream", "out", "--postgres", pg_url, "--table",
                      "s.out", "--mode", "merge", "--key", "id", "--reset")
    assert done.returncode == 0, done.stderr
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM s.out") == [(9, 9)]


def test_migrate_reset_merging_by_a_key_the_target_cannot_merge_on_is_refused(
        tmp_path: Path, pg_url: str) -> None:
    """A merge into a table without a unique key on its columns fails at the first delivery:
    had the reset been committed before, the next plain run (append, watermark 0) appended
    every batch again. Refused before anything is forgotten."""
    state = delivered_then_one_row_deleted(tmp_path, pg_url)  # appended: no primary key
    refused = sstore_cli("migrate", state, "--stream", "out", "--postgres", pg_url, "--table",
                         "s.out", "--mode", "merge", "--key", "id", "--reset")
    assert refused.returncode == 1, refused.stdout
    said = " ".join(refused.stderr.split())
    assert "has no primary key or unique constraint on (id)" in said, said
    assert pg_rows(pg_url, "SELECT batch_id FROM sstore.watermarks") == [(9,)]
    assert pg_rows(pg_url, "SELECT count(*) FROM s.out") == [(8,)]


def test_the_python_reset_refuses_as_the_cli_does(tmp_path: Path, pg_url: str) -> None:
    from migrators import ResetRefused

    state = delivered_then_one_row_deleted(tmp_path, pg_url)
    with Engine.open_existing(state) as eng:
        sink = StreamToPostgres(eng, "out", pg_url, "s.out")
        with pytest.raises(ResetRefused, match="it holds 8 row"):
            sink.reset()
        assert eng.acknowledged(sink.consumer) == 9  # not rewound
        with psycopg.connect(pg_url) as con:
            con.execute("TRUNCATE s.out")
        assert sink.reset() == 1
        assert sink.run_once().rows == 9
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM s.out") == [(9, 9)]
