"""Nexmark, the field's yardstick: sstore beside Flink and Spark Structured Streaming on the
same events, each query's result checked against one plain reference.

    python -m benchmarks.nexmark            # 2,000,000 events; sstore at 10,000 and 1,000
    python -m benchmarks.nexmark --quick    # 300,000 events; sstore at 10,000 (a few minutes)

The events (``sstore.workloads.nexmark.generator``, seed 1, 10,000 events per second of event
time) are made once: Arrow batches for the engine, the same events as CSV files of 10,000 for
Spark and Flink. Per query (q0-q8; q6 on sstore only, the nexmark project's q6 does not run on
Flink, see docs/nexmark.md):

- **sstore**: the dataflow of ``sstore.workloads.nexmark.queries`` on a fresh state file (full
  durability), fed with ``ingest_and_run``, results kept in the engine
  (``benchmarks.nexmark_sstore``); latency: one batch in -> its results committed.
- **sstore-postgres**: the same, the results also delivered exactly once into PostgreSQL
  (``--postgres`` or ``SSTORE_POSTGRES_URL``, database ``sstore_bench_nexmark``); latency:
  one batch in -> its results committed in PostgreSQL.
- **spark-sss** (``benchmarks.nexmark_spark``): the same SQL, file source, noop sink, one file
  per micro-batch in a closed loop; latency: file dropped -> its micro-batch committed.
- **flink** (``benchmarks.nexmark_flink``): PyFlink 2.3 in its own virtual environment (made on
  first use), streaming mode, parallelism = cores, the events read by the filesystem source
  (bounded) from ONE file, a blackhole sink; seconds = the job's run, submit to end. A bounded
  job reads every event at once, so it has no arrival -> result latency: p50/p99 are null.
  One file, because the source hands files to its parallel readers in no set order: a reader
  that got a later file moves its watermark past files not read yet, whose rows then come
  late and are dropped by the windows (q5, q7, q8 lost rows that way with 30 files).

events/s per core = events / seconds / cores (2 here, whatever each system used of them).
``results_equal``: the system's result (collected from the engine, from PostgreSQL, from a
check run of the same query on Spark and Flink) equals the reference (plain DuckDB SQL over
all events at once, ``reference``), windows not closed by the input left out.

Writes ``benchmarks/results/nexmark.json`` (``nexmark-quick`` with --quick) and a PNG.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import duckdb
import pyarrow as pa
from rich.console import Console
from rich.table import Table

from benchmarks.common import fresh_database, machine_info, percentile, write_results
from benchmarks.peak_rss import PeakRss
from sstore.base.extras import needs
from sstore.workloads.nexmark import generator, reference

SEED = 1
RATE = 10_000.0
FILE_EVENTS = 10_000
ALL_QUERIES = ["q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8"]
NOT_ON = {"flink": {"q6"}, "spark-sss": {"q6"}}  # the nexmark q6 SQL runs on neither


def _record(system: str, query: str, batch_events: int | None, events: int, seconds: float,
            latencies: list[float] | None, equal: bool | None, **extra: Any) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    lat = latencies or []
    return {"system": system, "query": query, "batch_events": batch_events, "events": events,
            "seconds": round(seconds, 3), "cores": cores,
            "events_per_s_per_core": round(events / seconds / cores) if seconds else None,
            "p50_ms": round(percentile(lat, 0.5), 1) if lat else None,
            "p99_ms": round(percentile(lat, 0.99), 1) if lat else None,
            "results_equal": equal, **extra}


def _naive(table: pa.Table) -> pa.Table:
    """Time zone dropped from timestamps (Spark's are UTC instants; the reference's naive
    UTC)."""
    cols = [c.cast(pa.timestamp(c.type.unit)) if pa.types.is_timestamp(c.type) and c.type.tz
            else c for c in table.columns]
    return pa.Table.from_arrays(cols, names=table.column_names)


def _read_check(path: str, like: pa.Table) -> pa.Table:
    """A Flink check file (CSV, no header) read with the reference's column types."""
    con = duckdb.connect()
    try:
        con.register("expected_rows", like.slice(0, 0))
        types = con.execute("DESCRIBE SELECT * FROM expected_rows").fetchall()
        columns = "{" + ", ".join(f"'{n}': '{t}'" for n, t, *_ in types) + "}"
        return con.execute(f"SELECT * FROM read_csv(?, header = false, columns = {columns}, "
                           "nullstr = '')", [path]).to_arrow_table()
    finally:
        con.close()


