"""Ordering: per procedure b before b+1, per batch upstream before downstream; fan-out, fan-in."""

from __future__ import annotations

import random

import pytest

from sstore import Engine
from tests.graphs import check_order, ordered_graph


def test_fan_out_fan_in_order_and_results(engine: Engine) -> None:
    upstream = ordered_graph(engine)
    rng = random.Random(3)
    expected = {"doubled": 0, "tripled": 0, "b": 0}
    for b in range(1, 41):
        xs = [rng.randint(0, 100) for _ in range(rng.randint(0, 6))]  # empty batches too
        engine.ingest("a", [(x,) for x in xs])
        ys = [rng.randint(0, 100) for _ in range(rng.randint(0, 3))]
        engine.ingest("b", [(y,) for y in ys])
        expected["doubled"] += sum(2 * x for x in xs if x % 2 == 0)
        expected["tripled"] += sum(3 * x for x in xs if x % 2 == 1)
        expected["b"] += sum(ys)
        if b % 7 == 0:  # run with a backlog sometimes, so the scheduler has a choice
            engine.run_until_idle()
    engine.run_until_idle()
    log = engine.query("SELECT seq, proc, batch_id FROM te_log").to_pylist()
    check_order([(r["seq"], r["proc"], r["batch_id"]) for r in log], upstream)
    # every procedure ran every batch exactly once, empty ones included
    counts = engine.query("SELECT proc, count(*) AS n, count(DISTINCT batch_id) AS d "
                          "FROM te_log GROUP BY proc").to_pylist()
    assert {r["proc"]: (r["n"], r["d"]) for r in counts} == {
        p: (40, 40) for p in ("split", "double", "triple", "merge")}
    totals = {r["src"]: r["s"] for r in engine.query("SELECT src, s FROM merged_total").to_pylist()}
    assert {k: totals.get(k, 0) for k in expected} == expected


def test_scheduler_pushes_a_batch_through_before_the_next(engine: Engine) -> None:
    upstream = ordered_graph(engine)
    for _ in range(5):
        engine.ingest("a", [(1,), (2,)])
        engine.ingest("b", [(5,)])
    engine.run_until_idle()
    log = engine.query("SELECT proc, batch_id FROM te_log ORDER BY seq").to_pylist()
    batches = [r["batch_id"] for r in log]
    assert batches == sorted(batches), "batch b+1 started before batch b finished the graph"
    check_order([(i, r["proc"], r["batch_id"]) for i, r in enumerate(log)], upstream)


def test_fan_in_waits_for_every_input_and_treats_skipped_ids_as_empty(engine: Engine) -> None:
    ordered_graph(engine)
    engine.ingest("a", [(2,)], batch_id=1)
    engine.run_until_idle()
    # merge needs batch 1 of b too: it must not have run
    assert engine.query("SELECT count(*) AS n FROM te_log WHERE proc = 'merge'"
                        ).column("n")[0].as_py() == 0
    engine.ingest("b", [(10,)], batch_id=3)  # b skips 1 and 2: they are empty on b
    engine.run_until_idle()
    ran = engine.query("SELECT batch_id FROM te_log WHERE proc = 'merge' ORDER BY seq"
                       ).column("batch_id").to_pylist()
    assert ran == [1]  # 3 waits for batch 3 of a
    engine.ingest("a", [(4,)], batch_id=3)
    engine.run_until_idle()
    ran = engine.query("SELECT batch_id FROM te_log WHERE proc = 'merge' ORDER BY seq"
                       ).column("batch_id").to_pylist()
    assert ran == [1, 3]


def test_checker_catches_violations() -> None:
    upstream = {"p": [], "q": ["p"]}
    with pytest.raises(AssertionError):
        check_order([(1, "p", 2), (2, "p", 1)], upstream)
    with pytest.raises(AssertionError):
        check_order([(1, "q", 1), (2, "p", 1)], upstream)
    with pytest.raises(AssertionError):
        check_order([(1, "p", 1), (2, "p", 1)], upstream)
    check_order([(1, "p", 1), (2, "q", 1), (3, "p", 2), (4, "q", 2)], upstream)
