"""The sink's fast paths keep every promise of the slow ones.

A chunk's watermark is locked and advanced in one conditional UPDATE when it stands where the
sink planned from (``delivery.deliver(planned_rows=...)``); the next group of batches is read
in a helper thread while the current one is COPYed; the sink thread holds acknowledgements
back for ``ack_every``. Each test here is a way those shortcuts could lose or duplicate a row,
or hang: two sinks planning from the same watermark, updates of one key across read groups,
a sink moving batches while its thread holds the engine's lock, a flush that returns before
the engine was told.
"""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from migrators import StreamToPostgres, delivery, read_ahead
from sstore import Engine


def pg_rows(url: str, sql: str, *params: object) -> list[tuple]:
    with psycopg.connect(url) as con:
        return con.execute(sql, params).fetchall()


def out_engine(path: str, batches: int, rows_per_batch: int) -> Engine:
    eng = Engine(path)
    eng.stream("out", {"id": "BIGINT", "v": "INTEGER"})
    for b in range(batches):
        first = b * rows_per_batch
        eng.ingest("out", [(i, b) for i in range(first, first + rows_per_batch)])
    return eng


def test_a_second_sink_planning_from_a_stale_watermark_writes_nothing(state_path: str,
                                                                     pg_url: str) -> None:
    """Both sinks plan from watermark 0; the fast path of the second matches nothing (the
    watermark moved) and the full path finds the batches already there."""
    eng = out_engine(state_path, 4, 10)
    first = StreamToPostgres(eng, "out", pg_url, "s.out", chunk_rows=20)
    second = StreamToPostgres(eng, "out", pg_url, "s.out", chunk_rows=20)
    first.start()
    second.start()
    assert first.run_pending() == 40
    assert second.run_pending() == 0
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM s.out") == [(40, 40)]
    with psycopg.connect(pg_url) as con:
        key = first.sink_key
        assert delivery.read(con, key) == 4
        assert con.execute("SELECT rows_total FROM sstore.watermarks WHERE target = 's.out'"
                           ).fetchone() == (40,)
    eng.close()


def test_a_sink_racing_another_in_postgres_queues_and_writes_nothing_twice(
        state_path: str, pg_url: str) -> None:
    """The second sink's conditional UPDATE waits for the first one's row lock (taken by its
    own UPDATE, held until COMMIT), then matches nothing: exactly once, whatever the timing."""
    eng = out_engine(state_path, 2, 10)
    results: list[int] = []
    racer = StreamToPostgres(eng, "out", pg_url, "s.out")
    racer.start()

    def race(_con: psycopg.Connection) -> None:
        thread = threading.Thread(target=lambda: results.append(racer.run_pending()))
        thread.start()
        thread.join(timeout=0.5)  # the racer now waits for our watermark row (or is done)

    first = StreamToPostgres(eng, "out", pg_url, "s.out", before_commit=race)
    first.start()
    assert first.run_pending() == 20
    for _ in range(100):
        if results:
            break
        threading.Event().wait(0.1)
    assert results == [0]
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM s.out") == [(20, 20)]
    eng.close()


@pytest.mark.parametrize("mode", ["append", "merge"])
def test_batches_read_ahead_in_groups_arrive_once_and_in_order(
        state_path: str, pg_url: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small read groups (30 rows: several groups, read in the helper thread); in merge mode
    the same ids change in every batch, so the last batch's value must win across groups."""
    monkeypatch.setattr(read_ahead, "READ_AHEAD_ROWS", 30)
    eng = Engine(state_path)
    eng.stream("out", {"id": "BIGINT", "v": "INTEGER"})
    for b in range(20):
        ids = range(b * 10, b * 10 + 10) if mode == "append" else range(10)
        eng.ingest("out", [(i, b) for i in ids])
    sink = StreamToPostgres(eng, "out", pg_url, "out", mode=mode,
                            key=("id",) if mode == "merge" else (), chunk_rows=10)
    report = sink.run_once()
    assert report.chunks == 20 and report.watermark == 20
    if mode == "append":
        assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id), sum(v) FROM out") == [
            (200, 200, sum(b * 10 for b in range(20)))]
    else:
        assert pg_rows(pg_url, "SELECT count(*), min(v), max(v) FROM out") == [(10, 19, 19)]
    eng.close()


