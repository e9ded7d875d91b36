"""NATS JetStream (sstore.sources.jetstream, `sstore source nats`): a run of sequence numbers
per batch, exactly once across SIGKILLs of the source, a broker restart and redeliveries after
an ack timeout; poison messages become dead letters, never a stuck stream. Each test runs its
own nats-server (tests/nats_server.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from sstore import Engine
from sstore.sources import Chunk, SourceError, dead_letters, feed
from sstore.sources.jetstream import NatsSource
from tests.nats_server import NatsServer, consumer_acks, publish

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = {"id": "INTEGER", "name": "VARCHAR", "day": "DATE"}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats")
    server.start()
    yield server
    server.kill()


def program(path: str) -> Engine:
    eng = Engine(path)
    eng.stream("orders", COLUMNS)

    @eng.procedure(input="orders", output="ids")
    def take(tx, batch):
        return tx.sql("SELECT id FROM batch")

    return eng


def orders(first: int, n: int) -> list[dict[str, object]]:
    return [{"id": i, "name": f"n{i}", "day": "2024-03-01"} for i in range(first, first + n)]


def stored(path: str) -> list[tuple[int, int]]:
    with Engine.open_existing(path) as eng:
        return [(r["_batch_id"], r["id"]) for r in
                eng.query("SELECT _batch_id, id FROM orders ORDER BY id").to_pylist()]


def test_runs_of_sequence_numbers_once_acknowledged_after_commit(
        broker: NatsServer, state_path: str) -> None:
    url = broker.url
    seqs = publish(url, "SHOP", "SHOP.orders", orders(1, 3), create=True)
    other = publish(url, "SHOP", "SHOP.refunds", [{"x": 1}])  # another subject, between
    seqs += publish(url, "SHOP", "SHOP.orders", orders(4, 4))
    assert seqs == [1, 2, 3, 5, 6, 7, 8] and other == [4]
    batches: list[tuple[int, int, int]] = []
    with program(state_path) as eng:
        report = feed(eng, NatsSource(url, "SHOP", "SHOP.orders", batch=4), "orders",
                      until_idle=True, poll=0.2,
                      on_batch=lambda c: batches.append((c.first, c.last, c.batch_id)))
        assert (report.rows, report.position) == (7, 8)
        assert eng.query_rows("SELECT count(*) FROM ids")[1] == [(7,)]  # the procedure ran
    assert batches == [(1, 5, 5), (6, 8, 8)]  # 4 messages of the subject each, at most
    assert stored(state_path) == [(5, 1), (5, 2), (5, 3), (5, 4), (8, 5), (8, 6), (8, 7)]
    assert consumer_acks(url, "SHOP", "sstore_orders") == (8, 0)
    with program(state_path) as eng:  # nothing new: nothing taken
        assert feed(eng, NatsSource(url, "SHOP", "SHOP.orders"), "orders", until_idle=True,
                    poll=0.2).batches == 0
    publish(url, "SHOP", "SHOP.orders", orders(8, 2))
    with program(state_path) as eng:
        report = feed(eng, NatsSource(url, "SHOP", "SHOP.orders"), "orders", until_idle=True,
                      poll=0.2)
    assert (report.batches, report.rows, report.position) == (1, 2, 10)
    assert [i for _, i in stored(state_path)] == list(range(1, 10))


def test_poison_messages_are_dead_letters_and_the_stream_goes_on(
        broker: NatsServer, state_path: str) -> None:
    url = broker.url
    publish(url, "SHOP", "SHOP.orders", [
        orders(1, 1)[0], b"not json", [1, 2], {"id": "seven", "name": "x", "day": None},
        {"id": 5, "colour": "red"}, {"id": 6, "name": "no day"}, orders(7, 1)[0],
        orders(8, 2), [orders(10, 1)[0], {"id": "x"}]],  # an array: its rows, all or none
        create=True)
    with program(state_path) as eng:
        report = feed(eng, NatsSource(url, "SHOP", "SHOP.orders"), "orders", until_idle=True,
                      poll=0.2)
        assert (report.batches, report.rows, report.dead_letters) == (1, 5, 5)
        dead = dead_letters(eng, "orders")
    assert [(d["position"], d["batch_id"]) for d in dead] == [
        (2, 9), (3, 9), (4, 9), (5, 9), (9, 9)]
    assert [d["payload"] for d in dead][:4] == [
        b"not json", b"[1, 2]", b'{"id": "seven", "name": "x", "day": null}',
        b'{"id": 5, "colour": "red"}']
    reasons = [d["error"] for d in dead]
    assert reasons[0].startswith("not JSON") and "not a JSON object" in reasons[1]
    assert "column 'id'" in reasons[2] and "unknown column" in reasons[3]
    assert "column 'id'" in reasons[4]
    assert stored(state_path) == [(9, 1), (9, 6), (9, 7), (9, 8), (9, 9)]  # absent key: NULL
    assert consumer_acks(url, "SHOP", "sstore_orders") == (9, 0)  # acknowledged: not stuck


class LosesFirstAck(NatsSource):
    """The first batch's acknowledgement is lost on the way (as on a broken connection)."""

    def acknowledge(self, chunk: Chunk) -> None:
        if chunk.first == 1:
            self._position = chunk.last  # what acknowledge notes before it sends
            return
        super().acknowledge(chunk)


