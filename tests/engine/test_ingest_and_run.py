"""``Engine.ingest_and_run``: a batch and the TEs it makes runnable commit as one transaction
(a group led by the ingest). It must be exactly ``ingest`` + ``run_until_idle`` in outcome,
errors and guarantees; SIGKILL at its commit steps is in ``test_crash`` (mode "fused")."""

from __future__ import annotations

import pytest

from sstore import Engine, OutOfOrderBatchError, SchemaError
from sstore.base.errors import GapError
from sstore.execution.runtime import CommitEvent
from tests.engine.test_group_commit import expected, log_rows, three_steps


def test_it_equals_ingest_then_run_and_commits_once_per_batch(tmp_path) -> None:
    results = {}
    for fused in (True, False):
        engine = Engine(str(tmp_path / f"{fused}.duckdb"))
        three_steps(engine)
        events: list[CommitEvent] = []
        engine.observe(events.append)
        for x in (1, 2, 3):
            if fused:
                ingested = engine.ingest_and_run("inp", [(x,)])
                assert (ingested, ingested.executions, ingested.duplicate) == (x, 3, False)
            else:
                engine.ingest("inp", [(x,)])
                engine.run_until_idle()
        results[fused] = (log_rows(engine), engine.query("SELECT * FROM out").to_pylist())
        assert [(e.kind, e.node, e.batch_id) for e in events] == [
            (k, n, b) for b in (1, 2, 3)
            for k, n in (("ingest", "inp"), ("te", "a"), ("te", "b"), ("te", "c"))]
        assert len({e.at for e in events}) == (3 if fused else 6)  # one COMMIT per batch
        stored = engine.query("SELECT count(*) AS n FROM inp").column("n").to_pylist()
        assert stored == [0 if fused else 3]  # only procedures read inp: never stored
        engine.close()
    assert results[True] == results[False]
    assert results[True][0] == expected([1, 2, 3])


def test_a_refused_batch_raises_and_changes_nothing(tmp_path) -> None:
    engine = Engine(str(tmp_path / "state.duckdb"))
    engine.stream("inp", {"x": "INTEGER CHECK (x > 0)"})
    engine.execute("CREATE TABLE seen (x INTEGER)")

    @engine.procedure(input="inp")
    def keep(tx, batch):
        tx.execute("INSERT INTO seen SELECT x FROM batch")

    assert engine.ingest_and_run("inp", [(1,)], batch_id=1) == 1
    with pytest.raises(Exception, match="CHECK constraint"):  # checked: inp's rows are stored
        engine.ingest_and_run("inp", [(5,), (-1,)], batch_id=2)
    with pytest.raises(SchemaError):
        engine.ingest_and_run("inp", [("not a number",)], batch_id=2)
    assert engine.ingest_and_run("inp", [(1,)], batch_id=1).duplicate  # a re-send: no-op
    engine.ingest_and_run("inp", [(2,)], batch_id=3)
    with pytest.raises(OutOfOrderBatchError):
        engine.ingest_and_run("inp", [(3,)], batch_id=2)
    assert engine.query("SELECT x FROM seen ORDER BY x").column("x").to_pylist() == [1, 2]
    assert [b for b, _ in engine.batches("inp")] == [1, 3]
    engine.close()


@pytest.mark.parametrize("policy", ["halt", "dead_letter"])
def test_a_failing_procedure_keeps_the_batch_and_the_procedures_before_it(
        tmp_path, policy: str) -> None:
    engine = Engine(str(tmp_path / "state.duckdb"))
    calls: dict[str, int] = {}
    three_steps(engine, fail={("b", 2): "terminal"}, calls=calls, on_error=policy)
    for x in (1, 2, 3):
        engine.ingest_and_run("inp", [(x,)])
    assert calls["b"] == (2 if policy == "halt" else 3)  # b@2 ran once: terminal, not retried
    rows = log_rows(engine)
    if policy == "halt":
        assert rows == expected([1]) + [("a", 2, 2), ("a", 3, 3)]
        halted = next(p for p in engine.status().procedures if p.name == "b").halted
        assert halted is not None and "cannot do batch 2" in halted
    else:
        want = [r for r in expected([1, 2, 3]) if r[:2] not in (("b", 2), ("c", 2))]
        assert rows == want
    engine.close()


