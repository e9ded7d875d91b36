"""A procedure that raises: no partial writes, a clear error, and the per-procedure policy."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest

from sstore import Engine, TransientError
from sstore.base.errors import DeclarationError
from sstore.storage.status import status_of_file


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
    with pytest.raises(duckdb.CatalogException, match="nonexistent"):
        engine.query("SELECT * FROM nonexistent")


# -- retries go through sstore.base.retry: transient by kind_of, a bounded number of times
# -----------
def test_a_lost_connection_is_transient_and_retried(engine: Engine) -> None:
    """``kind_of`` decides, not a list in the executor: ConnectionError is transient."""
    engine.stream("inp", {"x": "INTEGER"})
    calls = {"n": 0}

    @engine.procedure(input="inp", output="out", retries=2)
    def flaky(tx, batch):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise ConnectionError("connection reset by peer")
        return tx.sql("SELECT x FROM batch")

    engine.ingest("inp", [(1,)])
    assert engine.run_until_idle() == 1
    assert calls["n"] == 3 and engine.status().errors == []


def test_a_deterministic_failure_is_tried_once(engine: Engine) -> None:
    calls = chain(engine, fail_on={1})
    engine.ingest("inp", [(1,)])
    assert engine.run_until_idle() == 0
    assert calls["n"] == 1  # no retry: it would fail the same way


def test_transient_failures_beyond_the_retries_apply_the_policy(engine: Engine) -> None:
    calls = chain(engine, fail_on={1}, transient_failures=100)  # retries=3
    engine.ingest("inp", [(1,)])
    assert engine.run_until_idle() == 0
    assert calls["n"] == 4
    first = next(p for p in engine.status().procedures if p.name == "first")
    assert "gave up after 4 attempts: lock timeout" in first.halted


# -- timeouts ---------------------------------------------------------------------------------
def two_streams(engine: Engine, work, *, on_error: str = "halt", timeout: float = 0.5) -> None:
    """``slow`` runs ``work(tx)`` on batch 2 of ``a`` with a timeout; ``steady`` reads ``b``."""
    engine.stream("a", {"x": "INTEGER"})
    engine.stream("b", {"x": "INTEGER"})

    @engine.procedure(input="a", output="a_out", on_error=on_error, timeout=timeout)
    def slow(tx, batch):
        if tx.batch_id == 2:
            work(tx)
        return tx.sql("SELECT x FROM batch")

    @engine.procedure(input="b", output="b_out")
    def steady(tx, batch):
        return tx.sql("SELECT x * 2 AS x FROM batch")

    for x in (1, 2, 3):
        engine.ingest("a", [(x,)])
        engine.ingest("b", [(x,)])


def huge_cross_join(tx) -> None:
    tx.execute("SELECT count(*) FROM range(1000000) AS a, range(1000000) AS b")


def python_loop(tx) -> None:
    while True:
        pass


@pytest.mark.parametrize("work", [huge_cross_join, python_loop])
def test_a_procedure_past_its_timeout_halts_and_others_run_on(engine: Engine, work) -> None:
    two_streams(engine, work)
    began = time.monotonic()
    assert engine.run_until_idle() == 4  # slow@1, steady@1..3; slow halts at 2, 3 waits
    assert time.monotonic() - began < 5
    status = engine.status()
    procs = {p.name: p for p in status.procedures}
    assert procs["steady"].last_batch == 3 and procs["steady"].halted is None
    assert procs["slow"].last_batch == 1 and procs["slow"].pending == 2
    assert "batch 2: TimedOut: procedure 'slow' timed out after 0.5 s" in procs["slow"].halted
    assert [(e["procedure"], e["batch_id"], e["action"]) for e in status.errors] == \
        [("slow", 2, "halt")]


@pytest.mark.parametrize("work", [huge_cross_join, python_loop])
def test_a_timed_out_batch_goes_to_dead_letters_and_the_next_runs(engine: Engine, work) -> None:
    two_streams(engine, work, on_error="dead_letter", timeout=0.3)
    assert engine.run_until_idle() == 6
    assert engine.query("SELECT _batch_id, _error FROM a__dead_letter").to_pylist() == [
        {"_batch_id": 2, "_error": "TimedOut: procedure 'slow' timed out after 0.3 s on batch 2 "
                                   "(interrupted and rolled back)"}]
    procs = {p.name: p for p in engine.status().procedures}
    assert procs["slow"].last_batch == 3 and procs["slow"].halted is None
    assert engine.latest("a_out")[1].to_pylist() == [{"x": 3}]


def test_status_answers_while_a_procedure_loops(engine: Engine) -> None:
    """The engine's lock is held for at most the timeout: status does not wait forever."""
    two_streams(engine, python_loop, timeout=1.0)
    worker = threading.Thread(target=engine.run_until_idle)
    worker.start()
    time.sleep(0.3)
    began = time.monotonic()
    status = engine.status()
    assert time.monotonic() - began < 3
    assert {p.name for p in status.procedures} == {"slow", "steady"}
    worker.join(10)
    assert not worker.is_alive()
    assert {p.name: bool(p.halted) for p in engine.status().procedures} == \
        {"slow": True, "steady": False}


