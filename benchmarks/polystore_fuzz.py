"""Differential test of the polystore: random PostgreSQL SELECTs under every proposed plan,
compared with PostgreSQL alone over all the rows.

A user writes PostgreSQL SQL; the planner may run it in PostgreSQL, in the engine's DuckDB,
in the island or in Spark. Whatever it picks, the answer must be PostgreSQL's. This runs
``--queries N`` random queries (``polystore_fuzz_gen``, seeded) over a split object while
batches arrive, the sink delivers and garbage collection runs (``polystore_fuzz_world``),
runs each under **every** plan ``Polystore.plans`` proposes (forced, ``run_plan``) and
compares each answer as a multiset with the oracle's. A plan that fails is a *refusal*
(counted by feature: a plan that cannot run a query should not have been proposed); a plan
that answers differently is a *mismatch* (a wrong answer with exit 0: the bug class this
exists for).

    python -m benchmarks.polystore_fuzz --queries 200 [--seed 1] [--no-spark]

prints each mismatch and a summary, and writes ``benchmarks/results/polystore_fuzz.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.polystore_fuzz_gen import FuzzQuery, Generator, TlpQuery
from benchmarks.polystore_fuzz_world import World, columns_of, normalised
from sstore.polystore.meaning import kept_in_postgres
from sstore.polystore.sqltext import QueryError, parse

RESULTS = Path(__file__).parent / "results" / "polystore_fuzz.json"


@dataclass
class Report:
    """What a run found: counts, and each mismatch and refusal with its query and plan."""

    queries: int = 0
    runs: int = 0                      # (query, plan) pairs run
    oracle_errors: list[dict] = field(default_factory=list)  # PostgreSQL refused them too
    mismatches: list[dict] = field(default_factory=list)
    refusals: list[dict] = field(default_factory=list)
    plans: Counter = field(default_factory=Counter)
    tlp_queries: int = 0               # TLP pairs run (the second oracle)
    tlp_kept: int = 0                  # TLP pairs only PostgreSQL could answer: refused
    #: why queries were kept in PostgreSQL (plans elsewhere not proposed), by reason
    kept: Counter = field(default_factory=Counter)

    def summary(self) -> dict:
        by_feature: Counter = Counter()
        for r in self.refusals:
            by_feature.update(r["features"])
        wrong_by_feature: Counter = Counter()
        for m in self.mismatches:
            wrong_by_feature.update(m["features"])
        return {"queries": self.queries, "tlp_queries": self.tlp_queries,
                "tlp_refused_kept_in_postgres": self.tlp_kept, "runs": self.runs,
                "oracle_errors": len(self.oracle_errors),
                "mismatches": len(self.mismatches), "refusals": len(self.refusals),
                "mismatch_rate": len(self.mismatches) / self.runs if self.runs else 0.0,
                "runs_by_plan": dict(self.plans),
                "mismatches_by_plan": dict(Counter(m["plan"] for m in self.mismatches)),
                "mismatches_by_feature": dict(wrong_by_feature.most_common()),
                "refusals_by_plan": dict(Counter(r["plan"] for r in self.refusals)),
                "refusals_by_feature": dict(by_feature.most_common()),
                "kept_in_postgres_by_reason": dict(self.kept.most_common())}


def check_query(world: World, query: FuzzQuery, report: Report,
                plan_filter: Callable[[str], bool] = lambda name: True) -> None:
    """Run ``query`` under every proposed plan and compare each answer with the oracle's."""
    try:
        names, expected = world.expected(query.sql)
    except Exception as exc:  # noqa: BLE001 - PostgreSQL refuses it: not the polystore's
        report.oracle_errors.append({"sql": query.sql, "error": _short(exc)})
        return
    report.queries += 1
    want = normalised(expected)
    try:
        plans = world.ps.plans(query.sql)
    except Exception as exc:  # noqa: BLE001 - planning refused the query: a refusal
        report.refusals.append({"sql": query.sql, "plan": "(planning)",
                                "features": sorted(query.features), "error": _short(exc)})
        return
    tree = parse(query.sql)
    report.kept.update(kept_in_postgres(tree, "duckdb") or ["(nothing: every plan proposed)"])
    for plan in plans:
        if not plan.feasible or not plan_filter(plan.name):
            continue
        report.runs += 1
        report.plans[plan.name] += 1
        entry = {"sql": query.sql, "plan": plan.name, "features": sorted(query.features)}
        try:
            got_names, got = columns_of(world.ps.run_plan(plan))
        except Exception as exc:  # noqa: BLE001 - the plan failed: a refusal
            report.refusals.append({**entry, "error": _short(exc)})
            continue
        if len(got_names) != len(names) or normalised(got) != want:
            report.mismatches.append({**entry, "expected": _sample(want),
                                      "got": _sample(normalised(got)),
                                      "columns": [names, got_names],
                                      "final_sql": plan.final.sql})


