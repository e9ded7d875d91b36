"""Checkpoints on the engine's terms (sstore.checkpoints): after a commit once the WAL reaches
its limit, when idle, never inside a transaction; and nothing is lost across them or without
them (the WAL replays)."""

from __future__ import annotations

import os
import threading
import time

from sstore import Engine


def keyed_state(engine: Engine) -> None:
    engine.stream("inp", {"k": "BIGINT", "v": "VARCHAR"})
    engine.execute("CREATE TABLE IF NOT EXISTS state (k BIGINT PRIMARY KEY, v VARCHAR, n BIGINT)")

    @engine.procedure(input="inp")
    def upsert(tx, batch):
        tx.execute("INSERT INTO state SELECT k, v, 1 FROM batch ON CONFLICT (k) DO UPDATE "
                   "SET n = state.n + 1, v = excluded.v")


def feed(engine: Engine, batches: int, rows: int = 5000) -> None:
    for b in range(batches):
        engine.ingest("inp", [(k % 20000, f"value {b} {k}" * 10) for k in range(b * rows,
                                                                               (b + 1) * rows)])
        engine.run_until_idle()


def totals(engine: Engine) -> list[dict]:
    return engine.query("SELECT count(*) AS keys, sum(n) AS n FROM state").to_pylist()


def test_duckdb_never_checkpoints_by_itself_and_the_wal_replays(state_path: str) -> None:
    engine = Engine(state_path, checkpoint_wal_bytes=1 << 40)
    keyed_state(engine)
    feed(engine, 20)
    rt = engine._runtime()
    assert rt.checkpoints is not None and rt.checkpoints.count == 0
    assert rt.checkpoints.wal_bytes() > 16 << 20  # past DuckDB's own 16 MiB threshold
    want = totals(engine)
    engine._con.close()  # as a crash would leave it: no checkpoint at close
    del engine, rt  # and gone, as with its process (one engine per state file and process)
    again = Engine(state_path)
    keyed_state(again)
    assert totals(again) == want == [{"keys": 20000, "n": 100000}]
    again.close()


def test_the_wal_is_checkpointed_after_a_commit_once_it_reaches_the_limit(state_path: str
                                                                         ) -> None:
    engine = Engine(state_path, checkpoint_wal_bytes=1 << 20)
    keyed_state(engine)
    feed(engine, 6)
    rt = engine._runtime()
    assert rt.checkpoints is not None and rt.checkpoints.count >= 2
    assert rt.checkpoints.wal_bytes() < 1 << 20  # checkpointed after the last commit too
    assert totals(engine) == [{"keys": 20000, "n": 30000}]
    engine.close()


def test_an_idle_engine_checkpoints(state_path: str) -> None:
    engine = Engine(state_path, checkpoint_wal_bytes=1 << 40)
    keyed_state(engine)
    rt = engine._runtime()
    assert rt.checkpoints is not None
    rt.checkpoints.idle_bytes = 1 << 20
    feed(engine, 2)
    assert rt.checkpoints.count == 0 and rt.checkpoints.wal_bytes() >= 1 << 20
    stop = threading.Event()
    server = threading.Thread(target=engine.run, args=(stop, 0.05))
    server.start()
    deadline = time.monotonic() + 10
    while rt.checkpoints.count == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    server.join()
    assert rt.checkpoints.count == 1 and rt.checkpoints.wal_bytes() < 1 << 20
    assert totals(engine) == [{"keys": 10000, "n": 10000}]
    engine.close()
    assert not os.path.exists(state_path + ".wal") or os.path.getsize(state_path + ".wal") < 1 << 20
