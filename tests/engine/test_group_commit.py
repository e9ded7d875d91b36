"""Group commit (sstore.execution.group): the TEs of one batch commit as one DuckDB transaction,
and every TE keeps its own guarantees: all or nothing, order, error policies, exactly once."""

from __future__ import annotations

import duckdb
import pytest

from sstore import Engine, TransientError
from sstore.execution.runtime import CommitEvent


def three_steps(engine: Engine, fail: dict[tuple[str, int], str] | None = None,
                calls: dict[str, int] | None = None, on_error: str = "halt",
                declare: bool = True) -> None:
    """inp -> a -> s1 -> b -> s2 -> c -> out; each step also writes a state table.

    ``fail[(procedure, batch)]``: "terminal" raises ValueError, "transient" raises
    TransientError once, "swallowed" runs a failing statement and catches its error.
    ``declare=False`` leaves s1, s2 and out undeclared (created from their first batch)."""
    fail = fail if fail is not None else {}
    calls = calls if calls is not None else {}
    for stream in ("inp", "s1", "s2", "out") if declare else ("inp",):
        engine.stream(stream, {"x": "INTEGER"})
    engine.execute("CREATE TABLE IF NOT EXISTS log (step VARCHAR, batch_id BIGINT, x INTEGER)")

    def step(name: str, source: str, target: str, factor: int) -> None:
        @engine.procedure(input=source, output=target, name=name, on_error=on_error)
        def run(tx, batch):
            calls[name] = calls.get(name, 0) + 1
            tx.execute("INSERT INTO log SELECT ?, ?, x FROM batch", name, tx.batch_id)
            how = fail.get((name, tx.batch_id))
            if how == "terminal":
                raise ValueError(f"{name} cannot do batch {tx.batch_id}")
            if how == "transient" and calls[name] == 1:
                raise TransientError("busy")
            if how == "swallowed":
                try:
                    tx.execute("SELECT 1 / 0 > 1 FROM no_such_table")
                except duckdb.Error:
                    pass  # the procedure hides it; DuckDB aborted the transaction anyway
            return tx.sql(f"SELECT x * {factor} AS x FROM batch")

    step("a", "inp", "s1", 2)
    step("b", "s1", "s2", 3)
    step("c", "s2", "out", 5)


def log_rows(engine: Engine) -> list[tuple[str, int, int]]:
    return [tuple(r.values()) for r in engine.query(
        "SELECT step, batch_id, x FROM log ORDER BY batch_id, step").to_pylist()]


def expected(batches: list[int]) -> list[tuple[str, int, int]]:
    rows = []
    for b in batches:
        rows += [("a", b, b), ("b", b, 2 * b), ("c", b, 6 * b)]
    return rows


def run_three_batches(path: str, grouped: bool, declare: bool = True
                      ) -> tuple[Engine, list[CommitEvent], tuple[list, list]]:
    """Batches 1-3 through ``three_steps``: the engine, its commit events, what it wrote."""
    engine = Engine(path, group_commit=grouped)
    three_steps(engine, declare=declare)
    events: list[CommitEvent] = []
    engine.observe(events.append)
    for x in (1, 2, 3):
        engine.ingest("inp", [(x,)])
    assert engine.run_until_idle() == 9
    return engine, events, (log_rows(engine), engine.query("SELECT * FROM out").to_pylist())


def test_a_chain_commits_as_one_group_and_equals_one_at_a_time(tmp_path) -> None:
    results = {}
    for grouped in (True, False):
        engine, events, results[grouped] = run_three_batches(
            str(tmp_path / f"{grouped}.duckdb"), grouped)
        tes = [e for e in events if e.kind == "te"]
        assert [(e.node, e.batch_id) for e in tes] == [
            (p, b) for b in (1, 2, 3) for p in ("a", "b", "c")]  # the same order either way
        commit_times = {e.at for e in tes}
        assert len(commit_times) == (3 if grouped else 9)  # one COMMIT per batch when grouped
        engine.close()
    assert results[True] == results[False]
    assert results[True][0] == expected([1, 2, 3])


def test_a_stream_created_by_its_first_batch_ends_the_group(tmp_path) -> None:
    results = {}
    for grouped in (True, False):
        engine, events, results[grouped] = run_three_batches(
            str(tmp_path / f"{grouped}.duckdb"), grouped, declare=False)
        # batch 1 creates s1, s2 and out: three commits; then one per batch
        assert len({e.at for e in events if e.kind == "te"}) == (5 if grouped else 9)
        engine.close()
    assert results[True] == results[False]
    assert results[True][0] == expected([1, 2, 3])


def test_intermediate_rows_only_procedures_read_are_not_stored(tmp_path) -> None:
    engine = Engine(str(tmp_path / "state.duckdb"))
    three_steps(engine)
    engine.ingest("inp", [(1,), (2,)])
    engine.run_until_idle()
    assert engine.query("SELECT count(*) AS n FROM s1").column("n").to_pylist() == [0]
    assert engine.query("SELECT count(*) AS n FROM out").column("n").to_pylist() == [2]
    engine.consumer("s1", "audit")  # a reader outside the dataflow: s1's rows must be kept
    engine.close()
    engine = Engine(str(tmp_path / "state.duckdb"))
    three_steps(engine)
    engine.consumer("s1", "audit")
    engine.ingest("inp", [(5,)])
    engine.run_until_idle()
    assert engine.query("SELECT _batch_id, x FROM s1").to_pylist() == [{"_batch_id": 2, "x": 10}]
    engine.close()


