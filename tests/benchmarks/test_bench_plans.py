"""benchmarks.plans in miniature: every shape, every plan, answers checked equal while the
stream ingests; and the summary's arithmetic."""

from __future__ import annotations

import pytest

from benchmarks.plans import SHAPES, Feed, create_customer, run_shape, setup_share
from benchmarks.plans_report import summarize
from sstore.workloads.tpcc.orders import orders_rows


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_every_shape_runs_every_plan_with_equal_answers(tmp_path, pg_url: str,
                                                        share: float) -> None:
    create_customer(pg_url)
    feed = Feed(orders_rows(4000))
    engine, sink, ps = setup_share(str(tmp_path), pg_url, feed, 2000, share)
    try:
        records = []
        for shape in SHAPES:
            records += run_shape(ps, engine, feed, shape, share, reps=2, samples=2,
                                 step_rows=20, learn=True)
    finally:
        ps.close()
        sink.close()
        engine.close()
    assert {r["shape"] for r in records} == set(SHAPES)
    scan = [r for r in records if r["shape"] == "scan"]
    assert [r["rows"] for r in scan] == [2000 + 20 * 2, 2000 + 20 * 4]  # ingested rows seen
    for r in records:
        assert {"migrate into pg", "migrate into stream", "pull into island"} <= set(r["seconds"])
        assert r["chosen"] in r["seconds"] and r["ratio"] >= 1.0
    assert ps.learner is not None and ps.learner.observations


def test_summary_counts_cases_and_compares_with_the_best_fixed_plan() -> None:
    def rec(share: float, rep: int, a: float, b: float, chosen: str) -> dict:
        seconds = {"a": a, "b": b}
        fastest = min(seconds, key=seconds.get)
        return {"shape": "scan", "share": share, "rep": rep, "seconds": seconds,
                "chosen": chosen, "fastest": fastest,
                "ratio": seconds[chosen] / seconds[fastest], "planning_seconds": 0.01}
    records = [rec(0.0, 0, 1.0, 2.0, "a"), rec(0.0, 1, 1.0, 0.5, "a"),
               rec(1.0, 0, 3.0, 1.0, "b"), rec(1.0, 1, 3.0, 1.05, "a")]
    s = summarize(records)["scan"]
    assert s["cases"] == 4 and s["within_10pct"] == 0.5
    assert s["worst_ratio"] == pytest.approx(3.0 / 1.05)
    assert s["planner_seconds"] == pytest.approx(1.0 + 1.0 + 1.0 + 3.0)
    assert s["best_fixed_seconds"] == pytest.approx(min(2.0, 2.5) + min(6.0, 2.05))