def test_a_timed_out_execution_never_commits_even_if_the_exception_is_swallowed(
        engine: Engine) -> None:
    engine.stream("a", {"x": "INTEGER"})
    engine.execute("CREATE TABLE written (x INTEGER)")

    @engine.procedure(input="a", timeout=0.3)
    def stubborn(tx, batch):
        tx.execute("INSERT INTO written SELECT x FROM batch")
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                while time.monotonic() < deadline:
                    pass
            except BaseException:  # noqa: BLE001, S110 - what a careless procedure might do
                pass

    engine.ingest("a", [(1,)])
    assert engine.run_until_idle() == 0
    assert engine.query("SELECT count(*) AS n FROM written").column("n")[0].as_py() == 0
    assert "timed out after 0.3 s" in engine.status().procedures[0].halted


def test_timeout_is_declared_and_kept_in_the_state_file(state_path: str) -> None:
    engine = Engine(state_path)
    two_streams(engine, python_loop, timeout=2.5)
    engine.close()
    again = Engine.open_existing(state_path)
    assert again.graph.procedures["slow"].timeout == 2.5
    assert again.graph.procedures["steady"].timeout is None
    again.close()
    bad = Engine(":memory:")
    bad.stream("a", {"x": "INTEGER"})
    with pytest.raises(DeclarationError, match="timeout must be a positive number"):
        bad.procedure(input="a", timeout=0)(lambda tx, batch: None)
    bad.close()


# -- halts outlive the process until resumed ----------------------------------------------------
def test_a_halt_survives_a_restart_until_resumed(state_path: str) -> None:
    engine = Engine(state_path)
    chain(engine, fail_on={2})
    for x in (1, 2, 3):
        engine.ingest("inp", [(x,)])
    engine.run_until_idle()
    engine.close()

    engine = Engine(state_path)
    chain(engine, fail_on=set())  # the fixed program: still halted until resumed
    assert engine.run_until_idle() == 0
    first = next(p for p in engine.status().procedures if p.name == "first")
    assert first.halted.startswith("batch 2: ValueError: cannot handle batch 2")
    assert outputs(engine) == [(1, 20)]
    assert engine.resume("first") is True
    assert engine.resume("first") is False  # nothing left to resume
    with pytest.raises(DeclarationError, match="no procedure or consumer 'nope'"):
        engine.resume("nope")
    assert engine.run_until_idle() == 4
    assert outputs(engine) == [(1, 20), (2, 30), (3, 40)]
    engine.close()
    assert all(p.halted is None for p in status_of_file(state_path).procedures)
