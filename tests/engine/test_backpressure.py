"""Backpressure in the engine alone: bounds, refusals, waits, what status and metrics show.

Real DuckDB files; the consumer that acknowledges from a thread of its own is a small
``ObservableSink`` written here the way a user writes one (the documented protocol), not a
stand-in for engine code. PostgreSQL throttled for real is in test_backpressure_postgres.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest

from sstore import (
    Bound,
    ConsumerStalledError,
    DeclarationError,
    Engine,
    IngestTimeoutError,
    observe,
)
from sstore.base.errors import SStoreError
from sstore.base.retry import Kind, kind_of
from sstore.execution.interrupts import Stopped
from sstore.observe import SinkSnapshot
from tests.observe.test_observe import sample, scrape


def rows(first: int, n: int = 10) -> pa.Table:
    return pa.table({"id": pa.array(range(first, first + n), pa.int64()),
                     "v": pa.array([f"value-{i:06d}" for i in range(first, first + n)])})


def declare(eng: Engine) -> None:
    eng.stream("events", {"id": "BIGINT", "v": "VARCHAR"})

    @eng.procedure(input="events", output="typed")
    def add_length(tx, batch):
        return tx.sql("SELECT id, v, length(v) AS n FROM batch")


def stored(eng: Engine, stream: str, after: int) -> tuple[int, int]:
    """(batches, rows) of ``stream`` stored in DuckDB above batch ``after``."""
    got = eng.query(f"SELECT count(DISTINCT _batch_id) AS b, count(*) AS r FROM {stream} "
                    f"WHERE _batch_id > ?", after)
    return got.column("b")[0].as_py(), got.column("r")[0].as_py()


def pressure(eng: Engine, consumer: str) -> dict:
    report = eng.status().backpressure
    assert report is not None
    return next(c for c in report["consumers"] if c["consumer"] == consumer)


def test_bounds_are_checked_when_declared() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(DeclarationError, match="positive integer"):
            Bound(batches=bad)  # type: ignore[arg-type]
        with pytest.raises(DeclarationError, match="positive integer"):
            Bound(bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(DeclarationError, match="ingest_timeout"):
        Engine(":memory:", ingest_timeout=-1)
    assert Bound() == Bound(10_000, 1 << 30)
    assert Bound(None, None).batches is None


def test_a_consumer_nobody_runs_refuses_ingest_at_its_bound(state_path: str) -> None:
    """Single-threaded: a declared consumer that is not running cannot catch up while
    ingest waits, so ingest refuses at once (no hang), writes nothing, and takes the same
    batch once the consumer acknowledged."""
    eng = Engine(state_path, ingest_timeout=30)
    declare(eng)
    eng.consumer("typed", "export")
    eng.backpressure.bound("export", Bound(batches=3, bytes=None))
    for b in (1, 2, 3):
        eng.ingest("events", rows(b * 100), batch_id=b)
        eng.run_until_idle()
    assert stored(eng, "typed", 0) == (3, 30)
    began = time.monotonic()
    with pytest.raises(ConsumerStalledError) as caught:
        eng.ingest("events", rows(400), batch_id=4)
    assert time.monotonic() - began < 5  # refused at once, not after the 30 s timeout
    err = caught.value
    assert kind_of(err) is Kind.TERMINAL and err.stream == "events" and err.waited == 0
    assert [(p.consumer, p.lag_batches, p.lag_rows) for p in err.consumers] == \
        [("export", 3, 30)]
    assert "'export' (3 batches, 30 rows" in str(err) and "not ingested" in str(err)
    # nothing half-written: no row, no commit record, the next batch-id is still 4
    assert eng.query("SELECT count(*) AS n FROM events WHERE _batch_id = 4")["n"][0].as_py() == 0
    assert eng.query("SELECT count(*) AS n FROM sstore_sys.commits WHERE batch_id = 4"
                     )["n"][0].as_py() == 0
    assert eng.ingest("events", rows(200), batch_id=2).duplicate  # a re-send: never refused
    shown = pressure(eng, "export")
    assert shown | {"streams": None} == {
        "consumer": "export", "kind": "consumer", "streams": None, "lag_batches": 3,
        "lag_rows": 30, "lag_bytes": shown["lag_bytes"], "bound_batches": 3,
        "bound_bytes": None, "over": True, "running": False, "halted": None,
        "waiting_ingests": 0, "blocked_seconds": 0.0, "refused": 1}
    assert shown["streams"] == ["typed"] and shown["lag_bytes"] > 0
    eng.acknowledge("export", 1)
    assert eng.ingest("events", rows(400), batch_id=4) == 4  # the same call, now admitted
    eng.run_until_idle()
    assert stored(eng, "typed", eng.acknowledged("export")) == (3, 30)  # never past 3
    report = eng.status().backpressure
    assert report["stalls"] == 1 and report["timeouts"] == 0 and not report["blocked"]
    eng.close()


def test_procedures_have_a_bound_too(state_path: str) -> None:
    """A program that ingests without running its procedures is refused at the bound; so is
    ingest past a halted procedure's bound, with the halt in the message."""
    eng = Engine(state_path, max_lag=Bound(batches=2, bytes=None))
    declare(eng)
    eng.ingest("events", rows(1))
    eng.ingest("events", rows(20))
    with pytest.raises(ConsumerStalledError, match="procedure 'add_length' .2 batches"):
        eng.ingest("events", rows(40))
    assert eng.run_until_idle() == 2
    eng.ingest("events", rows(40))
    eng.close()

    eng = Engine(state_path + ".2", max_lag=Bound(batches=2, bytes=None))
    eng.stream("events", {"id": "BIGINT", "v": "VARCHAR"})

    @eng.procedure(input="events")
    def picky(tx, batch):
        if batch.num_rows and batch["id"][0].as_py() == 7:
            raise ValueError("id 7 is not welcome")

    eng.ingest("events", rows(7, 1))
    eng.run_until_idle()  # halts on batch 1
    eng.ingest("events", rows(8, 1))
    with pytest.raises(ConsumerStalledError, match="halted at batch 1"):
        eng.ingest("events", rows(9, 1))
    eng.close()


