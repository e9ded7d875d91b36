"""A program run as a child process by the crash tests, and killed with SIGKILL.

It declares a multi-procedure graph (fan-out, fan-in, a window), then sends every input batch
from the first one, as a client that does not know what reached the engine before a crash
would, runs everything, and writes the final state to ``<path>.result.json``.

    python -m tests.crash_worker full|weak|fused PATH BATCHES

(``fused``: full durability, each batch of ``b`` sent with ``Engine.ingest_and_run``.)

``python -m tests.crash_worker rejected LOG`` is a weak-durability program whose inputs the
engine partly refuses (constraint violations in ingests and in ad hoc transactions, one of them
swallowed by the program); it prints READY once everything is done and waits to be killed.
"""

from __future__ import annotations

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


def dump(engine: Engine) -> dict[str, list[list[object]]]:
    queries = {
        "te_log": "SELECT proc, batch_id, n FROM te_log ORDER BY ALL",
        "merged_total": "SELECT src, s FROM merged_total ORDER BY ALL",
        "window_sums": "SELECT batch_id, n, s FROM window_sums ORDER BY ALL",
        "window_now": "SELECT batch_id, n FROM recent_merged ORDER BY ALL",
    }
    return {name: [list(r.values()) for r in engine.query(sql).to_pylist()]
            for name, sql in queries.items()}


def main(mode: str, path: str, batches: int) -> None:
    engine = Engine(":memory:", input_log=path) if mode == "weak" else Engine(path)
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
    else:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