def _equal(events: pa.Table, query: str, expected: pa.Table, got: pa.Table) -> bool:
    got = reference.closed(events, query, _naive(got).rename_columns(expected.column_names))
    return reference.same_rows(expected, got)


def run_sstore(query: str, events: pa.Table, expected: pa.Table, sizes: list[int],
               url: str | None, console: Console) -> list[dict[str, Any]]:
    from benchmarks import nexmark_sstore
    out = []
    for size in sizes:
        cfg = generator.NexmarkConfig(seed=SEED, rate=RATE)
        batches = [b.combine_chunks() for b in generator.batches(events.num_rows, size, cfg)]
        runs = [("sstore", lambda d, b=batches: nexmark_sstore.run_engine(query, b, d))]
        if url is not None:
            runs.append(("sstore-postgres",
                         lambda d, b=batches: nexmark_sstore.run_postgres(query, b, d, url)))
        for system, run in runs:
            with tempfile.TemporaryDirectory(prefix="bench-nexmark-") as tmp:
                r = run(tmp)
            rec = _record(system, query, size, events.num_rows, r["seconds"],
                          r["latencies_ms"], _equal(events, query, expected, r["result"]),
                          peak_rss_mb=r["peak_rss_mb"], result_rows=r["result"].num_rows)
            console.print(_line(rec))
            out.append(rec)
    return out


def run_spark(qs: list[str], events: pa.Table, expected: dict[str, pa.Table],
              files: list[str], console: Console) -> list[dict[str, Any]]:
    from benchmarks.nexmark_spark import SparkNexmark
    spark, out = SparkNexmark(), []
    try:
        for query in qs:
            if query in NOT_ON["spark-sss"]:
                continue
            rss = PeakRss()  # the driver and, apart, Spark's JVM (a child process)
            rss.start()
            with tempfile.TemporaryDirectory(prefix="bench-nexmark-spark-") as tmp:
                r = spark.run(query, files, tmp)
            memory = rss.stop()
            if "unsupported" in r:
                rec = _record("spark-sss", query, FILE_EVENTS, events.num_rows, 0, None, None,
                              unsupported=r["unsupported"])
            else:
                rec = _record("spark-sss", query, FILE_EVENTS, events.num_rows, r["seconds"],
                              r["latencies_ms"],
                              _equal(events, query, expected[query], r["result"]),
                              result_rows=r["result"].num_rows, spark=spark.version,
                              peak_rss_mb=round(memory["peak_rss_mb"]
                                                + (memory["peak_rss_children_mb"] or 0), 1))
            console.print(_line(rec))
            out.append(rec)
    finally:
        spark.close()
    return out


def run_flink(qs: list[str], events: pa.Table, expected: dict[str, pa.Table], files_dir: str,
              console: Console, live_files: list[str] | None = None) -> list[dict[str, Any]]:
    from benchmarks import nexmark_flink
    python = nexmark_flink.ensure_venv(log=console.print)
    wanted = [q for q in qs if q not in NOT_ON["flink"]]
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="bench-nexmark-flink-") as tmp:
        found = nexmark_flink.run(python, files_dir, wanted, cores, tmp, live_files)
        out = []
        for r in found:
            query = r["query"]
            got = _read_check(os.path.join(tmp, f"{query}.csv"), expected[query])
            rec = _record("flink", query, None, events.num_rows, r["seconds"],
                          r.get("latencies_ms"), _equal(events, query, expected[query], got),
                          peak_rss_mb=r["peak_rss_mb"], startup_s=round(r["startup_s"], 1),
                          result_rows=r["rows"], parallelism=cores, check_s=r.get("check_s"))
            console.print(_line(rec))
            out.append(rec)
    return out


def _line(r: dict[str, Any]) -> str:
    if r.get("unsupported"):
        return f"  {r['system']:15} {r['query']}: not run: {r['unsupported'][:120]}"
    return (f"  {r['system']:15} {r['query']} batch {r['batch_events']}: "
            f"{r['events_per_s_per_core']:,} events/s/core, p50 {r['p50_ms']} ms, "
            f"p99 {r['p99_ms']} ms, equal {r['results_equal']}")


