"""Benchmark of the sstore engine against the DuckDB code a user would write without it, and
against the streaming engine a user would pick instead: Spark Structured Streaming.

Run ``python -m benchmarks.engine`` (about 10 minutes on 2 cores) or ``--quick`` (about
2 minutes, most of it Spark starting and compiling; ``--no-spark`` leaves Spark out).

What it measures, for each workload x durability mode x batch size (1, 100, 1,000, 10,000):

- ``te_per_s``: procedure transaction executions (TEs) committed per second. For the baseline
  and Spark it is their transactions per second (one per batch), so compare
  ``batches_per_s``/``rows_per_s``. ``ms_per_te`` is its inverse: everything a batch costs
  (ingest, TEs, GC) divided by its TEs.
- ``rows_per_s``: input rows pushed through the whole dataflow per second.
- ``p50_ms``/``p99_ms``: latency of one batch from just before the system gets it (``ingest``;
  for Spark, writing its file) to the COMMIT of its last transaction.

Systems (``benchmarks.engine_workloads``, ``benchmarks.engine_spark``): the engine running the
3-procedure ``chain`` and the ``voter``; the chain by hand on DuckDB (``baseline``), in both
durability modes; the chain on Spark Structured Streaming (``spark``: files in, foreachBatch,
state in a DuckDB file, so full durability only), checked to end with the engine's per-user
totals. The driver is closed-loop (``benchmarks.engine_driver``). Each configuration is bounded
by batches, rows and seconds, and the full run makes two passes over all of them and keeps each
one's faster pass (the machine is shared; see ``best_passes``). Spark starts once per run.

Then the chain (both modes) and the voter (full durability) run once more, batch size 100, under
cProfile (``benchmarks.engine_profile``): how many DuckDB calls a TE makes and from where, how
long each takes, and where the time of a batch goes, phase by phase.

State files live in a temporary directory that is removed at the end. Results go to
``benchmarks/results/engine.{json,png}`` (``engine-quick.*`` for ``--quick``, so a quick check
never overwrites the numbers of a full run). Other processes on the machine lower the numbers:
the json keeps the load average of each configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import pyarrow as pa
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from benchmarks.common import RESULTS, machine_info, require_extras, write_results
from benchmarks.engine_driver import (
    FULL_BUDGET,
    QUICK_BUDGET,
    Budget,
    Config,
    run_baseline,
    run_engine,
    to_record,
)
from benchmarks.engine_profile import profile_phases
from benchmarks.engine_report import calls_table, phases_table, plot, results_table, spark_table
from benchmarks.engine_workloads import CHAIN, Workload, load_voter

BATCH_SIZES = (1, 100, 1_000, 10_000)
MODES = ("full", "weak")
SPARK_MODE = "full"  # its state is a DuckDB file: the engine's full durability
SEED = 42
PROFILE_BATCH_SIZE = 100


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short run (about 2 minutes)")
    parser.add_argument("--no-spark", action="store_true", help="leave Spark out")
    parser.add_argument("--out", default=RESULTS, help="directory for the json and png")
    return parser.parse_args(argv)


def plan(workloads: Sequence[Workload], spark: bool) -> list[Config]:
    """The engine, the baseline and Spark side by side for each mode and batch size."""
    configs = []
    for mode in MODES:
        for size in BATCH_SIZES:
            for w in workloads:
                configs.append(Config(w.name, mode, size))
                if w.name == "chain":
                    configs.append(Config("baseline", mode, size))
                    if spark and mode == SPARK_MODE:
                        configs.append(Config("spark", mode, size))
    return configs


def run_config(config: Config, workloads: dict[str, Workload], sources: dict[str, pa.Table],
               budget: Budget, workdir: str, spark: Any, tick: Callable[[], None]
               ) -> dict[str, Any]:
    state_dir = tempfile.mkdtemp(prefix=f"{config.workload}-{config.mode}-{config.batch_size}-",
                                 dir=workdir)
    try:
        if config.workload == "baseline":
            m = run_baseline(config.mode, config.batch_size, budget, sources["chain"], state_dir,
                             tick)
        elif config.workload == "spark":
            from benchmarks.engine_spark import run_spark
            m = run_spark(spark, config.batch_size, budget, sources["chain"], state_dir, tick)
        else:
            w = workloads[config.workload]
            m = run_engine(w, config.mode, config.batch_size, budget, sources[w.name],
                           state_dir, tick)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    return to_record(config, m)


def run_all(configs: list[Config], workloads: dict[str, Workload], sources: dict[str, pa.Table],
            budget: Budget, workdir: str, spark: Any, console: Console) -> list[dict[str, Any]]:
    """Every configuration, ``budget.passes`` times over, with a progress bar; keeps the best
    pass of each configuration (see ``best_passes``)."""
    runs: list[dict[str, Any]] = []
    columns = (TextColumn("{task.description:<30}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        overall = progress.add_task("configurations", total=len(configs) * budget.passes)
        for n in range(budget.passes):
            for config in configs:
                warmup = budget.spark_warmup_batches if config.workload == "spark" \
                    else budget.warmup_batches
                total = budget.batches_for(config.batch_size) + warmup
                label = f"{config.workload} {config.mode} {config.batch_size:,} ({n + 1})"
                task = progress.add_task(label, total=total)
                runs.append(run_config(config, workloads, sources, budget, workdir, spark,
                                       lambda t=task: progress.advance(t)))
                progress.update(task, completed=total, visible=False)
                progress.advance(overall)
    return best_passes(runs)


def best_passes(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per configuration: the pass with the highest throughput.

    This machine is shared (other sessions run test suites on the same 2 cores), and another
    process's burst only ever makes a pass slower, so the fastest pass is the least disturbed
    one. Every pass's rows/s stays in ``passes_rows_per_s`` to show how noisy the run was.
    """
    by_config: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for run in runs:
        by_config.setdefault((run["workload"], run["mode"], run["batch_size"]), []).append(run)
    best = []
    for group in by_config.values():
        record = dict(max(group, key=lambda r: r["rows_per_s"]))
        record["passes_rows_per_s"] = [r["rows_per_s"] for r in group]
        best.append(record)
    return best


