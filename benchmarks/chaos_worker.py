"""The engine process of the chaos run: TPC-DI DimTrade streamed into PostgreSQL, resumable.

``python -m benchmarks.chaos_worker --data DIR --url URL --state FILE --schema S --batch-size N``
runs the streaming pipeline (``StreamingDimTrade``: the five stored procedures, the continuous
sinks attached) over the three TPC-DI batches and exits 0 once the warehouse has all of them.
It may be killed at any moment; started again on the same state file it goes on where the
engine's commits say it was (the pipeline's batch-ids come from the data, so nothing is sent
twice). Started on a state file that does not exist, it starts from the first batch.

Dimensions without Spark: the chaos run builds them once (``benchmarks.tpcdi_setup.
build_dimensions``: snapshots ``tpcdi_dims_b1``..``b3`` in the same database); before a TPC-DI
batch still has lines to send, this process installs that batch's snapshot into its warehouse
(one transaction), so a restart never pays Spark again and ``run_incremental`` finds the batch's
dimensions applied. Per batch ``b``:

1. Skip ``b`` if the engine already took lines of ``b + 1`` (everything of ``b`` is in the
   engine; the sinks move what PostgreSQL lacks while ``b + 1`` streams).
2. If lines of ``b`` remain: install the dimensions of ``b`` (after ``b`` only: the lookups of
   the remaining lines must be those ``b`` streams against), unless they are there already.
3. Batch1: refresh the lookups (only when lines remain: the engine keeps its lookup copies),
   then ``stream`` with the sinks attached; Batch2/3: ``run_incremental(b)``.

Each engine batch is reported on stdout as a JSON line, ``{"event": "progress", "batch": b,
"done": lines, "total": lines}``, so the chaos run can place its faults by progress instead of
by wall time. PostgreSQL sessions carry the application name in ``PGAPPNAME`` (set by the
caller), so the chaos run finds this process's backends in ``pg_stat_activity``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

TPCDI_BATCHES = (1, 2, 3)


def emit(event: str, **fields: Any) -> None:
    """One line of JSON on stdout, flushed at once (the chaos run reads it while we run)."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def dimensions_installed(url: str, schema: str, batch: int) -> bool:
    """Whether ``schema``'s dimension tables hold the snapshot of ``batch`` already (same row
    count in every table: the snapshots of successive batches differ in DimCustomer and
    DimAccount versions, and an install is one transaction), so a restart can skip it."""
    import psycopg

    from benchmarks.tpcdi_setup import BUILD_SCHEMA, DIMENSION_TABLES
    from sstore.base.sql import ident

    counts = " UNION ALL ".join(
        f"SELECT {i}, (SELECT count(*) FROM {ident(schema)}.{ident(t)}) = "
        f"(SELECT count(*) FROM {ident(f'{BUILD_SCHEMA}_b{batch}')}.{ident(t)})"
        for i, t in enumerate(DIMENSION_TABLES))
    with psycopg.connect(url) as con:
        return all(same for _, same in con.execute(counts).fetchall())


def ensure_dimensions(url: str, schema: str, batch: int) -> None:
    from benchmarks.tpcdi_setup import install_dimensions

    if not dimensions_installed(url, schema, batch):
        install_dimensions(url, schema, batch)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos_worker",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a TPC-DI data set (Batch1..3)")
    parser.add_argument("--url", required=True, help="the warehouse database")
    parser.add_argument("--state", required=True, help="the engine's state file")
    parser.add_argument("--schema", required=True, help="the warehouse schema")
    parser.add_argument("--batch-size", type=int, required=True, help="events per engine batch")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> None:
    from migrators import pg_errors  # noqa: F401 - PostgreSQL's errors in the retry rules
    from sstore.base import retry
    from sstore.base.retry import RetryPolicy
    from sstore.workloads.tpcdi.streaming.events import (
        BatchEvents,
        batch1_events,
        incremental_events,
    )
    from sstore.workloads.tpcdi.streaming.pipeline import StreamingDimTrade
    from sstore.workloads.tpcdi.warehouse import create_warehouse

    emit("start", pid=os.getpid(), fresh=not os.path.exists(args.state))
    events: dict[int, BatchEvents] = {}

    def events_of(b: int) -> BatchEvents:  # read when needed: a restart in Batch3 skips Batch1
        if b not in events:
            events[b] = batch1_events(args.data) if b == 1 else incremental_events(args.data, b)
        return events[b]

    create_warehouse(args.url, args.schema)
    current = {"batch": 0}

    def progress(_phase: str, done: int, total: int) -> None:
        emit("progress", batch=current["batch"], done=done, total=total)

    pipeline = StreamingDimTrade(args.data, args.url, args.state, args.schema, args.batch_size,
                                 progress)
    try:
        for b in TPCDI_BATCHES:
            if b < TPCDI_BATCHES[-1] and pipeline.lines_ingested(b + 1) > 0:
                continue  # step 1
            current["batch"] = b
            remaining = pipeline.lines_ingested(b) < events_of(b).lines.num_rows
            emit("batch", batch=b, remaining=remaining)
            if remaining:
                # this process's own step, not the pipeline's: through the one retry helper,
                # so that a PostgreSQL restart here is not mistaken for a pipeline failure
                retry.call(lambda b=b: ensure_dimensions(args.url, args.schema, b),
                           RetryPolicy(), f"install the dimensions of Batch{b}")  # step 2
            if b == 1:  # step 3
                if remaining:
                    pipeline.refresh_lookups()
                with pipeline.attached():
                    pipeline.stream(events_of(1), "historical (Batch1)")
            else:
                pipeline.run_incremental(b)
            emit("batch done", batch=b)
    finally:
        pipeline.close()
    emit("done")


def main(argv: Sequence[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
