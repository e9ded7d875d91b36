"""A process that streams rows 1..N through a ``Coalescer`` into a fresh or existing state
file, resuming after ``last_ingested()``; ``tests/engine/test_coalesce.py`` kills it with
``SSTORE_CRASH_AT`` and runs it again. Usage: ``python -m tests.coalesce_worker STATE N``."""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.compute as pc

from sstore import Engine
from sstore.coalesce import Coalescer

CHUNK = 10


def declare(engine: Engine) -> None:
    engine.stream("numbers", {"n": "BIGINT"})
    engine.execute("CREATE TABLE IF NOT EXISTS seen (n BIGINT)")

    @engine.procedure(input="numbers")
    def keep(tx, batch):
        tx.execute("INSERT INTO seen SELECT n FROM batch")


def main(state: str, total: int) -> None:
    engine = Engine(state)
    declare(engine)
    engine.run_until_idle()  # what a crash left between ingest and procedures
    coalescer = Coalescer(engine, "numbers", lambda rows: pc.max(rows["n"]).as_py(),
                          max_pending=4)
    with coalescer:
        start = coalescer.last_ingested() + 1
        for first in range(start, total + 1, CHUNK):
            coalescer.offer(pa.table({"n": pa.array(range(first, min(first + CHUNK, total + 1)),
                                                    pa.int64())}))
    print(f"done {coalescer.batches} batches for {coalescer.offers} offers", flush=True)
    engine.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
