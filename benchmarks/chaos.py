"""The chaos run: TPC-DI DimTrade streamed into PostgreSQL while faults are injected at random;
at the end the warehouse must equal an uncrashed run's, row for row.

Run ``python -m benchmarks.chaos`` (SF 0.1, 120 faults) or ``--quick`` (SF 0.01, 12 faults, a
few minutes, for CI). ``--model [--seconds N] [--seed N]`` runs the model of issue 34 instead
(``benchmarks.model``): random programs checked against a plain-Python model after every step.
``--seed`` picks the faults, ``--kinds`` a subset of them, ``--faults`` their number. The run is a
check: it exits 1 if a row is lost, duplicated or different, or if fewer than five sixths of the
planned faults landed (100 of 120, 10 of 12) or a kind never landed; 2 if it could not finish (the
reason is printed).

1. A private PostgreSQL (``migrators.embedded_postgres``) in a temporary directory: the run
   crashes and restarts it, so it must not be the machine's shared server.
2. A TPC-DI data set (``sstore tpcdi generate``, with malformed Trade.txt rows in Batch2/3 and
   two malformed TradeHistory.txt lines in Batch1, so both reject paths carry rows); its
   dimensions are built once with Spark (``benchmarks.tpcdi_setup``: a snapshot per batch).
3. The reference: the engine worker (``benchmarks.chaos_worker``) run once, undisturbed, into
   the schema ``reference``.
4. The chaos run (``benchmarks.chaos_run``, faults in ``benchmarks.chaos_faults``): the same
   worker into the schema ``chaos``, SIGKILLed, its migrators SIGKILLed, PostgreSQL crashed
   and restarted, its COPY backends terminated, its target reset from scratch; restarted
   until it finishes.
5. ``dimtrade``, ``dimessages`` and ``rejects`` of both schemas compared as multisets of rows
   (``benchmarks.chaos_compare``). Printed, and written to ``benchmarks/results/chaos.json``
   (``chaos-quick.json`` for ``--quick``) with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.chaos_compare import TableDiff, compare_warehouses
from benchmarks.chaos_faults import KINDS, make_plan
from benchmarks.chaos_procs import Worker
from benchmarks.chaos_run import ChaosAborted, ChaosLog, ChaosRun, Settings
from benchmarks.common import RESULTS, machine_info
from benchmarks.engine import write_report
from migrators.embedded_postgres import PrivatePostgres, PrivatePostgresError

DATABASE = "sstore_chaos"
#: Malformed Batch1 TradeHistory.txt lines: the file readers reject them before the stream,
#: and the pipeline stores them once under a watermark of their own.
BATCH1_BAD_LINES = ("999999991|not a date|CMPT", "999999992|2017-07-07 10:00:00")


@dataclass(frozen=True)
class Plan:
    scale_factor: float
    batch_size: int  # trade events per engine batch
    faults: int
    bad_rows: int  # malformed Trade.txt rows in Batch2/3 (the generator's --bad-rows)
    stall_seconds: float


FULL = Plan(0.1, 100, 120, 20, 300.0)
QUICK = Plan(0.01, 50, 12, 4, 120.0)


def minimum_landed(planned: int) -> int:
    """Faults that must land: five sixths of the plan (100 of the full run's 120, 10 of the
    quick run's 12). The rest may miss: a fault with nothing to hit is tried three times."""
    return -(-planned * 5 // 6)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="SF 0.01, 12 faults (CI)")
    parser.add_argument("--seed", type=int, default=1, help="picks the faults (default 1)")
    parser.add_argument("--faults", type=int, help="faults to inject (default: the plan's)")
    parser.add_argument("--kinds", type=lambda s: tuple(k.strip() for k in s.split(",")),
                        default=KINDS, help=f"comma-separated subset of {','.join(KINDS)}")
    parser.add_argument("--scale-factor", type=float, help="override the plan's")
    parser.add_argument("--batch-size", type=int, help="events per engine batch")
    parser.add_argument("--out", default=RESULTS, help="directory for the JSON")
    parser.add_argument("--workdir", help="keep the data, state files and logs here")
    model = parser.add_argument_group(
        "the model (--model)", "random programs against a plain-Python model, checked after "
        "every step (benchmarks.model; docs/chaos.md); SSTORE_MODEL_SKIP=op,op leaves "
        "operations out")
    model.add_argument("--model", action="store_true",
                       help="run the model instead of the TPC-DI chaos run")
    model.add_argument("--seconds", type=float, default=60.0,
                       help="how long the model runs (default 60; at least one round)")
    model.add_argument("--postgres", default=None,
                       help="a PostgreSQL server the model makes a database of its own on, "
                            "never restarted (default: a private server of the run's own, "
                            "which the model stops and starts)")
    return parser.parse_args(argv)


def make_plan_of(args: argparse.Namespace) -> Plan:
    plan = QUICK if args.quick else FULL
    return Plan(args.scale_factor or plan.scale_factor, args.batch_size or plan.batch_size,
                args.faults or plan.faults, plan.bad_rows, plan.stall_seconds)


# ------------------------------------------------------------------------------ setup
def make_data(plan: Plan, out: Path) -> list[int]:
    """Generate the data set (deterministic), add the Batch1 malformed lines; return the
    trade events of each TPC-DI batch."""
    from sstore.workloads.tpcdi.generator import generate
    from sstore.workloads.tpcdi.streaming.events import (
        batch1_events,
        incremental_events,
    )

    generate(plan.scale_factor, out, seed=0, bad_rows=plan.bad_rows)
    with open(out / "Batch1" / "TradeHistory.txt", "a", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in BATCH1_BAD_LINES))
    return [batch1_events(out).lines.num_rows] + [incremental_events(out, b).lines.num_rows
                                                  for b in (2, 3)]


def build_dimensions(data_dir: Path, url: str) -> float:
    """The dimensions of every batch, once, with Spark (snapshots ``tpcdi_dims_b1..b3``)."""
    from benchmarks.tpcdi_setup import DataSet
    from benchmarks.tpcdi_setup import build_dimensions as build
    from migrators.spark_session import get_spark, stop_spark

    t0 = time.perf_counter()
    spark = get_spark("local[2]")
    try:
        build(spark, DataSet(0.0, data_dir, {}, {}, 0.0), url)
    finally:
        stop_spark()
    return time.perf_counter() - t0


def run_reference(settings: Settings, batch_events: Sequence[int]) -> tuple[float, float]:
    """Step 3; returns (seconds, seconds from start to the first engine batch)."""
    offsets = {b: sum(batch_events[:b - 1]) for b in (1, 2, 3)}
    args = ["--data", str(settings.data_dir), "--url", settings.url, "--state",
            settings.state, "--schema", settings.schema, "--batch-size",
            str(settings.batch_size)]
    worker = Worker(args, "chaos-reference", settings.logs / "reference.log", offsets, 0)
    code = worker.wait(timeout=settings.stall_seconds * 10)
    if code != 0 or not worker.finished:
        log = (settings.logs / "reference.log").read_text(errors="replace")[-3000:]
        raise ChaosAborted(f"the reference run failed (exit {code}):\n{log}")
    startup = (worker.first_tick_at or worker.last_tick_at) - worker.started_at
    return worker.last_tick_at - worker.started_at, startup


# ------------------------------------------------------------------------------ report
def summarize(plan: Plan, args: argparse.Namespace, batch_events: Sequence[int],
              log: ChaosLog | None, diffs: list[TableDiff], seconds: dict[str, float],
              aborted: str | None) -> dict[str, Any]:
    landed = log.landed if log else []
    by_kind = Counter(i.kind for i in landed)
    by_variant = Counter(f"{i.kind} {i.variant}".strip() for i in landed)
    chaos_rows = {d.table: d.chaos_rows for d in diffs}
    problems = []
    if aborted:
        problems.append(f"aborted: {aborted}")
    if len(landed) < minimum_landed(plan.faults):
        problems.append(f"{len(landed)} faults landed; {plan.faults} planned, at least "
                        f"{minimum_landed(plan.faults)} must land")
    missing_kinds = [k for k in args.kinds if by_kind[k] == 0]
    if missing_kinds:
        problems.append(f"no fault of kind {', '.join(missing_kinds)} landed")
    for d in diffs:
        if not d.identical:
            problems.append(f"{d.table}: {d.lost} lost, {d.duplicates} duplicated, "
                            f"{d.unexpected} unexpected rows")
    return {
        "plan": asdict(plan), "seed": args.seed, "kinds": list(args.kinds),
        "faults_injected": len(landed), "faults_by_kind": dict(by_kind),
        "faults_by_variant": dict(by_variant),
        "misses": Counter(i.kind for i in log.injections if not i.landed) if log else {},
        "engine_sigkills": log.engine_sigkills if log else 0,
        "worker_runs": len(log.workers) if log else 0,
        "worker_errors": log.worker_errors if log else [],
        "migrate_runs": log.migrate_runs if log else 0,
        "extra_resets": log.extra_resets if log else 0,
        "not_injected": log.not_injected if log else 0,
        "rows_in": sum(batch_events), "events_per_tpcdi_batch": list(batch_events),
        "loaded": chaos_rows.get("dimtrade", 0) + chaos_rows.get("dimessages", 0),
        "rejected": chaos_rows.get("rejects", 0),
        "duplicates": sum(d.duplicates for d in diffs), "lost": sum(d.lost for d in diffs),
        "unexpected": sum(d.unexpected for d in diffs),
        "identical": bool(diffs) and all(d.identical for d in diffs),
        "tables": [d.to_dict() for d in diffs],
        "injections": [i.to_dict() for i in log.injections] if log else [],
        "workers": log.workers if log else [],
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "aborted": aborted, "problems": problems, "ok": not problems,
    }


def print_report(console: Console, report: dict[str, Any]) -> None:
    faults = Table(title=f"faults injected (seed {report['seed']})")
    for name in ("kind", "landed", "variants", "missed"):
        faults.add_column(name, justify="left" if name in ("kind", "variants") else "right")
    for kind in report["kinds"]:
        variants = ", ".join(f"{v.split(' ', 1)[1]} {n}" for v, n in
                             sorted(report["faults_by_variant"].items())
                             if v.startswith(kind + " "))
        faults.add_row(kind, str(report["faults_by_kind"].get(kind, 0)), variants,
                       str(report["misses"].get(kind, 0)))
    faults.add_row("total", str(report["faults_injected"]), "", str(sum(
        report["misses"].values())))
    console.print(faults)
    tables = Table(title="chaos warehouse against the uncrashed reference")
    for name in ("table", "reference rows", "chaos rows", "lost", "duplicates", "unexpected",
                 "identical"):
        tables.add_column(name, justify="left" if name == "table" else "right")
    for t in report["tables"]:
        tables.add_row(t["table"], f"{t['reference_rows']:,}", f"{t['chaos_rows']:,}",
                       str(t["lost"]), str(t["duplicates"]), str(t["unexpected"]),
                       "yes" if t["identical"] else "[red]NO[/]")
    console.print(tables)
    for t in report["tables"]:
        for kind in ("lost", "duplicate", "unexpected"):
            if t[f"{kind}_keys"]:
                console.print(f"  {t['table']} {kind} ({', '.join(KEY_NAMES[t['table']])}):"
                              f" {t[f'{kind}_keys']}", soft_wrap=True)
    s = report["seconds"]
    console.print(
        f"rows in (trade events): {report['rows_in']:,}; loaded (dimtrade + dimessages rows): "
        f"{report['loaded']:,}; rejected: {report['rejected']:,}; duplicates: "
        f"{report['duplicates']}; lost: {report['lost']}; unexpected: {report['unexpected']}")
    console.print(
        f"worker runs: {report['worker_runs']} (engine SIGKILLs {report['engine_sigkills']}, "
        f"exits with an error {len(report['worker_errors'])}); sstore migrate runs: "
        f"{report['migrate_runs']}; seconds: {', '.join(f'{k} {v}' for k, v in s.items())}")
    for error in sorted(set(report["worker_errors"])):
        console.print(f"  worker error: {error}", soft_wrap=True)
    if report["ok"]:
        console.print("[bold green]the chaos warehouse equals the reference, row for row[/]")
    for problem in report["problems"]:
        console.print(f"[bold red]{problem}[/]", soft_wrap=True)


KEY_NAMES = {"dimtrade": ("tradeid",), "dimessages": ("batchid", "text", "data"),
             "rejects": ("batch", "line", "reason")}


# ------------------------------------------------------------------------------ main
def run(plan: Plan, args: argparse.Namespace, workdir: Path, console: Console
        ) -> dict[str, Any]:
    seconds: dict[str, float] = {}
    began = time.perf_counter()
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    pg = PrivatePostgres(workdir / "pg")
    with console.status("starting a private PostgreSQL"):
        pg.start()
    log: ChaosLog | None = None
    diffs: list[TableDiff] = []
    aborted = None
    try:
        url = pg.create_database(DATABASE)
        with console.status(f"generating TPC-DI SF {plan.scale_factor:g}"):
            batch_events = make_data(plan, workdir / "data")
        with console.status("building the dimensions with Spark (once)"):
            seconds["dimensions (Spark)"] = build_dimensions(workdir / "data", url)
        console.print(f"data set: {sum(batch_events):,} trade events {batch_events}; "
                      f"dimensions in {seconds['dimensions (Spark)']:.0f} s")

        def settings(schema: str) -> Settings:
            return Settings(workdir / "data", url, schema, str(workdir / f"{schema}.duckdb"),
                            plan.batch_size, logs, stall_seconds=plan.stall_seconds)

        with console.status("the reference run (no faults)"):
            seconds["reference"], startup = run_reference(settings("reference"), batch_events)
        console.print(f"reference: {seconds['reference']:.1f} s")
        rng = random.Random(args.seed)
        faults = make_plan(rng, plan.faults, args.kinds)
        chaos = ChaosRun(pg, settings("chaos"), batch_events, rng, startup, args.kinds)
        try:
            with console.status(f"the chaos run ({plan.faults} faults)"):
                log = chaos.run(faults)
        except (ChaosAborted, PrivatePostgresError) as exc:  # e.g. PostgreSQL did not come back
            aborted, log = f"{type(exc).__name__}: {exc}", chaos.log
        seconds["chaos"] = chaos.log.seconds or time.monotonic() - chaos.began
        diffs = compare_warehouses(url, "reference", "chaos")  # also after an abort: a hint
    finally:
        pg.stop("fast")
    seconds["total"] = time.perf_counter() - began
    return summarize(plan, args, batch_events, log, diffs, seconds, aborted)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model:
        from benchmarks.model import run as model_run
        return model_run.main(args.seconds, args.seed, args.postgres, args.out)
    plan = make_plan_of(args)
    console = Console() if Console().is_terminal else Console(width=160)
    machine = {**machine_info(), "loadavg_at_start": os.getloadavg()}
    if args.workdir:
        report = run(plan, args, Path(args.workdir), console)
    else:
        with tempfile.TemporaryDirectory(prefix="sstore-chaos-") as workdir:
            report = run(plan, args, Path(workdir), console)
    report["machine"] = {**machine, "loadavg_at_end": os.getloadavg()}
    print_report(console, report)
    path = write_report(report, args.out, "chaos-quick" if args.quick else "chaos")
    console.print(f"wrote {path}")
    if report["aborted"]:
        return 2
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
