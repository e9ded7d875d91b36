"""A program run as a child process by the crash tests, and killed with SIGKILL.

It declares a multi-procedure graph (fan-out, fan-in, a window), then sends every input batch
from the first one, as a client that does not know what reached the engine before a crash
would, runs everything, and writes the final state to ``<path>.result.json``.

    python -m tests.crash_worker full|weak|fused PATH BATCHES
    python -m tests.crash_worker events-full|events-weak PATH BATCHES   (event-time windows)

(``fused``: full durability, each batch of ``b`` sent with ``Engine.ingest_and_run``.)

``python -m tests.crash_worker rejected LOG`` is a weak-durability program whose inputs the
engine partly refuses (constraint violations in ingests and in ad hoc transactions, one of them
swallowed by the program); it prints READY once everything is done and waits to be killed.
"""

from __future__ import annotations

import datetime
import json
import random
import sys
import time
from collections.abc import Callable

import duckdb

from sstore import Engine, TransactionStateError
from tests.graphs import ordered_graph


def inputs(batches: int) -> list[tuple[list[tuple[int]], list[tuple[int]]]]:
    rng = random.Random(42)
    return [([(rng.randint(0, 1000),) for _ in range(rng.randint(0, 30))],
             [(rng.randint(0, 1000),) for _ in range(rng.randint(0, 5))])
            for _ in range(batches)]


def declare(engine: Engine) -> None:
    ordered_graph(engine)
    engine.stream("merged", {"batch_id": "BIGINT", "n": "BIGINT"})
    engine.window("recent_merged", "merged", rows=7, slide=3)
    engine.execute("CREATE TABLE IF NOT EXISTS window_sums (batch_id BIGINT, n BIGINT, s BIGINT)")

    @engine.procedure(input="recent_merged")
    def sum_window(tx, batch):
        tx.execute("INSERT INTO window_sums SELECT ?, count(*), sum(n) FROM batch", tx.batch_id)

    # a chain of SQL procedures: from batch 2 on, one statement per batch (sstore.dataflow.fusion)
    engine.stream("b_scaled", {"x": "BIGINT", "y": "BIGINT"})
    engine.stream("b_offset", {"x": "BIGINT", "y": "BIGINT"})
    engine.execute("CREATE TABLE IF NOT EXISTS chain_sums (batch_id BIGINT, n BIGINT, s BIGINT)")
    engine.sql_procedure("scale_b", "SELECT x, x * 7 AS y FROM batch", input="b",
                         output="b_scaled")
    engine.sql_procedure("offset_b", "SELECT x, y + 1 AS y FROM batch", input="b_scaled",
                         output="b_offset")

    @engine.procedure(input="b_offset")
    def sum_chain(tx, batch):
        tx.execute("INSERT INTO chain_sums SELECT ?, count(*), sum(y) FROM batch", tx.batch_id)


def dump(engine: Engine) -> dict[str, list[list[object]]]:
    queries = {
        "te_log": "SELECT proc, batch_id, n FROM te_log ORDER BY ALL",
        "merged_total": "SELECT src, s FROM merged_total ORDER BY ALL",
        "window_sums": "SELECT batch_id, n, s FROM window_sums ORDER BY ALL",
        "window_now": "SELECT batch_id, n FROM recent_merged ORDER BY ALL",
        "chain_sums": "SELECT batch_id, n, s FROM chain_sums ORDER BY ALL",
    }
    return {name: [list(r.values()) for r in engine.query(sql).to_pylist()]
            for name, sql in queries.items()}


def main(mode: str, path: str, batches: int) -> None:
    # GC every 64 TEs, not at most once a second: crash points inside GC (gc.before_commit:2)
    # are then reached however fast or slow the machine runs the worker
    engine = (Engine(":memory:", input_log=path, gc_min_seconds=0) if mode == "weak"
              else Engine(path, gc_min_seconds=0))
    declare(engine)
    for batch_id, (a_rows, b_rows) in enumerate(inputs(batches), start=1):
        engine.ingest("a", a_rows, batch_id=batch_id)
        if mode == "fused":  # b's batch commits with the batch's TEs (a group it leads)
            engine.ingest_and_run("b", b_rows, batch_id=batch_id)
            continue
        engine.ingest("b", b_rows, batch_id=batch_id)
        if batch_id % 4 == 0:
            engine.run_until_idle()
        if mode == "weak" and batch_id % 40 == 0:
            engine.checkpoint()
    engine.run_until_idle()
    with open(path + ".result.json", "w") as f:
        json.dump(dump(engine), f)
    engine.close()
    print("DONE", flush=True)


def event_inputs(batches: int) -> list[list[tuple[int, datetime.datetime, float]]]:
    """Vital-sign-like readings: mostly in time order, some out of order within the delay,
    some far behind (late, or too late), some negative values (the cleaning drops them)."""
    rng = random.Random(7)
    start, clock, out = datetime.datetime(2026, 1, 1), 0.0, []
    for _ in range(batches):
        rows = []
        for _ in range(rng.randint(0, 20)):
            clock += rng.uniform(0, 2)
            behind = rng.choice([0, 0, 0, 1, 3, 25, 90])
            rows.append((rng.randrange(5), start + datetime.timedelta(seconds=clock - behind),
                         float(rng.randint(-2, 99))))
        out.append(rows)
    return out