def test_a_transient_failure_is_retried_and_counted_once(tmp_path) -> None:
    engine = Engine(str(tmp_path / "state.duckdb"))
    calls: dict[str, int] = {}
    three_steps(engine, fail={("c", 1): "transient"}, calls=calls)
    engine.ingest_and_run("inp", [(1,)])
    assert calls == {"a": 2, "b": 2, "c": 2}  # the group, then a and b again, c alone
    assert log_rows(engine) == expected([1])
    engine.close()


@pytest.mark.parametrize("fused", [True, False])
def test_a_row_breaking_a_check_of_an_intermediate_stream_halts_its_writer(
        tmp_path, fused: bool) -> None:
    """Held-back rows are never inserted, so a stream whose table checks its rows is never
    held back: the writer halts as without group commit (it used to pass silently)."""
    engine = Engine(str(tmp_path / "state.duckdb"))
    engine.stream("inp", {"x": "INTEGER"})
    engine.stream("mid", {"x": "INTEGER CHECK (x >= 0)"})
    engine.execute("CREATE TABLE out (x INTEGER)")

    @engine.procedure(input="inp", output="mid")
    def shift(tx, batch):
        return tx.sql("SELECT x - 10 AS x FROM batch")

    @engine.procedure(input="mid")
    def land(tx, batch):
        tx.execute("INSERT INTO out SELECT x FROM batch")

    if fused:
        engine.ingest_and_run("inp", [(1,), (20,)])
    else:
        engine.ingest("inp", [(1,), (20,)])
        engine.run_until_idle()
    assert engine.query("SELECT * FROM out").num_rows == 0
    halted = {p.name: p.halted for p in engine.status().procedures}
    assert halted["shift"] is not None and "CHECK constraint" in halted["shift"]
    engine.close()


def test_a_consumer_that_starts_later_on_the_ingested_stream_gets_a_gap(tmp_path) -> None:
    path = str(tmp_path / "state.duckdb")
    engine = Engine(path)
    three_steps(engine)
    for x in (1, 2):
        engine.ingest_and_run("inp", [(x,)])
    engine.close()
    reopened = Engine.open_existing(path)
    reopened.hold("inp", "late")
    with pytest.raises(GapError):
        reopened.continue_from("inp", "late", 0)
    reopened.close()


def test_a_held_stream_is_stored_and_weak_durability_falls_back(tmp_path) -> None:
    engine = Engine(str(tmp_path / "state.duckdb"))
    three_steps(engine)
    engine.consumer("inp", "audit")  # a reader outside the group: the rows must be kept
    engine.ingest_and_run("inp", [(4,)])
    assert engine.query("SELECT x FROM inp").column("x").to_pylist() == [4]
    engine.close()
    log = str(tmp_path / "input.log")
    weak = Engine(":memory:", input_log=log)
    three_steps(weak)
    for x in (1, 2):
        weak.ingest_and_run("inp", [(x,)])
    weak.close()
    again = Engine(":memory:", input_log=log)
    three_steps(again)
    again.run_until_idle()
    assert log_rows(again) == expected([1, 2])
    again.close()


