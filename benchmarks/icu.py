"""ICU monitoring benchmark: readings/s and alert latency, the engine beside Spark Structured
Streaming on the same arrival batches, alerts and windows checked equal.

    python -m benchmarks.icu            # 100, 1,000 and 10,000 patients, 420 s of event time
    python -m benchmarks.icu --quick    # 100 and 1,000 patients, 360 s

For each size the generator (``sstore.workloads.icu``) makes the readings of N patients with
injected episodes and noise, cut into arrival batches of 5 s. Then:

- **sstore**: a fresh state file, the ICU dataflow with its four PostgreSQL sinks attached (one
  `SinkGroup`),
  every batch sent with ``Engine.ingest_and_run`` as fast as it goes. readings/s = readings /
  time to feed and run them all (the sinks deliver meanwhile, on the same two cores).
- **Spark Structured Streaming** (``benchmarks.icu_sss``): every batch a Parquet file in a
  watched directory, closed loop (the next file once Spark has processed the last).
  readings/s = readings / time until the last micro-batch committed.
- **Alert latency**: from the moment the arrival batch that closed the alert's window was
  sent, to the COMMIT that put the alert in PostgreSQL (the engine: its alert sink's
  ``on_delivered``; Spark: after foreachBatch's COMMIT). The batch that closes a window is the
  first whose newest reading moves the watermark past the window's end: ``delay`` (5 s) for
  the engine, which fires early and corrects later, ``delay + allowed lateness`` (65 s) for
  Spark, whose append mode emits a window once (see ``icu_sss``). Both replay faster than
  real time, so the latency is processing time, not event time.
- **Checks**: both alert each injected episode exactly once (``run.match``), both alert the
  same episodes (``alerts_equal``; ``alert_ids_equal`` says whether the ids and order agree
  too, ``alerts_first_window_differs`` how many alerts name another first window: the engine
  alerts on a window's first firing, Spark on its final state, so a window that only late
  rows made abnormal alerts later on the engine), and every window Spark emitted equals the
  engine's final revision of it in PostgreSQL (n exactly, aggregates within 0.011;
  ``windows_last_digit`` counts those not bit-identical).

Writes ``benchmarks/results/icu.json`` and ``icu.png`` (``icu-quick.*`` with --quick).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import psycopg
import pyarrow.compute as pc
from rich.console import Console
from rich.table import Table

from benchmarks.common import fresh_database, machine_info, percentile, write_results
from migrators.sink_runner import SinkGroup
from sstore.base.extras import needs
from sstore.engine import Engine
from sstore.workloads.icu import dataflow, rules, run
from sstore.workloads.icu.generator import Generated, generate

BATCH_SECONDS = 5
SEED = 1
RATE_PER_HOUR = 20.0  # episodes per patient per hour of event time
TOLERANCE = 0.011  # aggregates are rounded to 2-4 places; the two round halves differently


def closing_batches(gen: Generated, lag_seconds: int) -> list[Any]:
    """For each arrival batch (1-based), the newest good reading's time so far minus
    ``lag_seconds``: the watermark after that batch."""
    import datetime
    marks, newest = [], None
    lag = datetime.timedelta(seconds=lag_seconds)
    for table in gen.batches:
        ts = table.filter(pc.invert(pc.is_null(table["ts"])))["ts"]
        top = pc.max(ts).as_py() if len(ts) else None
        if top is not None and (newest is None or top > newest):
            newest = top
        marks.append(None if newest is None else newest - lag)
    return marks


def first_batch_past(marks: list[Any], end: Any) -> int:
    for i, mark in enumerate(marks):
        if mark is not None and mark >= end:
            return i + 1
    return len(marks)


def run_engine(gen: Generated, url: str, workdir: str) -> dict[str, Any]:
    engine = Engine(os.path.join(workdir, "icu.duckdb"))
    dataflow.declare(engine)
    delivered: dict[int, float] = {}

    def on_delivered(stream: str, d: Any) -> None:
        if stream == dataflow.ALERTS:
            for b in d.batch_ids:
                delivered.setdefault(b, d.committed_at)

    sinks = run.make_sinks(engine, url, "icu", on_delivered)
    group = SinkGroup(sinks)  # as the demo: one PostgreSQL transaction per batch for all four
    group.attach()
    fed = run.feed(engine, gen.batches)
    began_flush = time.perf_counter()
    if not group.flush(timeout=600):
        raise RuntimeError(f"the sinks did not catch up: "
                           f"{[(s.table, s.last_error) for s in sinks if s.last_error]}")
    flush = time.perf_counter() - began_flush
    group.detach()
    alerts = run.alert_rows(engine)
    counts = run.counts(engine)
    engine.close()
    latencies = [(delivered[a["batch_id"]] - fed.sent_at[a["batch_id"]]) * 1000
                 for a in alerts]
    return {"alerts": alerts, "counts": counts, "seconds": fed.seconds, "flush_s": flush,
            "rows": fed.rows, "latencies_ms": latencies}


def run_spark(gen: Generated, url: str, workdir: str, spark: Any) -> dict[str, Any]:
    from benchmarks.icu_sss import WATERMARK_S, StructuredStreamingIcu

    job = StructuredStreamingIcu(spark, url, "icu_sss", workdir, f"icu_{len(gen.batches)}")
    sent: list[float] = []
    began = time.perf_counter()
    try:
        for i, table in enumerate(gen.batches):
            sent.append(job.send(i + 1, table))
        seconds = time.perf_counter() - began
    finally:
        job.close()
    marks = closing_batches(gen, WATERMARK_S)
    latencies = [(a["committed_at"] - sent[first_batch_past(marks, a["window_end"]) - 1])
                 * 1000 for a in job.alerts]
    return {"alerts": job.alerts, "seconds": seconds, "rows": gen.rows,
            "latencies_ms": latencies, "micro_batches": job.micro_batches,
            "windows": job.windows_emitted}


def _by_episode(alerts: list[dict], gen: Generated) -> dict[tuple, dict]:
    """Each alert under the (patient, kind, start) of the injected episode it matches."""
    out = {}
    for alert in alerts:
        for ep in gen.episodes:
            if (ep.patient, ep.kind) == (alert["patient"], alert["kind"]) \
                    and alert["window_start"] < ep.end and alert["window_end"] > ep.start:
                out[(ep.patient, ep.kind, ep.start)] = alert
    return out


def compare(url: str, engine: dict[str, Any], spark: dict[str, Any], gen: Generated
            ) -> dict[str, Any]:
    """The same alerts: one per episode on both sides, for the same episodes (an alert's id
    and its first window may differ: the engine alerts on a window's first firing, Spark on
    its final state, so a window that only late rows made abnormal alerts later, hence
    possibly in another order, on the engine). Spark's windows equal the engine's finals."""
    ours, theirs = _by_episode(engine["alerts"], gen), _by_episode(spark["alerts"], gen)
    same_episodes = set(ours) == set(theirs) and len(ours) == len(engine["alerts"]) \
        and len(theirs) == len(spark["alerts"])
    first_window = sum(1 for k in set(ours) & set(theirs)
                       if ours[k]["window_start"] != theirs[k]["window_start"])
    same_ids = [(a["alert_id"], a["patient"], a["kind"]) for a in engine["alerts"]] == \
        [(a["alert_id"], a["patient"], a["kind"]) for a in spark["alerts"]]
    with psycopg.connect(url) as con:
        rows = con.execute(
            "SELECT count(*), count(e.patient), "
            "count(*) FILTER (WHERE e.n IS DISTINCT FROM s.n OR abs(e.mean_pap - s.mean_pap) "
            "> %s OR abs(e.mean_hr - s.mean_hr) > %s "
            "OR abs(coalesce(e.irregularity, 0) - coalesce(s.irregularity, 0)) > %s), "
            "count(*) FILTER (WHERE e.mean_pap <> s.mean_pap OR e.mean_hr <> s.mean_hr "
            "OR e.irregularity IS DISTINCT FROM s.irregularity), "
            "(SELECT count(*) FROM icu.patient_windows) "
            "FROM icu_sss.patient_windows AS s LEFT JOIN icu.patient_windows AS e "
            "USING (patient, window_start)", (TOLERANCE, TOLERANCE, TOLERANCE)).fetchone()
    spark_windows, matched, differ, rounding, engine_windows = rows
    return {"alerts_equal": same_episodes, "alert_ids_equal": same_ids,
            "engine_alerts": len(engine["alerts"]), "spark_alerts": len(spark["alerts"]),
            "alerts_first_window_differs": first_window,
            "spark_windows": spark_windows, "spark_windows_in_engine": matched,
            "windows_differ": differ, "windows_last_digit": rounding,
            "engine_windows": engine_windows,
            "windows_equal": matched == spark_windows and differ == 0}


def measure(patients: int, seconds: int, base_url: str, spark: Any | None,
            console: Console, database: str = "sstore_bench_icu") -> dict[str, Any]:
    t0 = time.perf_counter()
    gen = generate(patients, seconds, seed=SEED, batch_seconds=BATCH_SECONDS,
                   rate_per_hour=RATE_PER_HOUR)
    console.print(f"[bold]{patients:,} patients[/]: {gen.rows:,} readings in "
                  f"{len(gen.batches)} batches, {len(gen.episodes)} episodes "
                  f"(generated in {time.perf_counter() - t0:.1f} s)")
    url = fresh_database(base_url, database)
    record: dict[str, Any] = {"patients": patients, "seconds_event_time": seconds,
                              "readings": gen.rows, "batches": len(gen.batches),
                              "episodes": len(gen.episodes)}
    with tempfile.TemporaryDirectory(prefix="bench-icu-") as tmp:
        eng = run_engine(gen, url, tmp)
        verdict = run.match(eng["alerts"], gen.episodes)
        record["sstore"] = _summary(eng) | {"flush_s": round(eng["flush_s"], 2),
                                             "ground_truth_ok": verdict.ok,
                                             "counts": eng["counts"]}
        console.print(f"  sstore: {record['sstore']['readings_per_s']:,} readings/s, alert "
                      f"p50 {record['sstore']['p50_ms']} ms, ground truth "
                      f"{'ok' if verdict.ok else verdict.describe(gen.episodes)}")
        if spark is not None:
            sss = run_spark(gen, url, os.path.join(tmp, "spark"), spark)
            sverdict = run.match(sss["alerts"], gen.episodes)
            record["spark"] = _summary(sss) | {"ground_truth_ok": sverdict.ok,
                                               "micro_batches": sss["micro_batches"]}
            record["same"] = compare(url, eng, sss, gen)
            console.print(f"  spark:  {record['spark']['readings_per_s']:,} readings/s, alert "
                          f"p50 {record['spark']['p50_ms']} ms; same: {record['same']}")
    return record


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    lat = result["latencies_ms"]
    return {"seconds": round(result["seconds"], 2),
            "readings_per_s": int(result["rows"] / result["seconds"]),
            "alerts": len(result["alerts"]),
            "p50_ms": round(percentile(lat, 0.5), 1), "p99_ms": round(percentile(lat, 0.99), 1)}


def results_table(records: list[dict[str, Any]]) -> Table:
    table = Table(title="ICU monitoring: readings/s and alert latency (arrival -> in PostgreSQL)")
    for col in ("patients", "readings", "system", "readings/s", "alerts", "p50 ms", "p99 ms",
                "ground truth", "equal"):
        table.add_column(col, justify="right")
    for r in records:
        for system in ("sstore", "spark"):
            if system not in r:
                continue
            s = r[system]
            same = r.get("same")
            equal = "-" if same is None else \
                ("yes" if same["alerts_equal"] and same["windows_equal"] else "NO")
            table.add_row(f"{r['patients']:,}", f"{r['readings']:,}", system,
                          f"{s['readings_per_s']:,}", str(s["alerts"]), f"{s['p50_ms']:,}",
                          f"{s['p99_ms']:,}", "ok" if s["ground_truth_ok"] else "WRONG", equal)
    return table


def plot(records: list[dict[str, Any]], path: str) -> None:
    with needs("bench"):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for system, color in (("sstore", "tab:blue"), ("spark", "tab:orange")):
        series = [r for r in records if system in r]
        if not series:
            continue
        xs = [r["patients"] for r in series]
        axes[0].plot(xs, [r[system]["readings_per_s"] for r in series], "o-", color=color,
                     label=system)
        timed = [r for r in series if r[system]["alerts"]]  # no alert: no latency
        axes[1].plot([r["patients"] for r in timed], [r[system]["p50_ms"] for r in timed],
                     "o-", color=color, label=f"{system} p50")
        axes[1].plot([r["patients"] for r in timed], [r[system]["p99_ms"] for r in timed],
                     "s--", color=color, label=f"{system} p99")
    axes[0].set_ylabel("readings/s")
    axes[1].set_ylabel("alert latency, arrival -> PostgreSQL (ms)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("patients")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 and 1,000 patients, 360 s")
    parser.add_argument("--patients", type=int, nargs="*", default=None)
    parser.add_argument("--seconds", type=int, default=None, help="event time per run")
    parser.add_argument("--postgres", default=os.environ.get(
        "SSTORE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--no-spark", action="store_true", help="the engine only")
    args = parser.parse_args(argv)
    sizes = args.patients or ([100, 1000] if args.quick else [100, 1000, 10000])
    seconds = args.seconds or (360 if args.quick else 420)
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 140
    spark = None
    if not args.no_spark:
        from migrators.spark_session import get_spark
        spark = get_spark("local[2]")
    began = time.perf_counter()
    records = [measure(n, seconds, args.postgres, spark, console) for n in sizes]
    if spark is not None:
        from migrators.spark_session import stop_spark
        stop_spark()
    console.print(results_table(records))
    name = "icu-quick" if args.quick else "icu"
    path = write_results(name, {"records": records, "machine": machine_info(),
                                "seconds": round(time.perf_counter() - began, 1),
                                "batch_seconds": BATCH_SECONDS, "seed": SEED,
                                "rules": {"window_s": rules.WINDOW.total_seconds(),
                                          "delay_s": rules.DELAY.total_seconds(),
                                          "lateness_s": rules.LATENESS.total_seconds()}})
    plot(records, os.path.splitext(path)[0] + ".png")
    console.print(f"wrote {path} and {name}.png; load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
