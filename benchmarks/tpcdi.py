"""Benchmark of TPC-DI DimTrade into PostgreSQL: the sstore streaming pipeline against Spark, in
bulk and as Spark Structured Streaming.

Run ``python -m benchmarks.tpcdi`` (SF 1 and SF 10: an hour or more on 2 cores, most of it
Spark; SF 10 is 1.3M trades, 3.3M events, and its whole-batch runs put Batch1 in ONE batch:
~12 GB peak RSS for sstore, ~6 GB for the reference, measured) or ``--quick`` (SF 0.1: 5 to 15
minutes, most of it Spark); ``--systems sstore reference`` leaves Spark's runs out (the dimensions
are still built by Spark, once per SF). ``--profile``: a per-batch breakdown of the sstore runs by
phase (``benchmarks.tpcdi_profile``). PostgreSQL at ``SSTORE_POSTGRES_URL`` (else the local
server); each scale factor gets its own database ``bench_tpcdi_<pid>_<sf>``, dropped at the end.

Systems, per scale factor (each into its own fresh warehouse schema, from the same data set):

- ``spark-bulk``: the Spark DimTrade pipeline (``dimtrade_spark.load_historical`` and
  ``apply_batch``): each TPC-DI batch is one job and one PostgreSQL transaction.
- ``sstore``: the five-procedure streaming dataflow (``streaming.pipeline.StreamingDimTrade``)
  with its exactly-once sinks, fed trade events in batches of 100, 1,000 and 10,000 trades.
- ``sstore-coalescing``: the same dataflow fed the same batches through a
  ``sstore.coalesce.Coalescer``: the batches that arrive while the engine is busy run as one
  engine batch (at most ``--coalesce-trades`` trades, default 200), each batch's latency still
  its own (``benchmarks.tpcdi_coalescing``). Only at batch sizes below that bound: a batch
  that large runs alone anyway, and waiting behind the one before only adds latency.
- ``reference``: the same five steps written by hand (``benchmarks.tpcdi_reference``): one
  DuckDB transaction and one PostgreSQL transaction (binary COPY + merge, watermark row) per
  chunk, fed the same batches; the floor sstore's machinery is measured against.
- ``spark-sss``: the same five steps as a Spark user writes them in Structured Streaming
  (``benchmarks.tpcdi_sss``: file source, foreachBatch, COPY + merge into PostgreSQL,
  exactly once by batchId), fed the same batches.

Dimensions are built once per scale factor by Spark and copied into each run's warehouse
(``benchmarks.tpcdi_setup``); the numbers count the trade phases only. Batch size 0 means
"every TPC-DI batch as one chunk" (sstore and reference only: Spark bulk is that case for
Spark). Each run's peak RSS (``benchmarks.peak_rss``: this process, and apart Spark's JVM) is
in the table and the JSON. Streaming runs are closed loop (a batch sent once the system took
the one before: the system at saturation); ``--rates 0 1500 2000`` adds open-loop runs at
those offered trades/s, latency from each batch's due time (``tpcdi-rates.png``: latency
against delivered trades/s). How runs are fed and
how latency is taken without slowing the run down: ``benchmarks.tpcdi_runs``. The definitions
of every number: ``benchmarks.tpcdi_report.DEFINITIONS`` (also in the JSON). Results go to
``benchmarks/results/tpcdi.{json,png}`` (``tpcdi-quick.*`` for ``--quick``), and
``tpcdi-batches.png`` (``tpcdi-quick-batches.png``): per-batch time over each whole run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from benchmarks.common import RESULTS, machine_info, require_extras
from benchmarks.engine import write_report
from benchmarks.peak_rss import PeakRss
from benchmarks.tpcdi_coalescing import COALESCE_TRADES
from benchmarks.tpcdi_profile import profile_table
from benchmarks.tpcdi_reference import run_reference
from benchmarks.tpcdi_report import (
    DEFINITIONS,
    add_ratios,
    breakdown_table,
    check_same_rows,
    plot,
    plot_batches,
    plot_rates,
    ratios_table,
    results_table,
    to_record,
)
from benchmarks.tpcdi_runs import (
    Budget,
    Run,
    run_engine,
    run_spark_bulk,
    run_spark_streaming,
    whole_batch_events,
)
from benchmarks.tpcdi_setup import (
    DataSet,
    build_dimensions,
    create_database,
    drop_database,
    drop_schema,
    make_data,
)
from sstore.base import allocator

SYSTEMS = ("spark-bulk", "sstore", "sstore-coalescing", "reference", "spark-sss")
WHOLE = 0  # batch size: every TPC-DI batch as one chunk (sstore and reference)


@dataclass(frozen=True)
class Plan:
    scale_factors: tuple[float, ...]
    batch_trades: tuple[int, ...]
    budget: Budget
    systems: tuple[str, ...] = SYSTEMS
    warm_up: bool = True  # a throwaway Structured Streaming query before the first run
    profile: bool = False  # per-batch phase breakdown of the sstore runs (tpcdi_profile)
    coalesce_trades: int = COALESCE_TRADES  # sstore-coalescing: most trades per engine batch
    rates: tuple[float, ...] = (0.0,)  # offered trades/s of the streaming runs; 0: closed loop


FULL = Plan((1.0, 10.0), (100, 1_000, 10_000, WHOLE), Budget(phase_seconds=100.0))
QUICK = Plan((0.1,), (100, 1_000, 10_000, WHOLE), Budget(phase_seconds=25.0))


def _rate(text: str) -> float:
    """An offered rate: trades/s >= 0 (0: closed loop), never a typo read as closed loop."""
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of trades/s: {text!r}") from None
    if not rate >= 0 or rate == float("inf"):
        raise argparse.ArgumentTypeError(f"a rate is trades/s >= 0 (0: closed loop), not {text}")
    return rate


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tpcdi", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="SF 0.1 only (a few minutes)")
    parser.add_argument("--scale-factors", type=float, nargs="+",
                        help="override the plan's (full: 1 10; quick: 0.1)")
    parser.add_argument("--batch-trades", type=int, nargs="+",
                        help="override the plan's; 0 = every TPC-DI batch as one chunk")
    parser.add_argument("--profile", action="store_true",
                        help="per-batch phase breakdown of the sstore runs (a little slower)")
    parser.add_argument("--phase-seconds", type=float, help="time budget of a measured phase")
    parser.add_argument("--rates", type=_rate, nargs="+", metavar="TRADES_PER_S",
                        help="also feed the streaming systems open loop, once per rate: "
                             "batches due at that many trades/s, latency from when each was "
                             "due; 0 = closed loop (the default: each batch sent once the "
                             "system took the one before); plots tpcdi-rates.png")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, help="a subset of systems")
    parser.add_argument("--coalesce-trades", type=int, default=COALESCE_TRADES,
                        help="sstore-coalescing: at most this many trades per engine batch "
                             f"(default {COALESCE_TRADES})")
    parser.add_argument("--out", default=RESULTS, help="directory for the json and png")
    return parser.parse_args(argv)


def make_plan(args: argparse.Namespace) -> Plan:
    plan = QUICK if args.quick else FULL
    return Plan(tuple(args.scale_factors or plan.scale_factors),
                tuple(plan.batch_trades if args.batch_trades is None else args.batch_trades),
                Budget(args.phase_seconds or plan.budget.phase_seconds),
                tuple(args.systems or plan.systems), profile=args.profile,
                coalesce_trades=args.coalesce_trades, rates=tuple(args.rates or plan.rates))


def batch_events(data: DataSet, trades: int) -> int:
    """A batch of ``trades`` trades as trade events (see DEFINITIONS["batch_trades"]); 0:
    every TPC-DI batch in one chunk."""
    if trades == WHOLE:
        return whole_batch_events(data)
    return max(1, round(trades * data.total_events / data.trades))


def run_scale_factor(spark: Any, data: DataSet, url: str, plan: Plan, workdir: str,
                     progress: Progress, console: Console, warm: bool
                     ) -> tuple[list[Run], dict[str, float]]:
    """Every system of the plan on one data set, in one database; returns the runs and the
    seconds the dimension build took. ``warm``: warm Spark Structured Streaming up first."""
    sf = f"{data.scale_factor:g}"
    with console.status(f"SF {sf}: building the dimensions with Spark (once per SF)"):
        dims = build_dimensions(spark, data, url)
    console.print(f"SF {sf}: dimensions built in {sum(dims.values()):.0f} s")
    if warm and "spark-sss" in plan.systems:
        with console.status("warming up Spark Structured Streaming"):
            warm_up(spark, data, url, workdir)
    jobs: list[tuple[str, int | None, float]] = []
    if "spark-bulk" in plan.systems:
        jobs.append(("spark-bulk", None, 0.0))
    for size in plan.batch_trades:  # the streaming systems side by side, per batch size
        for rate in plan.rates if size != WHOLE else (0.0,):  # and per offered rate
            jobs += [(s, size, rate) for s in ("sstore", "sstore-coalescing", "reference",
                                               "spark-sss")
                     if s in plan.systems and not (s == "spark-sss" and size == WHOLE)
                     and not (s == "sstore-coalescing" and not 0 < size < plan.coalesce_trades)]
    overall = progress.add_task(f"SF {sf}: runs", total=len(jobs))
    runs = []
    for system, size, rate in jobs:
        budget = Budget(plan.budget.phase_seconds, rate)
        label = f"SF {sf} {system}" + ("" if size is None else " whole batches"
                                       if size == WHOLE else f" batch {size:,}") + (
            f" at {rate:,.0f} trades/s" if rate else "")
        task = progress.add_task(label, total=data.total_events)
        tick: Callable[[int], None] = lambda n, t=task: progress.advance(t, n)
        schema = f"run_{system.replace('-', '_')}_{size or 0}"
        state_dir = tempfile.mkdtemp(prefix=f"{schema}-", dir=workdir)
        memory = PeakRss()
        memory.start()
        if system == "spark-bulk":
            run = run_spark_bulk(spark, data, url, schema, tick)
        elif system in ("sstore", "sstore-coalescing"):
            run = run_engine(data, url, schema, state_dir, size or 0,
                             batch_events(data, size or 0), budget, tick, plan.profile,
                             coalesce_events=batch_events(data, plan.coalesce_trades)
                             if system == "sstore-coalescing" else 0)
        elif system == "reference":
            run = run_reference(data, url, schema, size or 0, batch_events(data, size or 0),
                                budget, tick)
        else:
            run = run_spark_streaming(spark, data, url, schema, state_dir, size or 0,
                                      batch_events(data, size or 0), budget, tick)
        run.extra.update(memory.stop())
        run.offered_trades_per_s = rate or None
        run.extra["loadavg_after"] = os.getloadavg()
        runs.append(run)
        drop_schema(url, schema)
        progress.update(task, visible=False)
        progress.advance(overall)
        console.print(f"{label}: {sum(p.seconds for p in run.phases):.1f} s in trade phases"
                      + (" (capped)" if any(p.capped for p in run.phases) else ""))
    progress.update(overall, visible=False)
    return runs, dims


def warm_up(spark: Any, data: DataSet, url: str, workdir: str) -> None:
    """A throwaway Structured Streaming query over a few batches: the JVM compiles the file
    source, the rules' plans and the JDBC reads, which would otherwise land in the first
    measured run's first micro-batches."""
    from benchmarks.tpcdi_setup import fresh_warehouse, install_dimensions
    from benchmarks.tpcdi_sss import StructuredStreamingDimTrade

    fresh_warehouse(url, "warm_up")
    install_dimensions(url, "warm_up", 1)
    job = StructuredStreamingDimTrade(spark, data.path, url, "warm_up",
                                      tempfile.mkdtemp(prefix="warm-up-", dir=workdir), "warm_up")
    try:
        job.load_dimensions(1)
        lines = data.events[1].lines
        for start in range(0, min(lines.num_rows, 1_500), 500):
            job.send(lines.slice(start, 500))
    finally:
        job.close()
        drop_schema(url, "warm_up")


