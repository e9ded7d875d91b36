"""A procedure that raises: no partial writes, a clear error, and the per-procedure policy."""

from __future__ import annotations

import pytest

from sstore import Engine, TransientError
from sstore.status import status_of_file


def chain(engine: Engine, fail_on: set[int], on_error: str = "halt",
          transient_failures: int = 0) -> dict[str, int]:
    engine.stream("inp", {"x": "INTEGER"})
    engine.execute("CREATE TABLE IF NOT EXISTS seen (batch_id BIGINT, x INTEGER)")
    calls = {"n": 0}

    @engine.procedure(input="inp", output="mid", on_error=on_error, retries=3)
    def first(tx, batch):
        calls["n"] += 1
        tx.execute("INSERT INTO seen SELECT ?, x FROM batch", tx.batch_id)  # a state write
        if tx.batch_id in fail_on and not transient_failures:
            raise ValueError(f"cannot handle batch {tx.batch_id}")
        if tx.batch_id in fail_on and calls["n"] <= transient_failures:
            raise TransientError("lock timeout")
        return tx.sql("SELECT x + 1 AS x FROM batch")

    engine.execute("CREATE TABLE IF NOT EXISTS results (batch_id BIGINT, x INTEGER)")

    @engine.procedure(input="mid", output="out")
    def second(tx, batch):
        tx.execute("INSERT INTO results SELECT ?, x * 10 FROM batch", tx.batch_id)
        return tx.sql("SELECT x * 10 AS x FROM batch")

    return calls


def outputs(engine: Engine) -> list[tuple[int, int]]:
    """Everything ``second`` committed (its output stream keeps only the latest batch)."""
    return [(r["batch_id"], r["x"]) for r in
            engine.query("SELECT batch_id, x FROM results ORDER BY batch_id").to_pylist()]


def test_exception_rolls_back_everything_and_halts(state_path: str) -> None:
    engine = Engine(state_path)
    chain(engine, fail_on={2})
    for x in (1, 2, 3):
        engine.ingest("inp", [(x,)])
    ran = engine.run_until_idle()
    assert ran == 2  # first@1, second@1; first halts at 2, so 3 waits behind it
    assert engine.query("SELECT batch_id FROM seen").column("batch_id").to_pylist() == [1]
    status = engine.status()
    first = next(p for p in status.procedures if p.name == "first")
    assert first.last_batch == 1 and "batch 2" in first.halted and "cannot handle" in first.halted
    assert first.pending == 2
    assert status.errors[0]["procedure"] == "first" and status.errors[0]["batch_id"] == 2
    assert "ValueError: cannot handle batch 2" in status.errors[0]["error"]
    assert outputs(engine) == [(1, 20)]
    engine.close()
    # the error survives in the state file, readable without the program
    assert status_of_file(state_path).errors[0]["batch_id"] == 2


def test_halted_procedure_continues_after_fix_and_restart(state_path: str) -> None:
    engine = Engine(state_path)
    chain(engine, fail_on={2})
    for x in (1, 2, 3):
        engine.ingest("inp", [(x,)])
    engine.run_until_idle()
    engine.close()
    engine = Engine(state_path)
    chain(engine, fail_on=set())  # the fixed program
    assert engine.run_until_idle() == 4
    assert outputs(engine) == [(1, 20), (2, 30), (3, 40)]
    assert engine.query("SELECT count(*) AS n FROM seen").column("n")[0].as_py() == 3
    engine.close()


def test_dead_letter_keeps_the_batch_and_moves_on(engine: Engine) -> None:
    chain(engine, fail_on={2}, on_error="dead_letter")
    for x in (1, 2, 3):
        engine.ingest("inp", [(x,)])
    assert engine.run_until_idle() == 6
    assert outputs(engine) == [(1, 20), (3, 40)]
    dead = engine.query("SELECT _batch_id, _procedure, _error, x FROM inp__dead_letter"
                        ).to_pylist()
    assert dead == [{"_batch_id": 2, "_procedure": "first",
                     "_error": "ValueError: cannot handle batch 2", "x": 2}]
    assert engine.query("SELECT batch_id FROM seen ORDER BY 1").column(0).to_pylist() == [1, 3]
    assert [e["action"] for e in engine.status().errors] == ["dead_letter"]


def test_transient_errors_are_retried(engine: Engine) -> None:
    calls = chain(engine, fail_on={1}, transient_failures=2)
    engine.ingest("inp", [(5,)])
    assert engine.run_until_idle() == 2
    assert calls["n"] == 3
    assert outputs(engine) == [(1, 60)]
    assert engine.query("SELECT count(*) FROM seen").column(0)[0].as_py() == 1


def test_resume_retries_the_failed_batch(engine: Engine) -> None:
    failing = {2}
    chain(engine, fail_on=failing)
    for x in (1, 2):
        engine.ingest("inp", [(x,)])
    engine.run_until_idle()
    failing.clear()
    engine.resume("first")
    assert engine.run_until_idle() == 2
    assert outputs(engine) == [(1, 20), (2, 30)]


def test_bad_output_is_a_procedure_error(engine: Engine) -> None:
    engine.stream("inp", {"x": "INTEGER"})
    engine.stream("typed", {"x": "INTEGER"})

    @engine.procedure(input="inp", output="typed")
    def wrong(tx, batch):
        return tx.sql("SELECT 'abc' AS x")

    engine.ingest("inp", [(1,)])
    assert engine.run_until_idle() == 0
    assert "'abc' is not a valid int32" in engine.status().errors[0]["error"]
    with pytest.raises(Exception):
        engine.query("SELECT * FROM nonexistent")