def test_ingest_waits_for_the_runner_thread(state_path: str) -> None:
    """With another thread running the engine, ingest past a procedure's bound waits (the
    lock is released meanwhile) instead of failing; the pending batches never exceed it.

    A transaction execution holds the engine's lock, so an ingest arriving meanwhile first
    waits for the lock; it waits for the bound when it takes the lock before the runner
    picks the pending batch up, which happens within a few batches (the loop stops there)."""
    eng = Engine(state_path, max_lag=Bound(batches=1, bytes=None), ingest_timeout=30)
    eng.stream("events", {"id": "BIGINT", "v": "VARCHAR"})
    eng.stream("typed", retain="all")  # kept, to count its rows at the end

    @eng.procedure(input="events", output="typed")
    def slow(tx, batch):
        time.sleep(0.01)
        return tx.sql("SELECT id, v FROM batch")

    eng.ingest("events", rows(0))  # starts the engine
    stop = threading.Event()
    runner = threading.Thread(target=eng.run, args=(stop, 0.02))
    runner.start()
    try:
        last = 1
        while eng.backpressure.report_counts()["blocked_ingests"] < 3 and last < 300:
            last += 1
            eng.ingest("events", rows(last * 100), batch_id=last)
            with eng.lock:
                assert eng.runtime.ledger.progress.get("slow", 0) >= last - 1  # lag <= 1
        deadline = time.monotonic() + 30
        while eng.acknowledged("slow") < last and time.monotonic() < deadline:
            time.sleep(0.02)
        report = eng.status().backpressure
        assert report["blocked_ingests"] == 3 and report["blocked_seconds"] > 0
        assert report["timeouts"] == 0 and report["stalls"] == 0
        assert pressure(eng, "slow")["blocked_seconds"] > 0
    finally:
        stop.set()
        runner.join()
    assert eng.query("SELECT count(*) AS n FROM typed")["n"][0].as_py() == 10 * last
    assert eng.acknowledged("slow") == last
    eng.close()


