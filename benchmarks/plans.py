"""The planner beyond Figure 5(b): repeated queries over a split object while the stream ingests.

Run ``python -m benchmarks.plans`` (200,000 TPC-C ORDERS rows, shares 0%..100% in steps of
10%, 10 repetitions per query) or ``--quick`` (30,000 rows, shares 0/50/100%, 3 repetitions).

The split object is the one a running system has: an engine stream ``orders_in`` holds the
newest ``share`` of the rows; a sink (``StreamToPostgres``, ``batch_column="_batch_id"``) has
moved the rest into PostgreSQL and garbage collection has dropped them from the stream. A
PostgreSQL dimension ``customer`` (3,000 rows) sits beside it. Four query shapes
(``SHAPES``): the UNION scan, a GROUP BY over the split object, a join with the dimension and a
selective filter. Every plan runs once first (a running system has its caches; a first,
cold run is ``union_plans``' one-shot case). Each query is then repeated ``--reps`` times;
before each timed sample a new batch
(0.5% of the rows) is ingested into the stream, so caches are always one batch stale and must
be topped up. A repetition takes ``--samples`` samples; in each, every plan runs once (in a
shuffled order) and its time includes its cache refresh; the plan's time is the median of its
samples. The answers of all plans are checked equal in every sample.

The planner picks at the start of each repetition (after the first ingest) as ``query`` would
(``Polystore.choose``: planned afresh, or the plan chosen a few runs ago, see
``sstore.polystore.plancache``), with constants calibrated at the start of the run and refitted
from the times of the plans it chose (as a live system learns: it never sees the plans it did
not run), and each plan's price corrected by what its own runs measured
(``sstore.polystore.corrections``). ``planning_seconds`` is what choosing cost (the warm-up planned
each query once, as a dashboard's earlier runs would have: its proposals are kept,
``sstore.polystore.proposals``); ``cold_planning_seconds``, measured once per share and shape and
not added in, is a planning with nothing kept. Reported per shape: the share of (share, repetition)
cases where its choice was within 10% of the fastest plan, the worst ratio, and its cumulative time
against the best fixed plan in hindsight, without and with planning (``plans_report.summarize`` says
what each number includes). Results:
``benchmarks/results/plans.json`` and ``plans-<shape>.png`` (``plans-quick*`` with --quick).
Spark is left out (its ~1 s per query never wins at these sizes: see ``union_plans``).
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import shutil
import statistics
import tempfile
import time
from typing import Any

import duckdb
import psycopg
import pyarrow as pa
from rich.console import Console

from benchmarks.common import (
    fresh_database,
    machine_info,
    require_extras,
    write_results,
)
from benchmarks.plans_report import plot_shape, summarize, summary_table
from migrators import watermarks
from migrators.engine_to_postgres import StreamToPostgres
from migrators.warehouse_url import resolve_warehouse
from sstore import Engine
from sstore.polystore import Polystore
from sstore.polystore.calibrate import calibrate
from sstore.polystore.cost import CostModel
from sstore.polystore.learning import learner_for
from sstore.polystore.sqltext import parse_shared
from sstore.workloads.tpcc.orders import create_in_engine, orders_rows

SHAPES = {
    "scan": "SELECT * FROM orders",
    "aggregate": ("SELECT o_carrier_id, count(*) AS n, sum(o_ol_cnt) AS lines FROM orders "
                  "GROUP BY o_carrier_id"),
    "join": ("SELECT c_segment, count(*) AS n, sum(o_ol_cnt) AS lines FROM orders "
             "JOIN customer ON o_c_id = c_id GROUP BY c_segment"),
    "filter": "SELECT o_id, o_d_id, o_w_id, o_entry_d FROM orders WHERE o_c_id = 42",
}
STREAM_TYPES = {"o_id": "INTEGER", "o_d_id": "SMALLINT", "o_w_id": "INTEGER",
                "o_c_id": "INTEGER", "o_entry_d": "TIMESTAMP", "o_carrier_id": "SMALLINT",
                "o_ol_cnt": "SMALLINT", "o_all_local": "SMALLINT"}
BATCHES = 20  # the initial rows arrive in this many batches


class Feed:
    """The ORDERS rows in arrival order, handed out batch by batch."""

    def __init__(self, rows: pa.Table) -> None:
        self.rows = rows
        self.offset = 0

    def take(self, n: int) -> pa.Table:
        part = self.rows.slice(self.offset, n)
        self.offset += part.num_rows
        if part.num_rows < n:
            raise RuntimeError("the feed ran out of rows: raise the extra rows")
        return part


def setup_share(folder: str, url: str, feed: Feed, rows: int, share: float
                ) -> tuple[Engine, StreamToPostgres, Polystore]:
    """A fresh engine whose stream holds the newest ``share`` of ``rows`` rows and a
    PostgreSQL table the sink filled with the rest (collected from the stream)."""
    engine = Engine(os.path.join(folder, f"stream-{share:.2f}.duckdb"))
    engine.stream("orders_in", STREAM_TYPES)
    with psycopg.connect(url) as con:
        con.execute("DROP TABLE IF EXISTS public.orders_hist")
        con.execute("DROP SCHEMA IF EXISTS sstore_cache CASCADE")
        watermarks.forget_target(con, "public.orders_hist")
    sink = StreamToPostgres(engine, "orders_in", url, "public.orders_hist",
                            batch_column="_batch_id", chunk_rows=50_000)
    older = rows - round(rows * share)
    for part in _parts(older):
        engine.ingest("orders_in", feed.take(part))
    if older == 0:  # the table exists, empty, with its sink's watermark
        engine.ingest("orders_in", feed.take(0))
    sink.run_once()
    engine.collect_garbage()
    for part in _parts(rows - older):
        engine.ingest("orders_in", feed.take(part))
    with psycopg.connect(url) as con:
        con.execute("ANALYZE public.orders_hist")
    ps = Polystore(None, costs=CostModel())
    ps.attach_engine("stream", engine, discover=False)
    ps.add_postgres("pg", url, schema=None)
    ps.catalog.register_many("pg", ps.connector("pg").discover("public"))
    ps.split("orders", {"stream": "orders_in", "pg": "public.orders_hist"})
    return engine, sink, ps


def _parts(n: int) -> list[int]:
    if n == 0:
        return []
    size = -(-n // BATCHES)
    return [min(size, n - i) for i in range(0, n, size)]


def create_customer(url: str) -> None:
    with psycopg.connect(url) as con:
        con.execute("DROP TABLE IF EXISTS public.customer")
        con.execute("CREATE TABLE public.customer (c_id int PRIMARY KEY, c_name text, "
                    "c_segment text)")
        con.execute("INSERT INTO public.customer SELECT g, 'customer ' || g, "
                    "(ARRAY['auto','building','furniture','machinery','household'])[1 + g % 5] "
                    "FROM generate_series(1, 3000) g")
        con.execute("ANALYZE public.customer")


_digests = duckdb.connect(":memory:")


def digest(table: pa.Table) -> tuple[int, int]:
    """Count and order-independent hash of an answer, over its values as text (PostgreSQL
    and DuckDB may type a sum differently; the text is the same)."""
    cursor = _digests.cursor()
    cursor.register("answer", table)
    cols = ", ".join(f'coalesce(CAST("{c}" AS VARCHAR), \'∅\')' for c in table.column_names)
    n, h = cursor.execute(f"SELECT count(*), coalesce(sum(hash(concat_ws('|', {cols}))), 0) "
                      f"FROM answer").fetchone()
    cursor.close()
    return int(n), int(h)


def timed(ps: Polystore, plan: Any) -> tuple[float, tuple[int, int]]:
    t0 = time.perf_counter()
    answer = ps.run_plan(plan)
    seconds = time.perf_counter() - t0
    return seconds, digest(answer)


def cold_planning(ps: Polystore, sql: str) -> float:
    """Seconds a planning takes with nothing kept: the query text not parsed before, the rules
    run (``Polystore.proposals`` emptied), every engine asked. Reported beside the planning
    the planner did (whose proposals the warm-up's planning kept, as a dashboard's earlier
    runs would have), not added to it."""
    ps.proposals.clear()
    parse_shared.cache_clear()
    t0 = time.perf_counter()
    ps.plans(sql)
    return time.perf_counter() - t0


def run_shape(ps: Polystore, engine: Engine, feed: Feed, shape: str, share: float,
              reps: int, samples: int, step_rows: int, learn: bool) -> list[dict[str, Any]]:
    sql = SHAPES[shape]
    records = []
    for plan in ps.plans(sql, rewrite=False):  # a running system: its caches exist
        ps.run_plan(plan)
    for rep in range(reps):
        engine.ingest("orders_in", feed.take(step_rows))
        t0 = time.perf_counter()
        chosen = ps.choose(sql)  # planned afresh, or reused (plan cache)
        planning = time.perf_counter() - t0
        samples_planning = [planning]
        if rep == 0:  # a planning afresh: sampled like the plans' runs (median of 3)
            for _ in range(2):
                t0 = time.perf_counter()
                ps.plans(sql)
                samples_planning.append(time.perf_counter() - t0)
        cold = cold_planning(ps, sql) if rep == 0 else None
        priced = ps.plans(sql)
        plans = {p.name: p for p in ps.plans(sql, rewrite=False)}
        plans.setdefault(chosen.name, chosen)
        times: dict[str, list[float]] = {name: [] for name in plans}
        for sample in range(samples):
            if sample:
                engine.ingest("orders_in", feed.take(step_rows))
            order = list(plans)
            random.shuffle(order)
            answers = {}
            for name in order:
                # the plan as priced now: its moves find the caches as they are
                seconds, answers[name] = timed(ps, plans[name])
                times[name].append(seconds)
            if len(set(answers.values())) != 1:
                raise AssertionError(f"{shape} at {share:.0%}: plans disagree: {answers}")
        median = {name: statistics.median(ts) for name, ts in times.items()}
        if learn:
            ps.observe(chosen, median[chosen.name])
        fastest = min(median, key=median.get)
        records.append({
            "shape": shape, "share": round(share, 2), "rep": rep, "seconds": median,
            "estimated": {p.name: p.cost for p in priced},
            # the learnt factor in each estimate (sstore.polystore.corrections)
            "corrections": {p.name: p.correction for p in priced},
            "chosen_now": priced[0].name,  # what planning afresh would have picked
            "chosen": chosen.name, "fastest": fastest,
            "ratio": median[chosen.name] / median[fastest],
            "planning_seconds": planning, "cold_planning_seconds": cold,
            "planning_median_seconds": statistics.median(samples_planning),
            "proposals_kept": len(ps.proposals.entries), "rows": answers[chosen.name][0],
            "loadavg": os.getloadavg()[0],
        })
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plans",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30,000 rows, 3 shares, 3 reps")
    parser.add_argument("--rows", type=int, default=None, help="rows of ORDERS")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per query")
    parser.add_argument("--samples", type=int, default=3, help="timed samples per repetition")
    parser.add_argument("--shares", default=None, help="comma-separated shares, e.g. 0,0.5,1")
    parser.add_argument("--shapes", default=None,
                        help=f"comma-separated query shapes to run (default: all of "
                             f"{', '.join(SHAPES)})")
    parser.add_argument("--costs", default=None,
                        help="start from these constants (a costs.json as `sstore polystore "
                             "calibrate` writes) instead of calibrating: replays an earlier "
                             "run's starting model")
    parser.add_argument("--no-learn", action="store_true",
                        help="keep the calibrated constants (no refit from observed times)")
    parser.add_argument("--name", default=None, help="results name (default: plans[-quick])")
    parser.add_argument("--postgres", default=None, help="PostgreSQL server URL")
    args = parser.parse_args(argv)
    require_extras("bench")
    rows_n = args.rows or (30_000 if args.quick else 200_000)
    reps = args.reps or (3 if args.quick else 10)
    shares = ([float(s) for s in args.shares.split(",")] if args.shares
              else [0.0, 0.5, 1.0] if args.quick else [i / 10 for i in range(11)])
    step_rows = max(1, rows_n // 200)
    shapes = args.shapes.split(",") if args.shapes else list(SHAPES)
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; the shapes are {', '.join(SHAPES)}")
    console = Console()
    url = fresh_database(resolve_warehouse(args.postgres).url, "sstore_bench_plans")
    create_customer(url)
    folder = tempfile.mkdtemp(prefix="sstore-plans-")
    per_share = (1 + reps * args.samples) * len(shapes) * step_rows
    feed = Feed(orders_rows(len(shares) * (rows_n + per_share) + step_rows))
    random.seed(7)
    started = time.perf_counter()
    if args.costs:
        costs = CostModel.read(args.costs)
    else:
        with console.status("calibrating the cost model"):
            costs = calibrate(url, orders_rows(min(rows_n, 200_000)),
                              create_table=create_in_engine)
    model = copy.deepcopy(costs)
    learner = None if args.no_learn else learner_for(model)
    records: list[dict[str, Any]] = []
    try:
        for share in shares:
            engine, sink, ps = setup_share(folder, url, feed, rows_n, share)
            ps.costs, ps.learner = model, learner  # one model, learning across shares
            try:
                for shape in shapes:
                    console.print(f"share {share:.0%}: {shape}")
                    records += run_shape(ps, engine, feed, shape, share, reps, args.samples,
                                         step_rows, learn=not args.no_learn)
            finally:
                ps.close()
                sink.close()
                engine.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    summary = summarize(records)
    console.print(summary_table(summary))
    name = args.name or ("plans-quick" if args.quick else "plans")
    path = write_results(name, {"benchmark": "plans", "rows": rows_n, "reps": reps,
                                "samples": args.samples, "shares": shares,
                                "step_rows": step_rows, "learn": not args.no_learn,
                                "shapes": shapes,
                                "summary": summary, "records": records,
                                "cost_model": vars(costs), "refitted_model": vars(model),
                                "machine": machine_info(),
                                "seconds": time.perf_counter() - started})
    for shape in shapes:
        plot_shape([r for r in records if r["shape"] == shape], shape, name)
    console.print(f"wrote {path} and {name}-<shape>.png; load average "
                  f"{os.getloadavg()[0]:.2f}; {time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