def check_tlp(world: World, query: TlpQuery, report: Report) -> None:
    """Each plan of ``query.base`` against the plan of the same name of its partitions
    (``TlpQuery``); a query the planner keeps in PostgreSQL that only the engine holds is
    refused by design (``QueryError``), not counted."""
    try:
        plans = world.ps.plans(query.base)
        split = {p.name: p for p in world.ps.plans(query.partitions)}
    except QueryError:
        report.tlp_kept += 1
        return
    report.tlp_queries += 1
    for plan in plans:
        if not plan.feasible or plan.name not in split:
            continue
        report.runs += 1
        report.plans[f"{plan.name} (TLP)"] += 1
        entry = {"sql": query.base, "plan": f"{plan.name} (TLP)",
                 "features": sorted(query.features)}
        try:
            whole = normalised(columns_of(world.ps.run_plan(plan))[1])
            parts = normalised(columns_of(world.ps.run_plan(split[plan.name]))[1])
        except Exception as exc:  # noqa: BLE001 - the plan failed: a refusal
            report.refusals.append({**entry, "error": _short(exc)})
            continue
        if whole != parts:
            report.mismatches.append({**entry, "expected": _sample(whole),
                                      "got": _sample(parts), "columns": [],
                                      "final_sql": split[plan.name].final.sql})


def run(pg_url: str, directory: Path, queries: int, seed: int, *, spark: bool = True,
        spark_queries: int | None = None, verbose: bool = False) -> Report:
    """``queries`` random queries (seeded) in a new world; Spark's plans for the first
    ``spark_queries`` of them only (None: all)."""
    rng = random.Random(seed)
    world = World(directory, pg_url, rng, spark=spark)
    generator = Generator(random.Random(seed * 7919 + 1))
    report = Report()
    try:
        for i in range(queries):
            world.step()
            query = generator.next()
            with_spark = spark_queries is None or i < spark_queries
            before = (len(report.mismatches), len(report.refusals))
            check_query(world, query, report,
                        lambda name, s=with_spark: s or not name.startswith("in spark"))
            if i % 4 == 3:  # the second oracle: the stream alone (no PostgreSQL holds it)
                check_tlp(world, generator.tlp(generator.rng.choice(["ev_in", "ev"])), report)
            if verbose:
                for m in report.mismatches[before[0]:]:
                    print(f"MISMATCH [{m['plan']}] {m['sql']}\n  expected {m['expected']}\n"
                          f"  got      {m['got']}\n  final    {m['final_sql']}")
                for r in report.refusals[before[1]:]:
                    print(f"REFUSED  [{r['plan']}] {r['sql']}\n  {r['error']}")
    finally:
        world.close()
    return report


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


def _sample(rows: list) -> list:
    return [list(r) for r in rows[:6]] + ([["..."]] if len(rows) > 6 else [])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-spark", action="store_true", help="leave Spark's plans out")
    parser.add_argument("--postgres", default=None, help="PostgreSQL server URL (database "
                        "sstore_fuzz_PID is created on it); default: the warehouse rule")
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    from benchmarks.common import fresh_database
    from migrators.warehouse_url import resolve_warehouse
    started = time.perf_counter()
    url = fresh_database(resolve_warehouse(args.postgres).url, f"sstore_fuzz_{os.getpid()}")
    with tempfile.TemporaryDirectory() as tmp:
        report = run(url, Path(tmp), args.queries, args.seed, spark=not args.no_spark,
                     verbose=True)
    summary = {"seed": args.seed, "seconds": round(time.perf_counter() - started, 1),
               **report.summary()}
    print(json.dumps(summary, indent=2))
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as out:
        json.dump({**summary, "mismatch_list": report.mismatches,
                   "refusal_list": report.refusals, "oracle_error_list": report.oracle_errors},
                  out, indent=2, default=str)


if __name__ == "__main__":
    main()