def results_table(records: list[dict[str, Any]]) -> Table:
    table = Table(title="Nexmark: events/s per core, latency (arrival -> result committed)")
    for col in ("query", "system", "batch", "events", "seconds", "events/s/core", "p50 ms",
                "p99 ms", "peak RSS MB", "equal"):
        table.add_column(col, justify="right")
    for r in sorted(records, key=lambda r: (r["query"], r["system"])):
        if r.get("unsupported"):
            table.add_row(r["query"], r["system"], "-", "-", "-", "refused", "-", "-", "-", "-")
            continue
        table.add_row(r["query"], r["system"], str(r["batch_events"] or "all"),
                      f"{r['events']:,}", f"{r['seconds']:.2f}",
                      f"{r['events_per_s_per_core']:,}", str(r["p50_ms"] or "-"),
                      str(r["p99_ms"] or "-"), str(r.get("peak_rss_mb") or "-"),
                      {True: "yes", False: "NO", None: "-"}[r["results_equal"]])
    return table


def plot(records: list[dict[str, Any]], path: str) -> None:
    with needs("bench"):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    systems = ["sstore", "sstore-postgres", "flink", "spark-sss"]
    qs = sorted({r["query"] for r in records})
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        ys = []
        for q in qs:
            rs = [r for r in records if r["system"] == system and r["query"] == q
                  and r.get("events_per_s_per_core")]
            ys.append(max((r["events_per_s_per_core"] for r in rs), default=0))
        ax.bar([j + i * width for j in range(len(qs))], ys, width, label=system)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(qs))], qs)
    ax.set_yscale("log")
    ax.set_ylabel("events/s per core (best batch size)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300,000 events, batch 10,000")
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--batch-events", type=int, nargs="*", default=None)
    parser.add_argument("--queries", nargs="*", default=ALL_QUERIES)
    parser.add_argument("--postgres", default=os.environ.get(
        "SSTORE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument("--no-flink", action="store_true")
    parser.add_argument("--no-flink-latency", action="store_true",
                        help="skip Flink's latency runs (files dropped into a watched folder)")
    parser.add_argument("--name", default=None, help="results file name (default: nexmark, "
                        "nexmark-quick with --quick)")
    args = parser.parse_args(argv)
    total = args.events or (300_000 if args.quick else 2_000_000)
    sizes = args.batch_events or ([10_000] if args.quick else [10_000, 1_000])
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 150
    began = time.perf_counter()
    load_at_start = os.getloadavg()
    cfg = generator.NexmarkConfig(seed=SEED, rate=RATE)
    events = generator.events(0, total, cfg)
    url = None if args.no_postgres else fresh_database(args.postgres, "sstore_bench_nexmark")
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-nexmark-files-") as files_dir:
        files = generator.write_files(files_dir, total, FILE_EVENTS, cfg)
        console.print(f"[bold]{total:,} events[/] in {len(files)} files "
                      f"({time.perf_counter() - began:.1f} s); load {load_at_start}")
        expected = {q: reference.reference(events, q) for q in args.queries}
        for query in args.queries:
            records += run_sstore(query, events, expected[query], sizes, url, console)
        if not args.no_spark:
            records += run_spark(args.queries, events, expected, files, console)
        if not args.no_flink:  # one file: one split, read in event-time order (see run_flink)
            one = os.path.join(files_dir, "flink")
            os.makedirs(one)
            with open(os.path.join(one, "events.csv"), "wb") as out:
                for path in files:
                    with open(path, "rb") as f:
                        out.write(f.read())
            records += run_flink(args.queries, events, expected, one, console,
                                 None if args.no_flink_latency else files)
    console.print(results_table(records))
    name = args.name or ("nexmark-quick" if args.quick else "nexmark")
    machine = machine_info() | {"loadavg_at_start": load_at_start}
    path = write_results(name, {"records": records, "machine": machine,
                                "seconds": round(time.perf_counter() - began, 1),
                                "events": total, "seed": SEED, "rate": RATE,
                                "file_events": FILE_EVENTS})
    plot(records, os.path.splitext(path)[0] + ".png")
    console.print(f"wrote {path} and {name}.png; load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