def test_gc_skips_streams_passed_in_memory_and_still_removes_rows_stored_earlier(
        tmp_path) -> None:
    """GC issues no DELETE for a stream whose batches never reached its table, but rows that
    were stored, by this process or an earlier one, are removed once their reader is done."""
    path = str(tmp_path / "state.duckdb")
    engine = Engine(path)
    three_steps(engine)
    engine.consumer("s2", "audit")  # s2 is stored for it; s1 and inp are passed in memory
    for x in (1, 2, 3):
        engine.ingest_and_run("inp", [(x,)])
    engine.close()

    def stored(e: Engine, stream: str) -> int:
        return e.query(f"SELECT count(*) AS n FROM {stream}").column("n")[0].as_py()

    reopened = Engine(path)
    three_steps(reopened)
    reopened.consumer("s2", "audit")
    assert (stored(reopened, "inp"), stored(reopened, "s1"), stored(reopened, "s2")) == (0, 0, 3)
    reopened.acknowledge("audit", 2)
    statements = reopened.collect_garbage()
    assert stored(reopened, "s2") == 1  # batches 1 and 2 were taken: removed after a restart
    reopened.ingest_and_run("inp", [(4,)])
    reopened.acknowledge("audit", 4)
    reopened.collect_garbage()
    assert stored(reopened, "s2") == 0
    # s2 and out: rows and collected mark each; commit records of all streams in one
    # statement; procedures' records: 5 (it was 12 with a DELETE per stream and record kind);
    # plus the acknowledgement taken since the last group, which GC writes in its transaction
    # (it used to be a COMMIT of its own in acknowledge)
    assert statements <= 6
    assert log_rows(reopened) == expected([1, 2, 3, 4])
    reopened.close()


def test_a_stop_during_the_group_keeps_the_batch_and_runs_it_later(tmp_path) -> None:
    """Ctrl-C (here ``Engine.interrupt``) while the batch's procedures run: the group rolls
    back, the batch is committed on its own (the client handed it over), ``Stopped`` is
    raised, and the next run does the procedures exactly once."""
    from sstore.execution.interrupts import Stopped

    engine = Engine(str(tmp_path / "state.duckdb"))
    engine.stream("inp", {"x": "INTEGER"})
    engine.execute("CREATE TABLE seen (x INTEGER)")
    stop_once = [True]

    @engine.procedure(input="inp")
    def keep(tx, batch):
        tx.execute("INSERT INTO seen SELECT x FROM batch")
        if stop_once.pop() if stop_once else False:
            engine.interrupt()  # what a SIGINT handler does

    with pytest.raises(Stopped):
        engine.ingest_and_run("inp", [(1,), (2,)], batch_id=1)
    assert engine.query("SELECT count(*) AS n FROM seen").column("n")[0].as_py() == 0
    assert engine.ingest_and_run("inp", [(1,), (2,)], batch_id=1).duplicate  # it was kept
    engine.run_until_idle()
    assert engine.query("SELECT x FROM seen ORDER BY x").column("x").to_pylist() == [1, 2]
    engine.close()


def orders_and_ids(engine: Engine, second: str) -> None:
    """``orders`` -> pick -> ``ids`` -> a second procedure that joins ``ids`` back to the table
    of ``orders`` (or of ``ids``): a procedure's SQL may read any stream's table, and must
    find the batch there whatever path brought it in. ``second``: "python" (a function
    procedure), "sql" (a SQL procedure, chained with pick), "view" (a function procedure
    reading ``orders`` through a view), "ids" (a function procedure reading the table of its
    own input ``ids``), "trigger" (a trigger on ``ids`` that reads ``orders``)."""
    engine.stream("orders", {"id": "INTEGER", "amount": "INTEGER"})
    engine.stream("ids", {"id": "INTEGER"})
    engine.stream("joined", {"id": "INTEGER", "amount": "INTEGER"})
    engine.execute("CREATE TABLE IF NOT EXISTS landed (id INTEGER, amount INTEGER)")
    engine.sql_procedure("pick", "SELECT id FROM batch", input="orders", output="ids")
    join = {"python": "orders", "view": "all_orders", "ids": "orders"}
    if second == "sql":
        engine.sql_procedure("join_back", "SELECT o.id, o.amount FROM batch b JOIN orders o "
                             "ON o._batch_id = (SELECT max(_batch_id) FROM orders) "
                             "AND o.id = b.id", input="ids", output="joined")
    elif second == "trigger":
        engine.trigger("ids", "INSERT INTO landed SELECT o.id, o.amount FROM new_rows n "
                              "JOIN orders o ON o._batch_id = $batch_id AND o.id = n.id")
        engine.sql_procedure("join_back", "SELECT id, NULL::INTEGER AS amount FROM batch",
                             input="ids", output="joined")
    else:
        source = "ids i JOIN batch b ON b.id = i.id" if second == "ids" else "batch b"
        on = "i._batch_id = ? AND " if second == "ids" else ""

        @engine.procedure(input="ids", output="joined")
        def join_back(tx, batch):
            return tx.sql(f"SELECT o.id, o.amount FROM {source} JOIN {join[second]} o "
                          f"ON {on}o._batch_id = ? AND o.id = b.id ORDER BY o.id",
                          *([tx.batch_id] * (2 if second == "ids" else 1)))

    @engine.procedure(input="joined")
    def land(tx, batch):
        if second != "trigger":
            tx.execute("INSERT INTO landed SELECT id, amount FROM batch")

    engine.run_until_idle()  # starts the engine: the stream tables exist from now on
    engine.execute("CREATE VIEW IF NOT EXISTS all_orders AS SELECT * FROM orders")