class ThreadedExport:
    """A user's own consumer of a stream: it acknowledges from a thread of its own while
    ``flowing`` is set, and shows itself to the engine (``ObservableSink``) as running in
    the background, so ingests wait for it rather than being refused."""

    def __init__(self, eng: Engine, stream: str, name: str) -> None:
        self.eng, self.stream, self.name = eng, stream, name
        self.flowing = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        eng.consumer(stream, name)
        eng.register_sink(self)

    def metrics_snapshot(self) -> SinkSnapshot:
        alive = self.thread.is_alive()
        return SinkSnapshot(self.name, self.stream, "nowhere", None, 0, 0, 0, None, None,
                            alive, alive)

    def loop(self) -> None:
        while not self.stopping.wait(0.01):
            if self.flowing.is_set():
                got = self.eng.batches(self.stream, self.eng.acknowledged(self.name))
                if got:
                    self.eng.acknowledge(self.name, got[-1][0])


@pytest.fixture
def export(state_path: str) -> Iterator[tuple[Engine, ThreadedExport]]:
    eng = Engine(state_path, ingest_timeout=0.4)
    eng.stream("events", {"id": "BIGINT", "v": "VARCHAR"})
    consumer = ThreadedExport(eng, "events", "export")
    eng.backpressure.bound("export", Bound(batches=None, bytes=2_000))
    consumer.thread.start()
    yield eng, consumer
    consumer.stopping.set()
    consumer.thread.join()
    eng.close()


