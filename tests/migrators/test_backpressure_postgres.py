"""Backpressure against a PostgreSQL target that stops taking rows, for real.

Another connection holds ``LOCK TABLE target IN ACCESS EXCLUSIVE MODE``: the sink's COPY
waits behind it, its acknowledgements stop, and the engine keeps ingesting until the sink's
bound is reached. Then ingest waits and gives up with ``IngestTimeoutError``; a waiting ingest
shows in ``Engine.status()``, ``/status`` and ``/metrics``; once the lock is released the
waiting ingest goes on and every row reaches PostgreSQL exactly once.
"""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pyarrow as pa

from migrators import StreamToPostgres
from sstore import Bound, Engine, IngestTimeoutError, observe
from sstore.base.retry import Kind, kind_of
from tests.observe.test_observe import get, sample, scrape

BOUND = 5
ROWS = 20  # per batch
SINK = "migrator:public.bp_target"


def batch(b: int) -> pa.Table:
    ids = range(b * ROWS, (b + 1) * ROWS)
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "v": pa.array([f"reading {i}" for i in ids])})


def retained(eng: Engine, after: int) -> tuple[int, int]:
    """(batches, rows) of the sink's stream stored in DuckDB above ``after``, plus the border
    batches still on their way to it (above what the procedure completed)."""
    got = eng.query(
        "SELECT (SELECT count(DISTINCT _batch_id) FROM enriched WHERE _batch_id > $after) "
        "+ (SELECT count(DISTINCT _batch_id) FROM readings WHERE _batch_id > "
        "   (SELECT coalesce(max(batch_id), 0) FROM sstore_sys.commits WHERE node = 'enrich')"
        "   AND _batch_id > $after) AS b, "
        "(SELECT count(*) FROM enriched WHERE _batch_id > $after) AS r",
        params={"after": after})
    return got["b"][0].as_py(), got["r"][0].as_py()


def completed(eng: Engine, procedure: str) -> int:
    """The highest batch-id ``procedure`` has committed."""
    return eng.query("SELECT coalesce(max(batch_id), 0) AS b FROM sstore_sys.commits "
                     "WHERE node = ?", procedure)["b"][0].as_py()