def test_a_sink_in_a_thread_holding_the_engine_lock_reads_in_that_thread(
        state_path: str, pg_url: str) -> None:
    """A foreground sink moves batches in the committing thread; a read handed to a helper
    thread would wait for a lock its caller holds. This must finish, not hang."""
    eng = out_engine(state_path, 6, 10)
    sink = StreamToPostgres(eng, "out", pg_url, "out", chunk_rows=10)
    sink.start()
    moved: list[int] = []
    runtime = eng.runtime
    assert runtime is not None

    def under_lock() -> None:
        with runtime.lock:
            moved.append(sink.run_pending())

    thread = threading.Thread(target=under_lock, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the sink waited for the engine lock its own thread holds"
    assert moved == [60]
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM out") == [(60, 60)]
    eng.close()


def test_held_back_acknowledgements_are_sent_by_flush(state_path: str, pg_url: str) -> None:
    """With ``ack_every`` long, the sink thread delivers each batch but tells the engine once;
    ``flush`` returns only when the engine has been told everything delivered."""
    eng = Engine(state_path)
    eng.stream("out", {"id": "BIGINT", "v": "INTEGER"})
    sink = StreamToPostgres(eng, "out", pg_url, "out", ack_every=3600.0)
    sink.attach()
    with psycopg.connect(pg_url, autocommit=True) as con:
        for b in range(1, 11):
            eng.ingest("out", [(b, b)])
            for _ in range(600):  # until PostgreSQL has the batch (the watermark says so)
                if delivery.read(con, sink.sink_key) == b:
                    break
                threading.Event().wait(0.05)
            assert delivery.read(con, sink.sink_key) == b
    acks = eng.query("SELECT count(*) AS n FROM sstore_sys.commits WHERE node = ?",
                     sink.consumer)["n"][0].as_py()
    assert eng.acknowledged(sink.consumer) < 10 and acks <= 2  # held back, not one per batch
    assert sink.flush(timeout=30)
    assert eng.acknowledged(sink.consumer) == 10
    sink.detach()
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM out") == [(10, 10)]
    eng.close()


def test_rows_out_of_batch_order_are_put_back_in_it() -> None:
    rows = pa.table({"_batch_id": pa.array([2, 1, 2, 1, 3], pa.int64()),
                     "x": pa.array([20, 10, 21, 11, 30])})
    ordered = read_ahead.in_batch_order(rows)
    assert ordered["_batch_id"].to_pylist() == [1, 1, 2, 2, 3]
    assert ordered["x"].to_pylist() == [10, 11, 20, 21, 30]  # stable within a batch


def test_groups_start_with_one_chunk_then_fill_up_to_the_read_ahead(
        tmp_path: Path) -> None:
    chunks = [read_ahead.Chunk(i, i, 8_000, 1) for i in range(1, 7)]
    assert [[c.first for c in g] for g in read_ahead.groups(chunks)] == [[1], [2, 3], [4, 5], [6]]


def test_a_sink_thread_takes_batches_from_its_subscription_and_the_engine_when_not_held(
        state_path: str, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches the subscription handed over are delivered from memory; batches committed
    before the sink attached, or past the memory bound, are read from the engine. Either way
    every row arrives once, in order, including empty batches and merged updates."""
    eng = out_engine(state_path, 3, 10)  # before attach: only the engine has them
    sink = StreamToPostgres(eng, "out", pg_url, "s.out", mode="merge", key=["id"],
                            chunk_rows=25)
    sink._recent.max_rows = 45  # room for a few batches, then the engine again
    sink.attach()
    assert sink.flush(timeout=30)
    for b in range(3, 12):
        rows = [] if b == 5 else [(i % 50, b) for i in range(b * 10, b * 10 + 10)]
        eng.ingest("out", pa.table({"id": pa.array([r[0] for r in rows], pa.int64()),
                                    "v": pa.array([r[1] for r in rows], pa.int32())}))
        if b % 3 == 0:
            assert sink.flush(timeout=30)
    assert sink.flush(timeout=30)
    sink.detach()
    want = {}
    for b in range(12):
        for i in ([] if b == 5 else range(b * 10, b * 10 + 10)):
            want[i if b < 3 else i % 50] = b
    got = dict(pg_rows(pg_url, "SELECT id, v FROM s.out"))
    assert got == want
    assert sink._recent.hits > 0 and sink._recent.misses > 0  # both paths were taken
    eng.close()


def test_a_catch_up_stopped_mid_plan_leaves_no_helper_and_resumes_exactly_once(
        state_path: str, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user hook that fails after the third chunk (as Ctrl-C would between two chunks) ends
    the catch-up while its reader has the next chunks read, converted and encoded: those are
    dropped, the helper thread ends, PostgreSQL has exactly the delivered chunks, and a second
    run delivers the rest once, rows that were prepared ahead included."""
    monkeypatch.setattr(read_ahead, "READ_AHEAD_ROWS", 30)
    eng = out_engine(state_path, 12, 10)
    delivered: list[int] = []

    def stop_after_three(done: object) -> None:
        delivered.append(done.last)  # type: ignore[attr-defined]
        if len(delivered) == 3:
            raise KeyboardInterrupt

    sink = StreamToPostgres(eng, "out", pg_url, "out", chunk_rows=10,
                            on_delivered=stop_after_three)
    with pytest.raises(KeyboardInterrupt):
        sink.run_once()
    assert not [t for t in threading.enumerate() if t.name.startswith("sstore-sink-read")]
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id), max(v) FROM out") == [
        (30, 30, 2)]
    again = StreamToPostgres(eng, "out", pg_url, "out", chunk_rows=10)
    report = again.run_once()
    assert report.rows == 90 and report.watermark == 12
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id), sum(v) FROM out") == [
        (120, 120, sum(b * 10 for b in range(12)))]
    eng.close()


