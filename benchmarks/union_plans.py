"""Figure 5(b) of the paper: UNION over a split ORDERS table, plan by plan, share by share.

Run ``python -m benchmarks.union_plans`` (200,000 TPC-C ORDERS rows, shares 0%..100% in steps
of 10%, about 5 minutes with Spark) or ``--quick`` (50,000 rows, shares 0/30/60/100%, fewer
repetitions); ``--no-spark`` leaves the Spark plan out.

At each share the newest ``share`` of the rows sit in the streaming engine (a DuckDB state
table), the rest in PostgreSQL, and the polystore object ``orders`` is their UNION ALL. The
query is the paper's ``SELECT * FROM orders``, answered to this process as Arrow. Each plan the
planner proposes is timed on its own (median of several runs):

- ``migrate into pg``: the paper's plan (i): copy the engine's rows into PostgreSQL (binary
  COPY), UNION there, read the result out. Timed one-shot: its cached copy is dropped before
  each run. ``warm`` times the same plan when the copy is already there (a repeated query).
- ``pull into island``: plan (ii): both parts fetched in parallel as Arrow, UNION ALL in the
  island's DuckDB.
- ``migrate into stream``: the mirror image: PostgreSQL's rows copied into the engine.
- ``in spark``: plan (iii): both parts into Spark (JDBC and Arrow), Spark SQL, collected.
- ``in pg`` / ``in stream`` (at 0% and 100% only): with one part empty the planner leaves it
  out (rewrite ``prune_empty_fragments``) and runs the query where the rows are.

``chosen`` is what the planner picks for a one-shot query (no cache), with constants
calibrated at the start of the run (``sstore.polystore.calibrate``); ``chosen_ok`` says whether
it is within 10% of the fastest. Results: ``benchmarks/results/union_plans.json`` (a list of
records: ``share``, ``seconds`` (plan -> median seconds), ``chosen``, and more) and
``union_plans.png``; ``--quick`` writes ``union_plans-quick.*``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from benchmarks.common import (
    RESULTS,
    fresh_database,
    machine_info,
    require_extras,
    write_results,
)
from migrators.warehouse_url import resolve_warehouse
from sstore import Engine
from sstore.base.extras import needs
from sstore.polystore import Polystore
from sstore.polystore.calibrate import calibrate
from sstore.polystore.plan import Move, Plan
from sstore.workloads.tpcc.orders import (
    create_in_engine,
    create_in_postgres,
    orders_rows,
    split_rows,
)

PAPER_PLANS = ("migrate into pg", "pull into island")
TOLERANCE = 1.10


def bench_url(base: str) -> str:
    """A fresh database ``sstore_bench_union`` on the server of ``base``."""
    return fresh_database(base, "sstore_bench_union")


def drop_caches(ps: Polystore, plan: Plan) -> None:
    for step in plan.steps:
        if isinstance(step, Move) and step.cache_key:
            ps.connector(step.target).drop(step.table)


def time_plan(ps: Polystore, plan: Plan, runs: int, cold: bool, expected_rows: int) -> float:
    samples = []
    for _ in range(runs):
        if cold:
            drop_caches(ps, plan)
        t0 = time.perf_counter()
        result = ps.run_plan(plan)
        samples.append(time.perf_counter() - t0)
        if result.num_rows != expected_rows:
            raise AssertionError(f"{plan.name} returned {result.num_rows} rows, "
                                 f"expected {expected_rows}")
    return statistics.median(samples)


def measure_share(ps: Polystore, engine: Engine, url: str, rows: Any, share: float, runs: int,
                  spark_runs: int) -> dict[str, Any]:
    recent, older = split_rows(rows, share)
    create_in_engine(engine, "orders_recent", recent)
    create_in_postgres(url, "public.orders", older)
    ps.split("orders", {"stream": "orders_recent", "pg": "public.orders"})
    sql = "SELECT * FROM orders"
    for plan in ps.plans(sql, rewrite=False):  # no cached copies from the previous share
        drop_caches(ps, plan)
    t0 = time.perf_counter()
    chosen_plan = next(p for p in ps.plans(sql) if p.feasible)
    planning = time.perf_counter() - t0
    chosen = chosen_plan.name
    plans = ps.plans(sql, rewrite=False)  # every plan, also where a fragment is empty
    if chosen not in {p.name for p in plans}:
        plans.append(chosen_plan)  # "in pg" / "in stream" once a part is empty
    seconds, estimated, warm = {}, {}, {}
    for plan in plans:
        n = spark_runs if plan.rule == "run_in_spark" else runs
        seconds[plan.name] = time_plan(ps, plan, n, cold=True, expected_rows=rows.num_rows)
        estimated[plan.name] = plan.cost
    for plan in plans:
        if plan.rule == "migrate_then_run":
            time_plan(ps, plan, 1, cold=True, expected_rows=rows.num_rows)  # fill the cache
            warm[plan.name] = time_plan(ps, plan, runs, cold=False, expected_rows=rows.num_rows)
    chosen_warm = next(p for p in ps.plans(sql) if p.feasible).name  # the caches are there
    if chosen_warm not in seconds and chosen_warm not in warm:
        raise AssertionError(f"the planner chose {chosen_warm}, which was not timed")
    for plan in ps.plans(sql, rewrite=False):
        drop_caches(ps, plan)
    fastest = min(seconds, key=seconds.get)
    warm_times = {**seconds, **warm}
    fastest_warm = min(warm_times, key=warm_times.get)
    return {
        "share": round(share, 2), "seconds": seconds, "chosen": chosen, "fastest": fastest,
        "chosen_ok": seconds[chosen] <= TOLERANCE * seconds[fastest],
        "estimated": estimated, "planning_seconds": planning,
        "warm_seconds": warm, "chosen_warm": chosen_warm, "fastest_warm": fastest_warm,
        "chosen_warm_ok": warm_times[chosen_warm] <= TOLERANCE * warm_times[fastest_warm],
        "engine_rows": recent.num_rows, "postgres_rows": older.num_rows,
        "loadavg": os.getloadavg()[0],
    }


def crossover(records: list[dict[str, Any]]) -> float | None:
    """The first share at which pulling into the island beats migrating into PostgreSQL."""
    for rec in records:
        s = rec["seconds"]
        if all(p in s for p in PAPER_PLANS) and s["pull into island"] < s["migrate into pg"]:
            return rec["share"]
    return None


def plot(records: list[dict[str, Any]], path: str, rows: int) -> None:
    with needs("bench"):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    shares = [100 * r["share"] for r in records]
    names = list(dict.fromkeys(n for r in records for n in r["seconds"]))
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in names:
        ys = [r["seconds"].get(name) for r in records]
        ax.plot(shares, [1000 * y if y is not None else None for y in ys], marker="o",
                label=name)
    for name in ("migrate into pg",):
        ys = [r["warm_seconds"].get(name) for r in records]
        if any(y is not None for y in ys):
            ax.plot(shares, [1000 * y if y is not None else None for y in ys], linestyle="--",
                    marker=".", label=f"{name} (copy cached: repeated query)")
    for r, x in zip(records, shares):
        ax.scatter([x], [1000 * r["seconds"][r["chosen"]]], s=160, facecolors="none",
                   edgecolors="black", zorder=5)
    ax.set_yscale("log")
    ax.set_xlabel("share of ORDERS rows held in the streaming engine (%)")
    ax.set_ylabel("query time, ms (median, log scale)")
    ax.set_title(f"SELECT * FROM orders over {rows:,} rows (circle: the planner's choice)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def results_table(records: list[dict[str, Any]]) -> Table:
    names = list(dict.fromkeys(n for r in records for n in r["seconds"]))
    table = Table(title="UNION over split ORDERS: median ms per plan (one-shot)")
    table.add_column("share", justify="right")
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("warm migrate", justify="right")
    table.add_column("chosen")
    table.add_column("ok")
    for r in records:
        cells = []
        for name in names:
            value = r["seconds"].get(name)
            text = "" if value is None else f"{1000 * value:.1f}"
            if name == r["fastest"]:
                text = f"[bold]{text}[/bold]"
            cells.append(text)
        warm = r["warm_seconds"].get("migrate into pg")
        table.add_row(f"{100 * r['share']:.0f}%", *cells,
                      "" if warm is None else f"{1000 * warm:.1f}", r["chosen"],
                      "yes" if r["chosen_ok"] else "NO")
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.union_plans",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50,000 rows, 4 shares")
    parser.add_argument("--no-spark", action="store_true", help="leave the Spark plan out")
    parser.add_argument("--rows", type=int, default=None, help="rows of ORDERS")
    parser.add_argument("--postgres", default=None,
                        help="PostgreSQL server URL (default: $SSTORE_POSTGRES_URL, else the "
                             "server at the default address, else a private one)")
    args = parser.parse_args(argv)
    require_extras("bench", *(() if args.no_spark else ("spark",)))
    rows_n = args.rows or (50_000 if args.quick else 200_000)
    shares = [0.0, 0.3, 0.6, 1.0] if args.quick else [i / 10 for i in range(11)]
    runs, spark_runs = (3, 1) if args.quick else (7, 3)
    console = Console()
    url = bench_url(resolve_warehouse(args.postgres).url)
    folder = tempfile.mkdtemp(prefix="sstore-union-")
    rows = orders_rows(rows_n)
    started = time.perf_counter()
    with console.status("calibrating the cost model"):
        costs = calibrate(url, orders_rows(min(rows_n, 200_000)), spark=not args.no_spark,
                          create_table=create_in_engine)
    engine = Engine(os.path.join(folder, "stream.duckdb"))
    ps = Polystore(None, costs=costs)
    ps.attach_engine("stream", engine, discover=False)
    ps.add_postgres("pg", url, schema=None)
    if not args.no_spark:
        ps.add_spark("spark")
    records = []
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar:
            task = bar.add_task("shares", total=len(shares))
            for share in shares:
                records.append(measure_share(ps, engine, url, rows, share, runs, spark_runs))
                bar.advance(task)
    finally:
        ps.close()
        engine.close()
        shutil.rmtree(folder, ignore_errors=True)
    console.print(results_table(records))
    cross = crossover(records)
    ok = sum(r["chosen_ok"] for r in records)
    console.print(f"crossover (island faster than migrate-into-PostgreSQL) at share: "
                  f"{'none' if cross is None else f'{100 * cross:.0f}%'}; planner within 10% of "
                  f"the fastest at {ok}/{len(records)} shares (one-shot), "
                  f"{sum(r['chosen_warm_ok'] for r in records)}/{len(records)} with the copy "
                  f"cached; {time.perf_counter() - started:.0f} s in all")
    name = "union_plans-quick" if args.quick else "union_plans"
    path = write_results(name, records)  # the shape: a list of records
    write_results(f"{name}-details", {"benchmark": "union_plans", "rows": rows_n, "runs": runs,
                                      "crossover_share": cross, "cost_model": costs.__dict__,
                                      "machine": machine_info()})
    png = os.path.join(RESULTS, f"{name}.png")
    plot(records, png, rows_n)
    console.print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
