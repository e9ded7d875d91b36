"""Acknowledgements of external consumers are written with the next group commit or GC, never
as a COMMIT of their own under the engine's lock (``sstore.storage.consumers``, step 3).

What must hold: an acknowledgement counts at once in memory (GC, backpressure); a crash may
lose the newest ones, but never one that garbage collection relied on: after a SIGKILL at any
commit step, every batch above what the state file says the consumer acknowledged is still
there for it (no ``GapError``, no batch missing).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sstore import Engine

WORKER = textwrap.dedent("""
    import sys
    from sstore import Engine
    from tests.migrators.test_acknowledgements import declare
    path, batches = sys.argv[1], int(sys.argv[2])
    engine = Engine(path, gc_every=4)
    declare(engine)
    for b in range(1, batches + 1):
        engine.ingest_and_run("inp", [(b,)], batch_id=b)
        engine.acknowledge("sink", b - 1)  # what a sink's target has committed
        if b % 3 == 0:
            engine.collect_garbage()
    engine.close()
""")


def declare(engine: Engine) -> None:
    engine.stream("inp", {"x": "BIGINT"})
    engine.stream("out", {"x": "BIGINT"})
    engine.consumer("out", "sink")

    @engine.procedure(input="inp", output="out")
    def double(tx, batch):
        return tx.sql("SELECT x * 2 AS x FROM batch")


def written_acks(engine: Engine) -> list[int]:
    return [r["batch_id"] for r in engine.query(
        "SELECT batch_id FROM sstore_sys.commits WHERE node = 'sink' ORDER BY batch_id"
    ).to_pylist()]


def test_an_acknowledgement_is_written_with_the_next_group_not_on_its_own(tmp_path) -> None:
    engine = Engine(str(tmp_path / "s.duckdb"))
    declare(engine)
    for b in (1, 2, 3):
        engine.ingest_and_run("inp", [(b,)], batch_id=b)
    engine.acknowledge("sink", 2)
    assert engine.acknowledged("sink") == 2  # in memory at once
    assert written_acks(engine) == []  # no COMMIT of its own
    engine.ingest_and_run("inp", [(4,)], batch_id=4)
    assert written_acks(engine) == [2]  # written by the group of batch 4
    engine.acknowledge("sink", 3)
    assert engine.status().consumers[0].acknowledged == 3  # status writes what it reports
    assert written_acks(engine)[-1] == 3
    engine.acknowledge("sink", 4)
    engine.close()  # close writes the rest
    again = Engine(str(tmp_path / "s.duckdb"))
    declare(again)
    assert again.acknowledged("sink") == 4
    again.close()


def test_gc_writes_the_acknowledgements_it_relies_on(tmp_path) -> None:
    engine = Engine(str(tmp_path / "s.duckdb"))
    declare(engine)
    for b in (1, 2, 3):
        engine.ingest_and_run("inp", [(b,)], batch_id=b)
    engine.acknowledge("sink", 2)
    engine.collect_garbage()
    assert engine.collected_through("out") == 2
    assert written_acks(engine)[-1] == 2  # in GC's own transaction
    engine.close()


def test_a_rewound_or_dropped_consumer_forgets_its_unwritten_acknowledgement(tmp_path) -> None:
    path = str(tmp_path / "s.duckdb")
    engine = Engine(path)
    declare(engine)
    for b in (1, 2, 3):
        engine.ingest_and_run("inp", [(b,)], batch_id=b)
    engine.acknowledge("sink", 3)
    engine.rewind("sink", 1)  # its target lost batches 2-3
    engine.ingest_and_run("inp", [(4,)], batch_id=4)
    assert engine.acknowledged("sink") == 1
    assert max(written_acks(engine), default=0) <= 1
    engine.acknowledge("sink", 4)
    assert engine.drop_consumer("out", "sink")
    engine.close()
    again = Engine(path)
    again.stream("inp", {"x": "BIGINT"})
    again.stream("out", {"x": "BIGINT"})
    assert again.acknowledged("sink") == 0  # dropped: no acknowledgement left behind
    again.close()


@pytest.mark.parametrize("point", ["te.before_commit:5", "te.after_commit:7",
                                   "gc.before_commit:2", "gc.before_commit:3",
                                   "te.after_commit:11"])
def test_a_crash_never_loses_an_acknowledgement_gc_relied_on(tmp_path: Path, point: str) -> None:
    path = str(tmp_path / "s.duckdb")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "SSTORE_CRASH_AT": point,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                          os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), path, "12"], env=env, timeout=300,
                          check=False)
    assert done.returncode == -signal.SIGKILL  # it died at the crash point
    engine = Engine(path)
    declare(engine)
    acked = engine.acknowledged("sink")
    collected = engine.collected_through("out")
    assert collected <= acked  # GC removed nothing the state file does not say was taken
    assert engine.continue_from("out", "sink", acked) == acked  # no GapError
    last = engine.batches("out")[-1][0] if engine.batches("out") else acked
    kept = [b for b, _ in engine.batches("out", after=acked)]
    assert kept == list(range(acked + 1, last + 1))  # every batch above it is still there
    engine.close()


def test_a_sink_does_not_wait_for_a_busy_engine_to_acknowledge(tmp_path: Path,
                                                               pg_url: str) -> None:
    """While a transaction execution holds the engine's lock, a sink delivers and goes on
    without waiting for it; it tells the engine on a later try, and waits for the lock once
    its oldest untold delivery is ``ACK_WAIT_MAX`` old (or when flushed)."""
    import threading
    import time

    import psycopg

    from migrators import StreamToPostgres
    from migrators.engine_to_postgres import ACK_WAIT_MAX

    with Engine(str(tmp_path / "s.duckdb")) as engine:
        engine.stream("out", {"x": "BIGINT"})
        sink = StreamToPostgres(engine, "out", pg_url, "acked_out", ack_every=0.0)
        sink.start()
        engine.ingest("out", [(1,), (2,)])
        held, release = threading.Event(), threading.Event()

        def busy_engine() -> None:
            with engine.lock:
                held.set()
                release.wait(30)

        thread = threading.Thread(target=busy_engine)
        thread.start()
        held.wait(10)
        try:
            began = time.monotonic()
            assert sink.run_pending(ack=False) == 2  # delivered, not waiting for the lock
            assert time.monotonic() - began < ACK_WAIT_MAX
            with psycopg.connect(pg_url) as con:
                assert con.execute("SELECT count(*) FROM acked_out").fetchone() == (2,)
            assert sink._unacked == 1  # not told yet: the engine was busy
            time.sleep(ACK_WAIT_MAX)
            threading.Timer(0.3, release.set).start()
            began = time.monotonic()
            sink.run_pending(ack=False)  # now overdue: waits for the lock, then tells
            assert time.monotonic() - began >= 0.2
        finally:
            release.set()
            thread.join()
        assert sink._unacked == 0 and engine.acknowledged(sink.consumer) == 1
        sink.close()


def test_an_acknowledgement_of_a_batch_never_ingested_is_refused(tmp_path) -> None:
    """Found by the model (issue 34, ``benchmarks.model``): ``acknowledge`` took a batch-id
    that no stream had committed, and GC then removed batches the consumer never read."""
    from sstore.storage.consumers import AcknowledgementError
    engine = Engine(str(tmp_path / "s.duckdb"))
    declare(engine)
    for b in (1, 2):
        engine.ingest_and_run("inp", [(b,)], batch_id=b)
    with pytest.raises(AcknowledgementError, match="batch 7"):
        engine.acknowledge("sink", 7)
    assert engine.acknowledged("sink") == 0
    engine.ingest_and_run("inp", [(3,)], batch_id=3)
    engine.collect_garbage()
    assert [b for b, _ in engine.batches("out")] == [1, 2, 3]  # all kept for the consumer
    engine.acknowledge("sink", 2)  # what committed: taken
    assert engine.acknowledged("sink") == 2
    engine.close()