def run_benchmark(plan: Plan, spark: Any, workdir: str, console: Console,
                  database: Callable[[float], str], release: Callable[[float], None]
                  ) -> dict[str, Any]:
    """The whole plan: per scale factor, data, database (``database(sf)`` gives its URL,
    ``release(sf)`` is called when it is done), dimensions, every run. Returns the report."""
    started = time.perf_counter()
    machine = {**machine_info(), "loadavg_at_start": os.getloadavg()}
    records: list[dict[str, Any]] = []
    setup: dict[str, Any] = {}
    columns = (TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        for sf in plan.scale_factors:
            with console.status(f"SF {sf:g}: generating the data set and its trade events"):
                data = make_data(sf, Path(workdir) / f"sf{sf:g}")
            url = database(sf)
            try:
                runs, dims = run_scale_factor(spark, data, url, plan, workdir, progress, console,
                                              warm=plan.warm_up and not records)
            finally:
                release(sf)
            sf_records = [to_record(run, data) for run in runs]
            check_same_rows(sf_records)
            records += sf_records
            setup[f"{sf:g}"] = {"generate_and_events_seconds": round(data.seconds, 2),
                                "dimension_build_seconds": {k: round(v, 2)
                                                            for k, v in dims.items()},
                                "trades": data.trades, "events": data.total_events,
                                "events_per_tpcdi_batch": {b: e.lines.num_rows
                                                           for b, e in data.events.items()},
                                "source_rows": data.source_rows}
    ratios = add_ratios(records)
    return {"machine": {**machine, "loadavg_at_end": os.getloadavg()},
            "plan": asdict(plan), "definitions": DEFINITIONS, "setup": setup,
            "seconds": round(time.perf_counter() - started, 1), "records": records,
            "ratios": ratios}


def make_console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=180)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    require_extras("bench", "spark")
    plan = make_plan(args)
    console = make_console()
    if os.getloadavg()[0] > 0.5:
        console.print(f"[yellow]load average is {os.getloadavg()[0]:.2f} before the run: other "
                      f"processes share the CPUs and will lower the numbers")
    console.print(f"{allocator.describe()} (every system runs in this process)")
    from migrators.spark_session import get_spark, stop_spark
    from migrators.urls import default_url

    admin = default_url()
    names = {sf: f"bench_tpcdi_{os.getpid()}_{str(sf).replace('.', '_')}"
             for sf in plan.scale_factors}
    with console.status("starting Spark (local[2])"):
        spark = get_spark("local[2]")
    try:
        with tempfile.TemporaryDirectory(prefix="sstore-bench-tpcdi-") as workdir:
            report = run_benchmark(plan, spark, workdir, console,
                                   lambda sf: create_database(admin, names[sf]),
                                   lambda sf: drop_database(admin, names[sf]))
    finally:
        stop_spark()
    console.print(results_table(report["records"]))
    console.print(ratios_table(report["ratios"]))
    console.print(breakdown_table([r for r in report["records"]
                                   if r["system"] in ("sstore", "sstore-coalescing",
                                                      "spark-sss")]))
    if plan.profile:
        console.print(profile_table(report["records"]))
    mismatched = [r for r in report["records"] if not r.get("matches")]
    for r in mismatched:
        console.print(f"[red]SF {r['scale_factor']:g} {r['system']} batch {r['batch_trades']}: "
                      f"not the same rows as the reference: {r['result']}")
    report["command"] = " ".join(["python -m benchmarks.tpcdi",
                                  *(sys.argv[1:] if argv is None else argv)])
    name = "tpcdi-quick" if args.quick else "tpcdi"
    path = write_report(report, args.out, name)
    plot(report["records"], os.path.splitext(path)[0] + ".png")
    plot_batches(report["records"], os.path.splitext(path)[0] + "-batches.png")
    rates = plot_rates(report["records"], os.path.splitext(path)[0] + "-rates.png")
    console.print(f"wrote {path}, {name}.png, {name}-batches.png"
                  + (f" and {name}-rates.png" if rates else "") + f" in {report['seconds']} s")
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