def test_a_redelivery_after_the_ack_timeout_is_skipped(broker: NatsServer,
                                                       state_path: str) -> None:
    """The broker delivers messages 1..3 again once their ack wait ran out, after 4..6 were
    taken: they are committed already, so they are acknowledged and skipped."""
    url = broker.url
    publish(url, "SHOP", "SHOP.orders", orders(1, 6), create=True)
    source = LosesFirstAck(url, "SHOP", "SHOP.orders", batch=3, ack_wait=0.5)
    with program(state_path) as eng:
        report = feed(eng, source, "orders", until_idle=True, poll=1.5)
    assert source.redelivered == 3
    assert (report.batches, report.rows) == (2, 6)
    assert stored(state_path) == [(3, 1), (3, 2), (3, 3), (6, 4), (6, 5), (6, 6)]
    assert consumer_acks(url, "SHOP", "sstore_orders") == (6, 0)


def test_a_consumer_the_source_did_not_make_is_left_alone(broker: NatsServer,
                                                         state_path: str) -> None:
    url = broker.url
    publish(url, "SHOP", "SHOP.orders", orders(1, 1), create=True)

    async def theirs() -> None:
        from nats.js.api import ConsumerConfig
        nc = await nats.connect(url)
        await nc.jetstream().add_consumer("SHOP", ConsumerConfig(durable_name="billing"))
        await nc.close()

    asyncio.run(theirs())
    with program(state_path) as eng, pytest.raises(SourceError, match="did not make"):
        feed(eng, NatsSource(url, "SHOP", "SHOP.orders", durable="billing"), "orders",
             until_idle=True, poll=0.2)
    assert consumer_acks(url, "SHOP", "billing") == (0, 0)  # still there


def test_a_gap_in_the_broker_is_refused(broker: NatsServer, state_path: str) -> None:
    url = broker.url
    publish(url, "SHOP", "SHOP.orders", orders(1, 2), create=True)
    with program(state_path) as eng:
        feed(eng, NatsSource(url, "SHOP", "SHOP.orders"), "orders", until_idle=True, poll=0.2)
    publish(url, "SHOP", "SHOP.orders", orders(3, 2))

    async def purge() -> None:
        nc = await nats.connect(url)
        await nc.jetstream().purge_stream("SHOP")
        await nc.close()

    asyncio.run(purge())  # 3 and 4 removed before they were taken
    publish(url, "SHOP", "SHOP.orders", orders(5, 1))
    with program(state_path) as eng, pytest.raises(SourceError, match="3..4 were removed"):
        feed(eng, NatsSource(url, "SHOP", "SHOP.orders"), "orders", until_idle=True, poll=0.2)
    assert stored(state_path) == [(2, 1), (2, 2)]


def test_a_broker_restart_loses_and_doubles_nothing(broker: NatsServer,
                                                    state_path: str) -> None:
    url = broker.url
    publish(url, "SHOP", "SHOP.orders", orders(1, 40), create=True)
    stop = threading.Event()
    progress: list[int] = []
    failures: list[BaseException] = []

    def on_batch(chunk: Chunk) -> None:
        progress.append(chunk.last)
        time.sleep(0.05)  # slow enough for the restart to land mid-run

    eng = program(state_path)
    source = NatsSource(url, "SHOP", "SHOP.orders", batch=5, ack_wait=1.0)

    def run() -> None:
        try:
            feed(eng, source, "orders", stop=stop, poll=0.2, on_batch=on_batch)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failures.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 30
    while not progress and time.monotonic() < deadline:
        time.sleep(0.01)
    at_kill = progress[-1]
    broker.kill()  # mid-run: SIGKILL of the broker
    time.sleep(0.5)
    broker.start()
    publish(url, "SHOP", "SHOP.orders", orders(41, 20))
    while (not progress or progress[-1] < 60) and time.monotonic() < deadline and worker.is_alive():
        time.sleep(0.05)
    stop.set()
    worker.join(30)
    eng.close()
    assert not failures, failures
    assert [i for _, i in stored(state_path)] == list(range(1, 61))
    assert at_kill < 40 and progress[-1] == 60


# ------------------------------------------------------------------ SIGKILL, a real process
def cli(state: str, url: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sstore.cli", "source", "nats", state, "--url", url,
         "--js-stream", "SHOP", "--subject", "SHOP.orders", "--stream", "orders",
         "--batch", "7", "--poll", "0.2", "--until-idle"],
        cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)


def test_sigkill_of_the_source_then_restart_takes_every_message_once(
        broker: NatsServer, state_path: str) -> None:
    url = broker.url
    publish(url, "SHOP", "SHOP.orders", orders(1, 120), create=True)
    with program(state_path) as eng:
        eng.run_until_idle()  # the program ran once: the state file knows the stream
    proc = cli(state_path, url, {"SSTORE_CRASH_AT": "source.after_commit:2"})
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    committed = max(b for b, _ in stored(state_path))
    assert committed == 14  # two batches of 7 committed ...
    assert consumer_acks(url, "SHOP", "sstore_orders")[0] == 7  # ... the second not acked
    for spec in ("ingest.before_commit:3", "ingest.after_commit:2"):
        proc = cli(state_path, url, {"SSTORE_CRASH_AT": spec})
        proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, spec
    proc = cli(state_path, url)
    time.sleep(1.2)
    proc.kill()  # wherever the timer lands
    proc.communicate(timeout=60)
    proc = cli(state_path, url)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert [i for _, i in stored(state_path)] == list(range(1, 121))
    assert consumer_acks(url, "SHOP", "sstore_orders") == (120, 0)