def test_timeout_is_transient_and_the_byte_bound_holds(export: tuple[Engine, ThreadedExport]
                                                       ) -> None:
    """A running consumer that does not keep up: ingest waits ``ingest_timeout``, then raises
    ``IngestTimeoutError`` (transient), with nothing written; the byte bound keeps what is
    stored for the consumer under bound + one batch; once it flows the same batch goes in."""
    eng, consumer = export
    per_batch = rows(0).nbytes
    admitted = 0
    for b in range(1, 100):
        try:
            eng.ingest("events", rows(b * 100), batch_id=b)
        except IngestTimeoutError as err:
            refused = b
            assert kind_of(err) is Kind.TRANSIENT and 0.35 <= err.waited < 5
            assert err.consumers[0].consumer == "export" and err.consumers[0].running
            break
        admitted += 1
        assert pressure(eng, "export")["lag_bytes"] < 2_000 + per_batch
    else:
        pytest.fail("never refused")
    assert admitted == -(-2_000 // per_batch)  # lag reaches the bound, then ingest waits
    assert stored(eng, "events", 0)[0] == admitted
    assert eng.query("SELECT count(*) AS n FROM events WHERE _batch_id = ?", refused
                     )["n"][0].as_py() == 0
    shown = pressure(eng, "export")
    assert shown["over"] and shown["running"] and shown["refused"] == 1
    assert shown["bound_bytes"] == 2_000 and shown["bound_batches"] is None
    assert shown["lag_bytes"] == admitted * per_batch  # bytes per row of the newest batch
    assert 0.35 <= shown["blocked_seconds"] < 5

    eng.backpressure.timeout = 30
    done: list[int] = []
    waiter = threading.Thread(target=lambda: done.append(
        eng.ingest("events", rows(refused * 100), batch_id=refused)))
    waiter.start()
    deadline = time.monotonic() + 10
    while not eng.status().backpressure["blocked"] and time.monotonic() < deadline:
        time.sleep(0.01)
    report = eng.status().backpressure
    assert report["blocked"] and report["waiting_ingests"] == 1
    assert pressure(eng, "export")["waiting_ingests"] == 1
    url = observe.serve(eng, 0)
    m = scrape(url)
    labels = {"consumer": "export", "kind": "sink", "streams": "events"}
    assert sample(m, "sstore_ingest_blocked") == 1
    assert sample(m, "sstore_backpressure_over_bound", **labels) == 1
    assert sample(m, "sstore_backpressure_bound_bytes", **labels) == 2_000
    assert sample(m, "sstore_backpressure_lag_bytes", **labels) == admitted * per_batch
    assert sample(m, "sstore_backpressure_waiting_ingests", **labels) == 1
    assert sample(m, "sstore_ingest_refused_total", reason="timeout") == 1
    assert sample(m, "sstore_ingest_blocked_seconds_total") > 0.35
    consumer.flowing.set()  # the consumer catches up: the waiting ingest goes on
    waiter.join(timeout=10)
    assert done == [refused]
    m = scrape(url)
    assert sample(m, "sstore_ingest_blocked") == 0
    assert sample(m, "sstore_backpressure_blocked_seconds_total", **labels) > 0.35
    assert eng.status().backpressure["blocked_ingests"] == 2


def test_a_pull_subscription_is_bounded_too(state_path: str) -> None:
    """Batches queued for ``poll`` are kept in memory: past the bound, an ingest is refused
    while nobody polls, and waits while another thread polls."""
    eng = Engine(state_path, ingest_timeout=30)
    eng.stream("events", {"id": "BIGINT", "v": "VARCHAR"})
    sub = eng.subscribe("events")
    eng.backpressure.bound(sub.name, Bound(batches=2, bytes=None))
    eng.ingest("events", rows(0))
    eng.ingest("events", rows(10))
    with pytest.raises(ConsumerStalledError, match=f"subscription '{sub.name}' .2 batches, "
                                                   f"20 rows, ~{2 * rows(0).nbytes} bytes"):
        eng.ingest("events", rows(20))
    assert [b for b, _ in sub.poll()] == [1, 2]
    eng.ingest("events", rows(20))
    eng.ingest("events", rows(30))
    got: list[int] = []
    stop = threading.Event()

    def poller() -> None:  # polls now and then from a thread of its own
        while not stop.wait(0.2):
            got.extend(b for b, _ in sub.poll())

    thread = threading.Thread(target=poller)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while sub.poller is not thread and time.monotonic() < deadline:
            time.sleep(0.01)
        for first in range(40, 120, 10):  # each over the bound at times: waits, never refused
            eng.ingest("events", rows(first))
            assert sub.queued()[0] <= 2
    finally:
        stop.set()
        thread.join()
    got.extend(b for b, _ in sub.poll())
    assert got == list(range(3, 13))
    report = eng.status().backpressure
    assert report["stalls"] == 1 and report["timeouts"] == 0 and report["blocked_ingests"] >= 1
    shown = pressure(eng, sub.name)
    assert shown["kind"] == "subscription" and shown["lag_batches"] == 0
    assert shown["blocked_seconds"] > 0
    eng.close()


def test_a_stop_or_close_ends_a_wait(export: tuple[Engine, ThreadedExport]) -> None:
    """A waiting ingest does not outlive a stop request (Ctrl-C, SIGTERM, interrupt) or the
    engine: it ends with ``Stopped`` / ``SStoreError``, the batch not ingested."""
    eng, _ = export
    eng.backpressure.timeout = 60
    b = 0
    while eng.status().backpressure["consumers"][0]["over"] is False:
        b += 1
        eng.ingest("events", rows(b * 100), batch_id=b)
    outcome: list[BaseException] = []

    def send() -> None:
        try:
            eng.ingest("events", rows(0), batch_id=b + 1)
        except BaseException as exc:  # noqa: BLE001 - Stopped is a BaseException
            outcome.append(exc)

    for end in ("interrupt", "close"):
        waiter = threading.Thread(target=send)
        began = time.monotonic()
        waiter.start()
        deadline = time.monotonic() + 10
        while not eng.backpressure.report_counts()["waiting_ingests"] and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        if end == "interrupt":
            eng.interrupt()
        else:
            eng.close()
        waiter.join(timeout=10)
        assert time.monotonic() - began < 5
        err = outcome.pop()
        if end == "interrupt":
            assert isinstance(err, Stopped) and "not ingested" in str(err)
            with pytest.raises(Stopped):  # a run loop takes the stop request, as it would
                eng.run_until_idle()
            assert eng.query("SELECT count(*) AS n FROM events WHERE _batch_id = ?", b + 1
                             )["n"][0].as_py() == 0
        else:
            assert isinstance(err, SStoreError) and "closed" in str(err)