def profile_plan(workloads: dict[str, Workload]) -> list[tuple[str, str]]:
    """The chain in both modes (weak adds the input log's fsync), every other workload in full."""
    return [("chain", "full"), ("chain", "weak")] + [(name, "full") for name in workloads
                                                     if name != "chain"]


def start_spark(console: Console, source: pa.Table, workdir: str, budget: Budget) -> Any:
    """The run's Spark (one JVM for every Spark configuration), warmed up, or None if it
    cannot start."""
    from benchmarks.engine_spark import SparkRun, SparkUnavailable
    try:
        with console.status("starting Spark (local[2]) and caching the lookup table"):
            spark = SparkRun()
    except SparkUnavailable as exc:
        console.print(f"[yellow]Spark cannot start, Spark Structured Streaming skipped: {exc}")
        return None
    with console.status("warming up Spark's JVM with a throwaway streaming query"):
        spark.warm_up(source, tempfile.mkdtemp(dir=workdir), 2 * budget.spark_warmup_batches)
    return spark


def make_console() -> Console:
    """Wide enough for the tables even when the output goes to a file or a pipe."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def write_report(report: dict[str, Any], out: str, name: str) -> str:
    """``<out>/<name>.json`` (through ``benchmarks.common`` for the results directory)."""
    if os.path.abspath(out) == RESULTS:
        return write_results(name, report)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, default=str)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    require_extras("bench", *(() if args.no_spark else ("spark",)))
    budget = QUICK_BUDGET if args.quick else FULL_BUDGET
    console = make_console()
    started = time.perf_counter()
    # before the run: the code measured, the load it started under
    machine = {**machine_info(), "loadavg_at_start": os.getloadavg()}
    if machine["loadavg_at_start"][0] > 0.5:
        console.print(f"[yellow]load average is {machine['loadavg_at_start'][0]:.2f} before the "
                      f"run: other processes share the CPUs and will lower the numbers")
    workloads = {"chain": CHAIN}
    voter = load_voter()
    if voter is not None:
        workloads["voter"] = voter
    else:
        console.print("[yellow]sstore.workloads.voter is not importable: voter skipped")
    rows = budget.rows_needed(BATCH_SIZES)
    with console.status(f"generating {rows:,} input rows per workload"):
        sources = {name: w.make_input(rows, SEED) for name, w in workloads.items()}
    with tempfile.TemporaryDirectory(prefix="sstore-bench-") as workdir:
        spark = None if args.no_spark else start_spark(console, sources["chain"], workdir,
                                                        budget)
        try:
            records = run_all(plan(list(workloads.values()), spark is not None), workloads,
                              sources, budget, workdir, spark, console)
        finally:
            if spark is not None:
                spark.close()  # before profiling: no idle JVM beside it
        with console.status("profiling"):
            profiles = [profile_phases(workloads[name], mode, PROFILE_BATCH_SIZE,
                                       budget.profile_batches, sources[name],
                                       tempfile.mkdtemp(dir=workdir))
                        for name, mode in profile_plan(workloads)]
    console.print(results_table(records))
    table = spark_table(records)
    if table is not None:
        console.print(table)
    for profile in profiles:
        if profile["workload"] == "chain":
            console.print(phases_table(profile))
        if profile["mode"] == "full":
            console.print(calls_table(profile))
        for gap in profile["missing"]:
            console.print(f"[red]profile of {profile['workload']} ({profile['mode']}): phase "
                          f"missing, the engine's code changed: {gap}")
    name = "engine-quick" if args.quick else "engine"
    report = {"machine": {**machine, "loadavg_at_end": os.getloadavg()},
              "budget": asdict(budget), "spark": spark is not None,
              "seconds": round(time.perf_counter() - started, 1), "records": records,
              "profiles": profiles}
    path = write_report(report, args.out, name)
    plot(records, os.path.splitext(path)[0] + ".png")
    console.print(f"wrote {path} and {name}.png in {report['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
