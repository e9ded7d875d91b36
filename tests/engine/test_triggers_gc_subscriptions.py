"""EE triggers, automatic stream garbage collection, and push/pull subscriptions."""

from __future__ import annotations

import pytest

from sstore import Engine


def test_trigger_runs_inside_the_inserting_transaction(engine: Engine) -> None:
    engine.stream("s", {"x": "INTEGER"})
    engine.execute("CREATE TABLE audit (batch_id BIGINT, n BIGINT, total BIGINT)")
    engine.trigger("s", "INSERT INTO audit SELECT $batch_id, count(*), sum(x) FROM new_rows")

    @engine.procedure(input="s", output="t")
    def fail_on_big(tx, batch):
        if tx.sql("SELECT max(x) AS m FROM batch").column("m")[0].as_py() > 100:
            raise ValueError("too big")
        return tx.sql("SELECT x FROM batch")

    engine.stream("t2", {"x": "INTEGER"})
    engine.execute("CREATE TABLE t_audit (batch_id BIGINT, n BIGINT)")
    engine.trigger("t", "INSERT INTO t_audit SELECT $batch_id, count(*) FROM new_rows")
    engine.ingest("s", [(1,), (2,)])
    engine.ingest("s", [(500,)])
    engine.run_until_idle()
    assert engine.query("SELECT * FROM audit ORDER BY batch_id").to_pylist() == [
        {"batch_id": 1, "n": 2, "total": 3}, {"batch_id": 2, "n": 1, "total": 500}]
    # the failed execution's output (and its trigger's row) rolled back together
    assert engine.query("SELECT * FROM t_audit").to_pylist() == [{"batch_id": 1, "n": 2}]


def test_failing_trigger_rejects_the_ingest(engine: Engine) -> None:
    engine.stream("s", {"x": "INTEGER"})
    engine.execute("CREATE TABLE positive (x INTEGER CHECK (x > 0))")
    engine.trigger("s", "INSERT INTO positive SELECT x FROM new_rows")
    engine.ingest("s", [(1,)])
    with pytest.raises(Exception, match="CHECK constraint"):
        engine.ingest("s", [(2,), (-1,)])
    assert engine.query("SELECT x FROM s").column("x").to_pylist() == [1]
    assert engine.ingest("s", [(3,)]) == 2


def test_stream_rows_are_collected_once_every_consumer_committed(state_path: str) -> None:
    eng = Engine(state_path, gc_every=1)
    eng.stream("s", {"x": "INTEGER"})
    eng.stream("fast_out", {"x": "INTEGER"})
    block = {"slow": True}

    @eng.procedure(input="s", output="fast_out")
    def fast(tx, batch):
        return tx.sql("SELECT x FROM batch")

    @eng.procedure(input="s")
    def slow(tx, batch):
        if block["slow"]:
            raise ValueError("not yet")

    for x in range(3):
        eng.ingest("s", [(x,)])
    eng.run_until_idle()
    # slow has not committed: every batch of s stays
    assert eng.query("SELECT count(*) FROM s").column(0)[0].as_py() == 3
    block["slow"] = False
    eng.resume("slow")
    eng.run_until_idle()
    assert eng.query("SELECT count(*) FROM s").column(0)[0].as_py() == 0
    # fast_out has no reader: only its latest batch is kept
    assert eng.query("SELECT _batch_id FROM fast_out").column(0).to_pylist() == [3]
    assert eng.latest("fast_out")[0] == 3
    eng.close()


def test_held_stream_waits_for_acknowledgement(engine: Engine) -> None:
    engine.stream("s", {"x": "INTEGER"})

    @engine.procedure(input="s", output="out")
    def passthrough(tx, batch):
        return tx.sql("SELECT x FROM batch")

    engine.hold("out", "migrator:pg")
    for x in range(4):
        engine.ingest("s", [(x,)])
    engine.run_until_idle()
    assert engine.query("SELECT count(*) FROM out").column(0)[0].as_py() == 4
    engine.acknowledge("migrator:pg", 2)
    engine.collect_garbage()
    assert engine.query("SELECT _batch_id FROM out ORDER BY 1").column(0).to_pylist() == [3, 4]


def test_push_and_pull_subscriptions(engine: Engine) -> None:
    engine.stream("s", {"x": "INTEGER"})

    @engine.procedure(input="s", output="sq")
    def square(tx, batch):
        return tx.sql("SELECT x * x AS y FROM batch")

    pushed: list[tuple[int, list[int]]] = []
    engine.subscribe("sq", lambda b, t: pushed.append((b, t.column("y").to_pylist())))
    pull = engine.subscribe("sq")

    def broken(batch_id: int, table: object) -> None:
        raise RuntimeError("subscriber bug")

    bad = engine.subscribe("sq", broken)
    engine.ingest("s", [(2,), (3,)])
    engine.ingest("s", [(4,)])
    assert pushed == [] and engine.latest("sq") is None  # nothing committed downstream yet
    engine.run_until_idle()
    assert pushed == [(1, [4, 9]), (2, [16])]
    assert [(b, t.num_rows) for b, t in pull.poll()] == [(1, 2), (2, 1)]
    assert pull.poll() == []
    assert bad.failures == 2
    batch_id, rows = engine.latest("sq")
    assert batch_id == 2 and rows.column("y").to_pylist() == [16]
    pull.close()
    engine.ingest("s", [(5,)])
    engine.run_until_idle()
    assert pull.poll() == [] and pushed[-1] == (3, [25])


def test_observers_see_every_commit_in_order(engine: Engine) -> None:
    engine.stream("s", {"x": "INTEGER"})

    @engine.procedure(input="s", output="t")
    def first(tx, batch):
        return tx.sql("SELECT x FROM batch")

    @engine.procedure(input="t")
    def second(tx, batch):
        pass

    events = []
    engine.observe(events.append)
    engine.ingest("s", [(1,), (2,)])
    engine.run_until_idle()
    assert [(e.kind, e.node, e.batch_id, e.rows) for e in events] == [
        ("ingest", "s", 1, 2), ("te", "first", 1, 2), ("te", "second", 1, 0)]
    assert events[0].at <= events[1].at <= events[2].at