def declare_events(engine: Engine) -> None:
    """readings -> clean -> per_minute (tumbling, fed inside clean's TE) and readings ->
    sliding (fed inside the ingest); every close and every late row recorded by a procedure."""
    cols = {"patient": "INTEGER", "ts": "TIMESTAMP", "v": "DOUBLE"}
    engine.stream("readings", cols)
    engine.stream("clean", cols)

    @engine.procedure(input="readings", output="clean")
    def tidy(tx, batch):
        return tx.sql("SELECT * FROM batch WHERE v >= 0")

    engine.event_window("per_minute", "clean", time="ts", size="1 minute", key="patient",
                        delay="5 seconds", allowed_lateness="20 seconds",
                        aggregates={"n": "count(*)", "x": "avg(v)"})
    engine.event_window("sliding", "readings", time="ts", size="30 seconds",
                        slide="10 seconds", key="patient", delay="2 seconds",
                        aggregates={"n": "count(*)", "x": "sum(v)"})
    engine.execute("CREATE TABLE IF NOT EXISTS closes (w VARCHAR, b BIGINT, patient INTEGER, "
                   "ws TIMESTAMP, revision INTEGER, n BIGINT, x DOUBLE)")
    engine.execute("CREATE TABLE IF NOT EXISTS late_rows (w VARCHAR, b BIGINT, "
                   "patient INTEGER, ts TIMESTAMP, v DOUBLE)")
    for window in ("per_minute", "sliding"):
        def on_close(tx, batch, window: str = window) -> None:
            tx.execute("INSERT INTO closes SELECT ?, ?, patient, window_start, revision, n, x "
                       "FROM batch", window, tx.batch_id)

        def on_late(tx, batch, window: str = window) -> None:
            tx.execute("INSERT INTO late_rows SELECT ?, ?, * FROM batch", window, tx.batch_id)

        engine.procedure(input=window, name=f"close_{window}")(on_close)
        engine.procedure(input=f"{window}__late", name=f"late_{window}")(on_late)


def dump_events(engine: Engine) -> dict[str, list[list[object]]]:
    queries = {
        "closes": "SELECT w, b, patient, ws::VARCHAR, revision, n, x FROM closes ORDER BY ALL",
        "late_rows": "SELECT w, b, patient, ts::VARCHAR, v FROM late_rows ORDER BY ALL",
        "watermarks": "SELECT name, watermark, max_time, rows_in, rows_late "
                      "FROM sstore_sys.event_windows ORDER BY name",
        "open_rows": "SELECT 'per_minute', count(*) FROM per_minute__state UNION ALL "
                     "SELECT 'sliding', count(*) FROM sliding__state ORDER BY ALL",
    }
    return {name: [list(r.values()) for r in engine.query(sql).to_pylist()]
            for name, sql in queries.items()}


def main_events(mode: str, path: str, batches: int) -> None:
    engine = Engine(path) if mode == "full" else Engine(":memory:", input_log=path)
    declare_events(engine)
    for batch_id, rows in enumerate(event_inputs(batches), start=1):
        engine.ingest("readings", rows, batch_id=batch_id)
        if batch_id % 3 == 0:
            engine.run_until_idle()
        if mode == "weak" and batch_id % 20 == 0:
            engine.checkpoint()
    engine.run_until_idle()
    with open(path + ".result.json", "w") as f:
        json.dump(dump_events(engine), f)
    engine.close()
    print("DONE", flush=True)


def declare_rejecting(engine: Engine) -> None:
    """A stream and a table with constraints that DuckDB checks (not ``to_arrow``)."""
    engine.stream("s", {"k": "INTEGER NOT NULL", "v": "BIGINT CHECK (v >= 0)"})
    engine.execute("CREATE TABLE IF NOT EXISTS totals (k INTEGER PRIMARY KEY, "
                   "v BIGINT NOT NULL CHECK (v >= 0))")

    @engine.procedure(input="s")
    def add(tx, batch):
        tx.execute("INSERT INTO totals SELECT k, sum(v) FROM batch GROUP BY k "
                   "ON CONFLICT (k) DO UPDATE SET v = totals.v + excluded.v")


#: totals once ``rejected_inputs`` has run: only what the engine accepted
ACCEPTED_TOTALS = {1: 111, 2: 20}


def refused(action: Callable[[], object], *errors: type[BaseException]) -> None:
    try:
        action()
    except errors:
        return
    raise AssertionError(f"{action} was accepted")


def rejected_inputs(engine: Engine) -> None:
    """Accepted and refused inputs, interleaved; each refused one must leave no trace."""
    engine.ingest("s", [(1, 10), (2, 20)])
    refused(lambda: engine.ingest("s", [(None, 1)]), duckdb.ConstraintException)  # NOT NULL
    refused(lambda: engine.ingest("s", [(3, -5)]), duckdb.ConstraintException)  # CHECK
    engine.run_until_idle()
    with engine.transaction() as tx:
        tx.execute("UPDATE totals SET v = v + 100 WHERE k = 1")

    def failing_statement() -> None:
        with engine.transaction() as tx:
            tx.execute("UPDATE totals SET v = -1 WHERE k = 2")

    def swallowed_failure() -> None:
        with engine.transaction() as tx:
            tx.execute("INSERT INTO totals VALUES (9, 9)")
            try:
                tx.execute("INSERT INTO totals VALUES (9, 10)")  # duplicate key
            except duckdb.ConstraintException:
                pass  # the program carries on; DuckDB has aborted the transaction

    refused(failing_statement, duckdb.ConstraintException)
    refused(swallowed_failure, TransactionStateError)
    engine.ingest("s", [(1, 1)])
    engine.run_until_idle()


def serve_rejected(log: str) -> None:
    engine = Engine(":memory:", input_log=log)
    declare_rejecting(engine)
    rejected_inputs(engine)
    print("READY", flush=True)
    time.sleep(600)  # killed here


if __name__ == "__main__":
    if sys.argv[1] == "rejected":
        serve_rejected(sys.argv[2])
    elif sys.argv[1].startswith("events-"):
        main_events(sys.argv[1].removeprefix("events-"), sys.argv[2], int(sys.argv[3]))
    else:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
