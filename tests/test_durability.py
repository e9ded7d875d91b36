"""The two durability modes: full (a DuckDB file) and weak (memory + input log replay)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sstore import Engine, InputLogError
from sstore.inputlog import HEADER


def declare(engine: Engine) -> None:
    engine.stream("s", {"k": "INTEGER", "v": "BIGINT"})
    engine.execute("CREATE TABLE IF NOT EXISTS totals (k INTEGER PRIMARY KEY, v BIGINT)")

    @engine.procedure(input="s", output="changed")
    def accumulate(tx, batch):
        tx.execute("INSERT INTO totals SELECT k, sum(v) FROM batch GROUP BY k "
                   "ON CONFLICT (k) DO UPDATE SET v = totals.v + excluded.v")
        return tx.sql("SELECT DISTINCT k FROM batch")


def totals(engine: Engine) -> dict[int, int]:
    return {r["k"]: r["v"] for r in engine.query("SELECT k, v FROM totals").to_pylist()}


def weak(log: Path) -> Engine:
    engine = Engine(":memory:", input_log=str(log))
    declare(engine)
    return engine


def test_weak_mode_replays_inputs_and_oltp_after_a_restart(tmp_path: Path) -> None:
    log = tmp_path / "in.log"
    engine = weak(log)
    engine.ingest("s", [(1, 10), (2, 20)])
    engine.run_until_idle()
    with engine.transaction() as tx:
        tx.execute("UPDATE totals SET v = v * 100 WHERE k = ?", 1)
    engine.ingest("s", [(1, 1)])
    engine.ingest("s", [(3, 3)])  # ingested but not yet processed when the process ends
    expected_after_run = {1: 1001, 2: 20, 3: 3}
    del engine  # no close, no checkpoint: as if the process died
    engine = weak(log)
    assert engine.ingest("s", [(9, 9)], batch_id=3).duplicate  # the log knows batch 3
    engine.run_until_idle()
    assert totals(engine) == expected_after_run
    engine.close()


def test_weak_mode_checkpoint_then_more_input(tmp_path: Path) -> None:
    log = tmp_path / "in.log"
    engine = weak(log)
    for i in range(5):
        engine.ingest("s", [(i % 2, i)])
    engine.run_until_idle()
    snapshot = engine.checkpoint()
    assert Path(snapshot).exists() and log.stat().st_size == 0
    engine.ingest("s", [(0, 100)])
    engine.close()
    engine = weak(log)
    engine.run_until_idle()
    assert totals(engine) == {0: 0 + 2 + 4 + 100, 1: 1 + 3}
    assert engine.ingest("s", [(5, 5)]) == 7
    engine.close()


def test_torn_tail_is_cut_and_damage_elsewhere_is_an_error(tmp_path: Path) -> None:
    log = tmp_path / "in.log"
    engine = weak(log)
    engine.ingest("s", [(1, 1)])
    engine.ingest("s", [(1, 2)])
    engine.close()
    whole = log.read_bytes()
    log.write_bytes(whole + whole[:HEADER.size + 5])  # a torn third record
    engine = weak(log)
    engine.run_until_idle()
    assert totals(engine) == {1: 3}
    engine.close()
    assert log.read_bytes() == whole  # the torn tail was cut off
    damaged = bytearray(whole)
    damaged[HEADER.size + 2] ^= 0xFF  # corrupt the first of two records
    log.write_bytes(bytes(damaged))
    with pytest.raises(InputLogError, match="checksum"):
        weak(log).run_until_idle()


def test_full_mode_survives_a_restart_without_close(state_path: str) -> None:
    engine = Engine(state_path)
    declare(engine)
    engine.ingest("s", [(1, 5)])
    engine.run_until_idle()
    engine.ingest("s", [(1, 6)])
    del engine
    engine = Engine(state_path)
    declare(engine)
    engine.run_until_idle()
    assert totals(engine) == {1: 11}
    assert engine.status().durability == "full"
    engine.close()


def test_weak_and_full_modes_give_the_same_state(tmp_path: Path) -> None:
    full = Engine(str(tmp_path / "f.duckdb"))
    declare(full)
    weak_engine = weak(tmp_path / "w.log")
    for engine in (full, weak_engine):
        for i in range(20):
            engine.ingest("s", [(i % 3, i), (i % 5, -i)])
        engine.run_until_idle()
    assert totals(full) == totals(weak_engine)