def test_a_locked_target_throttles_ingest_and_loses_nothing(state_path: str,
                                                            pg_url: str) -> None:
    eng = Engine(state_path, ingest_timeout=0.5, gc_every=1)
    eng.stream("readings", {"id": "BIGINT", "v": "VARCHAR"})

    @eng.procedure(input="readings", output="enriched")
    def enrich(tx, rows):
        return tx.sql("SELECT id, v, length(v) AS n FROM batch")

    sink = StreamToPostgres(eng, "enriched", pg_url, "public.bp_target", ack_every=0.02,
                            max_lag=Bound(batches=BOUND, bytes=None))
    ingested: list[int] = []  # batch-ids the engine took
    eng.ingest("readings", batch(1), batch_id=1)
    ingested.append(1)
    stop = threading.Event()
    runner = threading.Thread(target=eng.run, args=(stop, 0.02), name="test-runner")
    runner.start()
    locker = psycopg.connect(pg_url)
    try:
        sink.attach()
        for b in (2, 3):
            ingested.append(eng.ingest("readings", batch(b), batch_id=b))
        # the runner thread has run the procedure on batch 3 (flush waits for what has
        # committed so far: on a busy machine that was batch 1 only, and acked stayed 1)
        deadline = time.monotonic() + 30
        while completed(eng, "enrich") < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sink.flush(timeout=30)
        url = observe.serve(eng, 0)

        # the warehouse stops taking rows: an ACCESS EXCLUSIVE lock held by another session
        locker.execute("LOCK TABLE public.bp_target IN ACCESS EXCLUSIVE MODE")
        acked = eng.acknowledged(SINK)
        assert acked == 3
        b, samples, refused = 4, [], None
        while refused is None:
            began = time.monotonic()
            try:
                ingested.append(eng.ingest("readings", batch(b), batch_id=b))
            except IngestTimeoutError as err:
                refused = err
                assert 0.5 <= time.monotonic() - began < 10
                break
            samples.append(retained(eng, acked))
            b += 1
        # exactly the bound was admitted, then the ingest waited 0.5 s and gave up
        assert ingested[-1] == 3 + BOUND and b == 4 + BOUND
        assert kind_of(refused) is Kind.TRANSIENT and refused.stream == "readings"
        assert [(p.consumer, p.lag_batches, p.running) for p in refused.consumers] == \
            [(SINK, BOUND, True)]
        assert max(s[0] for s in samples) <= BOUND
        assert retained(eng, acked) == (BOUND, BOUND * ROWS)  # measured in DuckDB
        assert eng.query("SELECT count(*) AS n FROM readings WHERE _batch_id = ?", b
                         )["n"][0].as_py() == 0  # the refused batch left nothing
        assert eng.acknowledged(SINK) == acked  # the sink is stuck behind the lock

        # the same batch again, now with time to wait: ingest blocks, and shows it
        eng.backpressure.timeout = 60
        result: list[object] = []

        def send() -> None:
            try:
                result.append(eng.ingest("readings", batch(b), batch_id=b))
            except Exception as exc:  # noqa: BLE001 - reported to the test below
                result.append(exc)

        waiter = threading.Thread(target=send, name="test-waiting-ingest")
        waiter.start()
        deadline = time.monotonic() + 10
        while not eng.backpressure.report_counts()["waiting_ingests"] and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # blocked for a while
        status = eng.status()
        report = status.backpressure
        assert report is not None and report["blocked"] and report["waiting_ingests"] == 1
        assert report["timeouts"] == 1 and report["stalls"] == 0
        assert report["blocked_seconds"] >= 0.5 + 0.3
        shown = next(c for c in report["consumers"] if c["consumer"] == SINK)
        assert (shown["kind"], shown["streams"], shown["lag_batches"], shown["lag_rows"],
                shown["bound_batches"], shown["bound_bytes"], shown["over"],
                shown["running"], shown["waiting_ingests"], shown["refused"]) == \
            ("sink", ["enriched"], BOUND, BOUND * ROWS, BOUND, None, True, True, 1, 1)
        assert shown["lag_bytes"] > 0 and shown["blocked_seconds"] >= 0.6  # whole steps
        doc = json.loads(get(url + "status"))
        assert doc["backpressure"]["blocked"] is True
        assert doc["live"]["backpressure"]["waiting_ingests"] == 1
        labels = {"consumer": SINK, "kind": "sink", "streams": "enriched"}
        m = scrape(url)
        assert sample(m, "sstore_ingest_blocked") == 1
        assert sample(m, "sstore_ingest_blocked_seconds_total") >= 0.8
        assert sample(m, "sstore_ingest_refused_total", reason="timeout") == 1
        assert sample(m, "sstore_backpressure_lag_batches", **labels) == BOUND
        assert sample(m, "sstore_backpressure_lag_rows", **labels) == BOUND * ROWS
        assert sample(m, "sstore_backpressure_bound_batches", **labels) == BOUND
        assert sample(m, "sstore_backpressure_over_bound", **labels) == 1
        assert sample(m, "sstore_backpressure_waiting_ingests", **labels) == 1
        assert sample(m, "sstore_backpressure_blocked_seconds_total", **labels) >= 0.6
        assert waiter.is_alive() and not result

        # the warehouse takes rows again: the waiting ingest goes on, everything is delivered
        locker.rollback()
        waiter.join(timeout=30)
        assert result == [b]
        ingested.append(b)
        for nxt in range(b + 1, b + 3 * BOUND):
            ingested.append(eng.ingest("readings", batch(nxt), batch_id=nxt))
            assert retained(eng, eng.acknowledged(SINK))[0] <= BOUND
        assert sink.flush(timeout=60)
        m = scrape(url)
        assert sample(m, "sstore_ingest_blocked") == 0
        assert sample(m, "sstore_backpressure_over_bound", **labels) == 0
    finally:
        locker.close()
        stop.set()
        runner.join()
        sink.detach()
    eng.close()

    with psycopg.connect(pg_url) as con:
        total, distinct = con.execute("SELECT count(*), count(DISTINCT id) FROM "
                                      "public.bp_target").fetchone()
        got = sorted(r[0] for r in con.execute("SELECT id FROM public.bp_target"))
    expected = sorted(i for b in ingested for i in range(b * ROWS, (b + 1) * ROWS))
    assert ingested == list(range(1, 4 + BOUND + 3 * BOUND))  # in order, each once
    assert total == distinct == len(expected)  # nothing duplicated
    assert got == expected  # nothing lost
