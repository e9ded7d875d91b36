"""The incremental migrator against a raw binary COPY of the same Arrow data into PostgreSQL.

Run ``python -m benchmarks.migrate`` (1,000,000 rows) or ``--quick`` (200,000 rows).

For chunks of 1,000, 10,000 and 100,000 rows, in append and merge mode:

- ``migrator``: ``StreamToPostgres.run_once`` over an engine stream holding the rows in batches
  of 1,000 (so a chunk is 1, 10 or 100 batches). Per chunk: read the batches from DuckDB, binary
  COPY, the watermark row, COMMIT, then the acknowledgement to the engine.
- ``raw_copy``: the same Arrow rows, chunk by chunk, each chunk one PostgreSQL transaction with
  a binary COPY and nothing else: the hand-written limit the migrator is measured against.
- ``raw_merge`` (merge mode): raw COPY into a temporary table plus the same
  ``INSERT ... ON CONFLICT DO UPDATE``: what merge costs before any exactly-once bookkeeping.

Each configuration runs ``--rounds`` times (5), raw and migrator interleaved with the order
alternating, so load from elsewhere on a shared machine hits both alike. Reported: the median
rows/s, the ratio to raw COPY (of the medians; the median of each round's own ratio,
"paired"; and of the best rounds, the least disturbed), per-chunk latency (p50/p99) and the
load average. ``--chunks 10000 --modes append`` measures one configuration. PostgreSQL is the
one at ``SSTORE_POSTGRES_URL``; the benchmark uses its own database ``sstore_bench``, created
anew.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import psycopg
import pyarrow as pa
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks.common import fresh_database, machine_info, percentile, write_results
from migrators import StreamToPostgres
from migrators.postgres import copy_arrow
from migrators.typemap import for_copy, postgres_columns
from migrators.urls import default_url
from sstore import Engine
from sstore.base.sql import ident

BATCH_ROWS = 1_000
CHUNKS = (1_000, 10_000, 100_000)
COLUMNS = {"id": "BIGINT", "account": "INTEGER", "symbol": "VARCHAR", "price": "DECIMAL(8,2)",
           "qty": "INTEGER", "at": "TIMESTAMP"}


def make_rows(n: int) -> pa.Table:
    """Trade-like rows; ids 0..n-1 (merge mode updates half of them a second time)."""
    ids = pa.array(range(n), pa.int64())
    return pa.table({
        "id": ids, "account": pa.array([i % 5000 for i in range(n)], pa.int32()),
        "symbol": pa.array([f"SYM{i % 700:03d}" for i in range(n)]),
        "price": pa.array([i % 100000 / 100 for i in range(n)]).cast(pa.decimal128(8, 2)),
        "qty": pa.array([i % 900 + 1 for i in range(n)], pa.int32()),
        "at": pa.array([1_700_000_000_000_000 + i * 1000 for i in range(n)], pa.timestamp("us")),
    })


def bench_url(base: str) -> str:
    """A fresh database ``sstore_bench`` on the server of ``base``."""
    return fresh_database(base, "sstore_bench")


def reset_target(url: str, table: str, keyed: bool) -> None:
    cols = ", ".join(f"{ident(c)} {t}" for c, t in postgres_columns(make_rows(1).schema))
    pk = ", PRIMARY KEY (id)" if keyed else ""
    with psycopg.connect(url) as con:
        con.execute(f"DROP TABLE IF EXISTS {ident(table)}")
        con.execute("DROP SCHEMA IF EXISTS sstore CASCADE")
        con.execute(f"CREATE TABLE {ident(table)} ({cols}{pk})")


def run_migrator(url: str, rows: pa.Table, chunk: int, mode: str, state_dir: str
                 ) -> tuple[float, list[float]]:
    table = f"mig_{mode}"
    reset_target(url, table, keyed=mode == "merge")
    path = os.path.join(state_dir, f"{mode}-{chunk}.duckdb")
    eng = Engine(path)
    eng.stream("trades", COLUMNS)
    eng.hold("trades", f"migrator:{table}")
    for start in range(0, rows.num_rows, BATCH_ROWS):
        eng.ingest("trades", rows.slice(start, BATCH_ROWS))
    migrator = StreamToPostgres(eng, "trades", url, table, mode=mode,
                                key=("id",) if mode == "merge" else (), chunk_rows=chunk)
    migrator.start()
    began = time.perf_counter()
    report = migrator.run_once()
    seconds = time.perf_counter() - began
    eng.close()
    assert report.rows == rows.num_rows, (report.rows, rows.num_rows)
    return seconds, report.chunk_seconds


def run_raw(url: str, rows: pa.Table, chunk: int, mode: str) -> tuple[float, list[float]]:
    table = f"raw_{mode}"
    reset_target(url, table, keyed=mode == "merge")
    data = for_copy(rows)
    latencies: list[float] = []
    began = time.perf_counter()
    with psycopg.connect(url) as con, con.cursor() as cur:
        for start in range(0, data.num_rows, chunk):
            t0 = time.perf_counter()
            part = data.slice(start, chunk)
            if mode == "append":
                copy_arrow(cur, table, part)
            else:
                cur.execute(f"CREATE TEMPORARY TABLE stage (LIKE {ident(table)}) ON COMMIT DROP")
                copy_arrow(cur, "stage", part)
                cols = ", ".join(ident(c) for c in part.column_names)
                sets = ", ".join(f"{ident(c)} = excluded.{ident(c)}"
                                 for c in part.column_names if c != "id")
                cur.execute(f"INSERT INTO {ident(table)} ({cols}) SELECT {cols} FROM stage "
                            f"ON CONFLICT (id) DO UPDATE SET {sets}")
            con.commit()
            latencies.append(time.perf_counter() - t0)
    return time.perf_counter() - began, latencies


def record(system: str, mode: str, chunk: int, rows: int, seconds: list[float],
           latencies: list[float], ratios: list[float] | None = None) -> dict[str, Any]:
    """One system at one configuration over every round: the median round, and (for the
    migrator) the median of its per-round ratios to the raw COPY measured next to it."""
    median = statistics.median(seconds)
    out = {"system": system, "mode": mode, "chunk_rows": chunk, "rows": rows,
           "seconds": round(median, 4), "rows_per_s": round(rows / median),
           "rounds_rows_per_s": [round(rows / s) for s in seconds],
           "best_rows_per_s": round(rows / min(seconds)),
           "chunk_p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
           "chunk_p99_ms": round(percentile(latencies, 0.99) * 1000, 2)}
    if ratios:
        out["paired_ratios"] = [round(r, 3) for r in ratios]
        out["paired_ratio_median"] = round(statistics.median(ratios), 3)
    return out


def results_table(records: list[dict[str, Any]], rounds: int) -> Table:
    table = Table(title=f"Engine -> PostgreSQL: migrator vs raw binary COPY (median of {rounds} "
                        f"interleaved rounds)")
    for col in ("mode", "chunk rows", "system", "rows/s", "x raw COPY", "paired x raw",
                "best-of x raw", "chunk p50 ms", "chunk p99 ms"):
        table.add_column(col, justify="right" if col not in ("mode", "system") else "left")
    raw = {(r["mode"], r["chunk_rows"]): r for r in records
           if r["system"] == "raw_copy"}  # in merge mode too: a raw append COPY, same rounds
    for r in records:
        base = raw[(r["mode"], r["chunk_rows"])]
        ratio = r["rows_per_s"] / base["rows_per_s"]
        r["ratio_to_raw_copy"] = round(ratio, 3)
        r["best_ratio_to_raw_copy"] = round(r["best_rows_per_s"] / base["best_rows_per_s"], 3)
        paired = r.get("paired_ratio_median")
        table.add_row(r["mode"], f"{r['chunk_rows']:,}", r["system"], f"{r['rows_per_s']:,}",
                      f"{ratio:.2f}", "" if paired is None else f"{paired:.2f}",
                      f"{r['best_ratio_to_raw_copy']:.2f}",
                      f"{r['chunk_p50_ms']:.1f}", f"{r['chunk_p99_ms']:.1f}")
    return table


def measure(url: str, rows: pa.Table, mode: str, chunk: int, rounds: int, state_dir: str
            ) -> list[dict[str, Any]]:
    """``rounds`` rounds of raw COPY (and raw merge) and the migrator, interleaved, the order
    alternating from round to round: on a shared machine, load that comes and goes hits both
    sides alike, and each round's ratio compares runs made seconds apart."""
    systems = ["raw_copy", "migrator"] if mode == "append" else ["raw_copy", "raw_merge",
                                                                 "migrator"]
    seconds: dict[str, list[float]] = {s: [] for s in systems}
    latencies: dict[str, list[float]] = {s: [] for s in systems}
    for r in range(rounds):
        for system in (systems if r % 2 == 0 else systems[::-1]):
            if system == "migrator":
                took, lat = run_migrator(url, rows, chunk, mode,
                                         os.path.join(state_dir, f"{mode}-{chunk}-{r}"))
            else:
                took, lat = run_raw(url, rows, chunk, "append" if system == "raw_copy"
                                    else "merge")
            seconds[system].append(took)
            latencies[system].extend(lat)
    ratios = [raw / mig for raw, mig in zip(seconds["raw_copy"], seconds["migrator"])]
    return [record(s, mode, chunk, rows.num_rows, seconds[s], latencies[s],
                   ratios if s == "migrator" else None) for s in systems]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.migrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200,000 rows instead of 1,000,000")
    parser.add_argument("--postgres", default=default_url(), help="PostgreSQL server URL")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    parser.add_argument("--chunks", type=int, nargs="+", default=list(CHUNKS),
                        help="chunk sizes in rows (1000 10000 100000)")
    parser.add_argument("--modes", nargs="+", choices=("append", "merge"),
                        default=["append", "merge"], help="append and merge")
    args = parser.parse_args(argv)
    n = 200_000 if args.quick else 1_000_000
    console = Console()
    url = bench_url(args.postgres)
    rows = make_rows(n)
    records: list[dict[str, Any]] = []
    plan = [(mode, chunk) for mode in args.modes for chunk in args.chunks]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="sstore-bench-") as state_dir, \
            Progress(console=console, transient=True) as progress:
        task = progress.add_task("configurations", total=len(plan))
        for mode, chunk in plan:
            records.extend(measure(url, rows, mode, chunk, args.rounds, state_dir))
            progress.advance(task)
    load_after = os.getloadavg()
    console.print(results_table(records, args.rounds))
    console.print(f"load average before {', '.join(f'{x:.2f}' for x in load_before)}; "
                  f"after {', '.join(f'{x:.2f}' for x in load_after)}")
    name = "migrate-quick" if args.quick else "migrate"
    path = write_results(name, {"rows": n, "batch_rows": BATCH_ROWS, "rounds": args.rounds,
                                "records": records, "loadavg_before": load_before,
                                "machine": machine_info()})
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
