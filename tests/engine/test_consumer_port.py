"""The consumer port (``Engine.port``, ``sstore.execution.consumer_port``): every call a consumer
makes is checked against what its stream committed, so no call can make garbage collection remove a
batch the consumer never read, and no read comes back with rows missing."""

from __future__ import annotations

import pytest

from sstore import Engine
from sstore.base.errors import GapError
from sstore.execution.consumer_port import ReadAheadError
from sstore.storage.consumers import AcknowledgementError


def engine_with_consumer() -> Engine:
    engine = Engine(":memory:")
    engine.stream("inp", {"x": "BIGINT"})
    engine.stream("out", {"x": "BIGINT"})
    engine.consumer("out", "reader")

    @engine.procedure(input="inp", output="out")
    def double(tx, batch):
        return tx.sql("SELECT x * 2 AS x FROM batch")

    return engine


def out_rows(engine: Engine) -> list[int]:
    return sorted(engine.query("SELECT x FROM out").column("x").to_pylist())


def test_an_acknowledgement_ahead_of_its_stream_is_refused() -> None:
    """Batches 1 and 2 are ingested, but ``out`` has committed none of them yet: an
    acknowledgement of 2 would let GC remove both as they commit, unread."""
    engine = engine_with_consumer()
    engine.ingest("inp", [(1,)])
    engine.ingest("inp", [(2,)])
    port = engine.port("out", "reader")
    with pytest.raises(AcknowledgementError, match="committed batches up to 0"):
        port.acknowledge(2)
    with pytest.raises(AcknowledgementError):
        engine.acknowledge("reader", 2)  # the engine's own method is the same rule
    assert port.acknowledged() == 0
    engine.run_until_idle()
    engine.collect_garbage()
    assert out_rows(engine) == [2, 4]  # nothing removed under the consumer
    assert port.read(1, 2).column("x").to_pylist() == [2, 4]
    port.acknowledge(2)
    assert port.acknowledged() == 2
    engine.close()


def test_a_read_of_collected_batches_is_a_gap_not_fewer_rows() -> None:
    engine = engine_with_consumer()
    for b in (1, 2, 3):
        engine.ingest_and_run("inp", [(b,)], batch_id=b)
    port = engine.port("out", "reader")
    port.acknowledge(2)
    engine.collect_garbage()
    assert [b for b, _ in port.batches()] == [3]
    with pytest.raises(GapError, match="batches 1..2"):
        port.read(1, 3)
    with pytest.raises(GapError):
        engine.read_batches("out", 2, 3)
    assert port.read(3, 3).column("x").to_pylist() == [6]
    engine.close()


def test_a_read_ahead_of_the_stream_is_refused() -> None:
    engine = engine_with_consumer()
    engine.ingest_and_run("inp", [(1,)], batch_id=1)
    engine.ingest("inp", [(2,)])  # ingested, not run: out has committed batch 1 only
    port = engine.port("out", "reader")
    with pytest.raises(ReadAheadError, match="committed batches up to 1"):
        port.read(1, 2)
    assert port.read(1, 1).column("x").to_pylist() == [2]
    engine.close()


def test_a_rewind_goes_back_only_and_the_engine_delivers_again() -> None:
    engine = engine_with_consumer()
    for b in (1, 2, 3):
        engine.ingest_and_run("inp", [(b,)], batch_id=b)
    port = engine.port("out", "reader")
    port.acknowledge(3)
    port.rewind(1)
    assert port.acknowledged() == 1
    port.rewind(3)  # forwards: not an acknowledgement
    assert port.acknowledged() == 1
    with pytest.raises(AcknowledgementError):
        port.rewind(-1)
    engine.collect_garbage()
    assert [b for b, _ in port.batches(port.acknowledged())] == [2, 3]
    engine.close()


def test_halt_hold_subscribe_and_drop_go_through_the_port() -> None:
    engine = engine_with_consumer()
    port = engine.port("out", "late")
    assert port.hold() and not port.hold()
    seen: list[int] = []
    port.subscribe(lambda batch_id, rows: seen.append(batch_id))
    engine.ingest_and_run("inp", [(1,)], batch_id=1)
    assert seen == [1]
    port.halt(1, "target refused a row")
    assert "target refused a row" in (port.halted() or "")
    assert port.drop() and not port.drop()
    with pytest.raises(Exception, match="no stream 'nope'"):
        engine.port("nope", "x")
    engine.close()