@pytest.mark.parametrize("second", ["python", "sql", "view", "ids", "trigger"])
@pytest.mark.parametrize("path", ["ingest", "ingest_and_run", "no_group_commit"])
def test_a_procedure_that_reads_a_streams_table_finds_the_batch_on_every_path(
        tmp_path, second: str, path: str) -> None:
    """Issue 34, item 1: the batch of ``orders`` was "passed in memory" by ``ingest_and_run``
    (and the batch of ``ids`` by any group commit) and never written where a procedure's SQL
    reads it: 6 rows after ``ingest`` + ``run_until_idle``, 0 after ``ingest_and_run``."""
    engine = Engine(str(tmp_path / "state.duckdb"), group_commit=path != "no_group_commit")
    orders_and_ids(engine, second)
    for batch in (1, 2):  # the second: SQL procedures may be chained from then on
        rows = [(i, i * 10) for i in range(batch * 10, batch * 10 + 6)]
        if path == "ingest_and_run":
            engine.ingest_and_run("orders", rows)
        else:
            engine.ingest("orders", rows)
            engine.run_until_idle()
        landed = engine.query("SELECT id, amount FROM landed WHERE id >= ? ORDER BY id",
                              batch * 10)
        assert [tuple(r.values()) for r in landed.to_pylist()] == rows, (second, path, batch)
    assert not [p for p in engine.status().procedures if p.halted]
    engine.close()


@pytest.mark.parametrize("fused", [True, False])
def test_a_procedure_run_after_its_group_rolled_back_finds_the_streams_it_reads(
        tmp_path, fused: bool) -> None:
    """``c`` fails once (transient) in the group of batch 1: the group rolls back, ``a`` and
    ``b`` commit as a group of their own and ``c`` runs alone, in a transaction of its own.
    It reads the table of ``s1``, whose only reader ``b`` ran in that group: a batch held
    back there must be stored, since ``c`` still runs for batch 1 after it."""
    from sstore.base.errors import TransientError

    engine = Engine(str(tmp_path / "state.duckdb"))
    for stream in ("inp", "s1", "s2"):
        engine.stream(stream, {"x": "INTEGER"})
    engine.execute("CREATE TABLE seen (x INTEGER)")
    tries = []

    @engine.procedure(input="inp", output="s1")
    def a(tx, batch):
        return tx.sql("SELECT x * 2 AS x FROM batch")

    @engine.procedure(input="s1", output="s2")
    def b(tx, batch):
        return tx.sql("SELECT x * 3 AS x FROM batch")

    @engine.procedure(input="s2")
    def c(tx, batch):
        tries.append(tx.batch_id)
        tx.execute("INSERT INTO seen SELECT x FROM s1 WHERE _batch_id = ?", tx.batch_id)
        if len(tries) == 1:
            raise TransientError("busy")

    if fused:
        engine.ingest_and_run("inp", [(1,), (2,)])
    else:
        engine.ingest("inp", [(1,), (2,)])
        engine.run_until_idle()
    assert tries == [1, 1]
    assert engine.query("SELECT x FROM seen ORDER BY x").column("x").to_pylist() == [2, 4]
    engine.close()
