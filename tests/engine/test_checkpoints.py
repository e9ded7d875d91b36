"""Checkpoints on the engine's terms (sstore.storage.checkpoints): after a commit once the WAL
reaches its limit, when idle, never inside a transaction; and nothing is lost across them or without
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


def test_ad_hoc_transactions_execute_and_loads_checkpoint_too(state_path: str) -> None:
    """Issue 34, item 8: with DuckDB's own checkpoint off, only the engine checkpoints; it did
    so after ingests and TEs only, so 300 ad hoc transactions grew the WAL to 73 MiB. Every
    commit under the engine's lock now asks the same question (``Checkpoints.after_commit``)."""
    import pyarrow as pa

    engine = Engine(state_path, checkpoint_wal_bytes=1 << 20)
    keyed_state(engine)
    engine.execute("CREATE TABLE IF NOT EXISTS notes (k BIGINT, v VARCHAR)")
    rt = engine._runtime()
    assert rt.checkpoints is not None
    wal = state_path + ".wal"
    text = "x" * 2000

    def on_disk() -> int:
        return os.path.getsize(wal) if os.path.exists(wal) else 0

    for i in range(300):
        with engine.transaction() as tx:
            tx.execute("INSERT INTO notes SELECT range, ? FROM range(?, ? + 100)", text, i * 100,
                       i * 100)
    assert on_disk() < 2 << 20, f"WAL of {on_disk()} bytes after 300 ad hoc transactions"
    for i in range(100):
        engine.execute(f"INSERT INTO notes SELECT range, '{text}' FROM range({i} * 100, "
                       f"{i} * 100 + 100)")
    assert on_disk() < 2 << 20, f"WAL of {on_disk()} bytes after 100 execute calls"
    rows = pa.table({"k": list(range(1000)), "v": [text] * 1000})
    for _ in range(20):
        engine.load_table("replica", rows, mode="append")
    assert on_disk() < 2 << 20, f"WAL of {on_disk()} bytes after 20 table loads"
    assert rt.checkpoints.count >= 3
    assert engine.query("SELECT count(*) AS n FROM notes").to_pylist() == [{"n": 40000}]
    assert engine.query("SELECT count(*) AS n FROM replica").to_pylist() == [{"n": 20000}]
    engine.close()
