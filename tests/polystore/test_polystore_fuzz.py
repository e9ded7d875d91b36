"""The polystore's differential test, on a budget: random PostgreSQL SELECTs under every plan
``Polystore.plans`` proposes, compared as multisets with PostgreSQL alone over all the rows
(``benchmarks.polystore_fuzz``). Fixed seeds: each seed's queries are the same every run, so
a failure here is reproduced with ``python -m benchmarks.polystore_fuzz --seed S``.

A wrong answer under any plan fails the test, and so does a plan that fails: a plan the
planner proposes must answer, or not be proposed (the query then runs in PostgreSQL)."""

from __future__ import annotations

import pytest

from benchmarks.polystore_fuzz import Report, run

SEEDS = (1, 2, 3)
QUERIES = 60          # per seed: ~5 s each without Spark
SPARK_QUERIES = 6     # Spark's plans are slow to start: a handful of queries (all in the CLI)


def _failures(report: Report) -> str:
    lines = [f"{m['plan']}: {m['sql']}\n  expected {m['expected']}\n  got {m['got']}"
             for m in report.mismatches]
    lines += [f"{r['plan']} failed: {r['sql']}\n  {r['error']}" for r in report.refusals]
    return "\n".join(lines)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_plan_answers_as_postgresql_does(tmp_path, pg_url: str, seed: int) -> None:
    report = run(pg_url, tmp_path, QUERIES, seed, spark=False)
    assert report.queries >= QUERIES * 0.9 and report.runs > report.queries
    assert report.tlp_queries > 0  # the second oracle ran too (the stream alone among them)
    assert not report.mismatches and not report.refusals, _failures(report)


def test_spark_plans_answer_as_postgresql_does(tmp_path, pg_url: str, spark) -> None:
    report = run(pg_url, tmp_path, SPARK_QUERIES, 5, spark=True, spark_queries=SPARK_QUERIES)
    assert report.plans["in spark"] >= 1
    assert not report.mismatches and not report.refusals, _failures(report)