def test_the_next_chunk_is_prepared_once_this_chunks_copy_is_sent(
        state_path: str, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader thread starts on chunk k+1 when chunk k's COPY stream is in the socket and
    PostgreSQL works on it, not as the COPY begins: its encoder holds the GIL, and started
    earlier it kept the delivering thread from sending (0.84-0.91x raw COPY at 10,000-row
    chunks, 1.03x once moved). Every chunk but the last kicks its successor, each time
    inside a COPY whose rows are all written, and every row arrives once."""
    from psycopg import pq

    from migrators import sink_target

    seen: list[tuple[pq.TransactionStatus, int]] = []
    real_copy = sink_target.copy_arrow

    def copy_arrow(cur: psycopg.Cursor, table: str, rows: pa.Table, payload: bytes | None = None,
                   sent: object = None) -> int:
        assert payload is not None and callable(sent)  # encoded ahead, kicked from in here

        def noted() -> None:
            seen.append((cur.connection.pgconn.transaction_status, rows.num_rows))
            sent()

        return real_copy(cur, table, rows, payload, noted)

    monkeypatch.setattr(sink_target, "copy_arrow", copy_arrow)
    kicks: list[int] = []
    real_kick = read_ahead.ReadAhead.kick

    def kick(self: read_ahead.ReadAhead) -> None:
        kicks.append(self._next)
        real_kick(self)

    monkeypatch.setattr(read_ahead.ReadAhead, "kick", kick)
    eng = out_engine(state_path, batches=6, rows_per_batch=50)
    report = StreamToPostgres(eng, "out", pg_url, "out", chunk_rows=100).run_once()
    assert report.chunks == 3 and report.rows == 300
    assert seen == [(pq.TransactionStatus.ACTIVE, 100)] * 3  # mid-COPY, all rows written
    assert kicks == [1, 2, 3]  # the last kick finds nothing left to prepare
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM out") == [(300, 300)]
    eng.close()
