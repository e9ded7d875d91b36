"""A program run as a child process by the crash tests, and killed with SIGKILL.

It declares a multi-procedure graph (fan-out, fan-in, a window), then sends every input batch
from the first one, as a client that does not know what reached the engine before a crash
would, runs everything, and writes the final state to ``<path>.result.json``.

    python -m tests.crash_worker full|weak PATH BATCHES
"""

from __future__ import annotations

import json
import random
import sys

from sstore import Engine
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
    engine = Engine(path) if mode == "full" else Engine(":memory:", input_log=path)
    declare(engine)
    for batch_id, (a_rows, b_rows) in enumerate(inputs(batches), start=1):
        engine.ingest("a", a_rows, batch_id=batch_id)
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


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