@pytest.mark.parametrize("policy", ["halt", "dead_letter"])
def test_a_failing_member_lets_the_members_before_it_commit(tmp_path, policy: str) -> None:
    engine = Engine(str(tmp_path / "state.duckdb"))
    calls: dict[str, int] = {}
    three_steps(engine, fail={("b", 2): "terminal"}, calls=calls, on_error=policy)
    for x in (1, 2, 3):
        engine.ingest("inp", [(x,)])
    engine.run_until_idle()
    b_status = next(p for p in engine.status().procedures if p.name == "b")
    if policy == "halt":
        # a@2 committed on its own (its output stored for b, which did not commit); b halted
        # a goes on with batch 3: a halt stops a procedure and what is downstream of it
        assert log_rows(engine) == expected([1]) + [("a", 2, 2), ("a", 3, 3)]
        assert "batch 2" in b_status.halted and "cannot do batch 2" in b_status.halted
        assert engine.query("SELECT x FROM s1 WHERE _batch_id = 2").to_pylist() == [{"x": 4}]
        assert calls["b"] == 2  # batch 1, batch 2 once: a terminal failure is not tried again
        engine.close()
        engine = Engine(str(tmp_path / "state.duckdb"))
        three_steps(engine)  # fixed
        engine.resume("b")
        engine.run_until_idle()
    else:
        assert b_status.halted is None
        assert engine.query("SELECT count(*) AS n FROM s1__dead_letter").to_pylist() == [{"n": 1}]
    rows = log_rows(engine)
    want = expected([1, 2, 3])
    if policy == "dead_letter":  # b@2 dead-lettered: c@2 ran on an empty batch
        want = [r for r in want if r[:2] not in (("b", 2), ("c", 2))]
    assert rows == want
    engine.close()


def test_a_transient_failure_in_a_group_is_retried_and_counted_once(tmp_path) -> None:
    engine = Engine(str(tmp_path / "state.duckdb"))
    calls: dict[str, int] = {}
    three_steps(engine, fail={("c", 1): "transient"}, calls=calls)
    engine.ingest("inp", [(1,)])
    assert engine.run_until_idle() == 3
    assert calls == {"a": 2, "b": 2, "c": 2}  # a and b ran again as a group, c alone
    assert log_rows(engine) == expected([1])
    engine.close()


def test_a_swallowed_statement_error_is_blamed_on_its_own_procedure(tmp_path) -> None:
    engine = Engine(str(tmp_path / "state.duckdb"))
    three_steps(engine, fail={("a", 1): "swallowed"})
    engine.ingest("inp", [(1,)])
    engine.run_until_idle()
    halted = {p.name: p.halted for p in engine.status().procedures}
    assert halted["a"] is not None and "no_such_table" in halted["a"]
    assert halted["b"] is None and halted["c"] is None
    assert log_rows(engine) == []
    engine.close()


def test_weak_durability_replays_groups_without_running_past_an_ingest(tmp_path) -> None:
    log = str(tmp_path / "input.log")
    engine = Engine(":memory:", input_log=log)
    three_steps(engine)
    engine.ingest("inp", [(1,)])
    engine.run_until_idle(max_executions=1)  # only a@1: the log records te_seq 1 at ingest 2
    engine.ingest("inp", [(2,)])
    engine.run_until_idle()
    before = log_rows(engine)
    engine.close()
    again = Engine(":memory:", input_log=log)
    three_steps(again)
    again.run_until_idle()
    assert log_rows(again) == before == expected([1, 2])
    again.close()


def test_a_consumer_that_starts_after_batches_passed_in_memory_gets_a_gap(tmp_path) -> None:
    """Batches held back in memory were never stored: for a consumer that starts later they
    are collected (GapError, loud), never empty batches that would advance its watermark."""
    from sstore.base.errors import GapError

    path = str(tmp_path / "state.duckdb")
    engine = Engine(path)
    three_steps(engine)
    for x in (1, 2, 3):
        engine.ingest("inp", [(x,)])
    engine.run_until_idle()
    engine.close()
    reopened = Engine.open_existing(path)
    reopened.hold("s1", "late")
    with pytest.raises(GapError):
        reopened.continue_from("s1", "late", 0)
    assert reopened.continue_from("s1", "late", 0, accept_gap=True) == 3
    reopened.close()


def test_batches_lists_only_committed_batches_and_does_not_wait_for_a_group(tmp_path) -> None:
    """``Engine.batches`` (how a sink plans) reads the committed view: a group's batches appear
    only after its COMMIT, and listing them does not wait for the group to finish."""
    import threading
    import time

    engine = Engine(str(tmp_path / "state.duckdb"))
    engine.stream("inp", {"x": "INTEGER"})
    engine.stream("mid", {"x": "INTEGER"})
    engine.consumer("mid", "sink")  # held: stored, not passed in memory
    inside, release = threading.Event(), threading.Event()

    @engine.procedure(input="inp", output="mid")
    def first(tx, batch):
        return tx.sql("SELECT x FROM batch")

    @engine.procedure(input="mid")
    def slow(tx, batch):
        inside.set()
        release.wait(10)

    engine.ingest("inp", [(1,), (2,)])
    runner = threading.Thread(target=engine.run_until_idle)
    runner.start()
    try:
        assert inside.wait(10)  # first@1 ran in the same group: recorded, not committed
        began = time.monotonic()
        assert engine.batches("mid") == []
        assert engine.query("SELECT count(*) AS n FROM mid").to_pylist() == [{"n": 0}]
        assert time.monotonic() - began < 2, "waited for the group"
    finally:
        release.set()
        runner.join()
    assert engine.batches("mid") == [(1, 2)]
    engine.close()
