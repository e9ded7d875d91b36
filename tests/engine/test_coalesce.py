"""``sstore.coalesce.Coalescer``: offers that wait while the engine is busy run as one engine
batch; a producer faster than the engine waits; a failure stops it loudly and says how many
offers did not get in; SIGKILL at the commit steps loses nothing and doubles nothing when the
source resumes after ``last_ingested()``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sstore import Engine, OutOfOrderBatchError, SchemaError
from sstore.coalesce import Coalesced, Coalescer, CoalescerFailed

ROOT = Path(__file__).resolve().parents[2]


def numbers(*values: int) -> pa.Table:
    return pa.table({"n": pa.array(values, pa.int64())})


def gated_engine(path: Path) -> tuple[Engine, threading.Event, threading.Event]:
    """An engine whose procedure, on its first batch, says it started and waits for a gate."""
    engine = Engine(str(path))
    engine.stream("numbers", {"n": "BIGINT"})
    engine.execute("CREATE TABLE seen (n BIGINT, batch_id BIGINT)")
    started, gate = threading.Event(), threading.Event()

    @engine.procedure(input="numbers")
    def keep(tx, batch):
        if not started.is_set():
            started.set()
            assert gate.wait(30)
        tx.execute("INSERT INTO seen SELECT n, ? FROM batch", tx.batch_id)

    return engine, started, gate


def open_engine(path: Path) -> Engine:
    """``gated_engine`` with its gate open: the procedure never waits."""
    engine, _, gate = gated_engine(path)
    gate.set()
    return engine


def seen(engine: Engine) -> list[int]:
    """The numbers the procedure stored, in order."""
    return engine.query("SELECT n FROM seen ORDER BY n").column("n").to_pylist()


def assert_offer_waits(coalescer: Coalescer, rows: pa.Table, gate: threading.Event,
                       why: str) -> None:
    """Offer ``rows`` from another thread: it must still wait after 0.5 s (the gated batch
    holds the engine), and get in once ``gate`` opens."""
    offer = threading.Thread(target=coalescer.offer, args=(rows,))
    offer.start()
    offer.join(0.5)
    assert offer.is_alive(), why
    gate.set()
    offer.join(30)
    assert not offer.is_alive()


def last_row(rows: pa.Table) -> int:
    return pc.max(rows["n"]).as_py()


def test_offers_waiting_while_the_engine_is_busy_run_as_one_batch(tmp_path) -> None:
    engine, started, gate = gated_engine(tmp_path / "s.duckdb")
    reported: list[Coalesced] = []
    with Coalescer(engine, "numbers", last_row, on_batch=reported.append) as coalescer:
        coalescer.offer(numbers(1), token="a")
        assert started.wait(30)  # batch 1 is running: the next offers wait together
        for token, n in (("b", 2), ("c", 3), ("d", 4)):
            coalescer.offer(numbers(n), token=token)
        assert coalescer.pending() == 4
        gate.set()
        assert coalescer.drain(timeout=60)
        assert [(r.batch_id, r.tokens, r.rows) for r in reported] == [
            (1, ("a",), 1), (4, ("b", "c", "d"), 3)]  # reported before drain returned
    rows = engine.query("SELECT n, batch_id FROM seen ORDER BY n").to_pylist()
    assert rows == [{"n": 1, "batch_id": 1}] + [{"n": n, "batch_id": 4} for n in (2, 3, 4)]
    assert (coalescer.batches, coalescer.offers) == (2, 4)
    engine.close()


def test_a_producer_faster_than_the_engine_waits_for_room(tmp_path) -> None:
    engine, started, gate = gated_engine(tmp_path / "s.duckdb")
    coalescer = Coalescer(engine, "numbers", last_row, max_pending=2).start()
    coalescer.offer(numbers(1))
    assert started.wait(30)
    coalescer.offer(numbers(2))
    coalescer.offer(numbers(3))  # two pending: the next offer must wait
    assert_offer_waits(coalescer, numbers(4), gate,
                       "the offer did not wait although max_pending offers were pending")
    coalescer.close()
    assert engine.query("SELECT count(*) AS c FROM seen").column("c").to_pylist() == [4]
    engine.close()


def test_max_rows_bounds_what_waits_and_what_one_batch_takes(tmp_path) -> None:
    engine, started, gate = gated_engine(tmp_path / "s.duckdb")
    reported: list[Coalesced] = []
    coalescer = Coalescer(engine, "numbers", last_row, max_pending=100, max_rows=3,
                          on_batch=reported.append).start()
    coalescer.offer(numbers(1, 2, 3, 4))  # more than max_rows alone: taken alone
    assert started.wait(30)
    coalescer.offer(numbers(5, 6))
    coalescer.offer(numbers(7))  # 3 rows wait: at the bound
    assert_offer_waits(coalescer, numbers(8), gate, "an offer went past max_rows pending rows")
    coalescer.close()
    assert [r.rows for r in reported] == [4, 3, 1]
    assert engine.query("SELECT count(*) AS c FROM seen").column("c").to_pylist() == [8]
    engine.close()


def test_an_offer_with_other_columns_is_refused_at_once(tmp_path) -> None:
    engine = open_engine(tmp_path / "s.duckdb")
    coalescer = Coalescer(engine, "numbers", last_row).start()
    coalescer.offer(numbers(1))
    with pytest.raises(SchemaError, match="must have one schema"):
        coalescer.offer(pa.table({"n": pa.array(["2"])}))  # a string: cannot join the others
    coalescer.offer(numbers(3))  # the refusal queued nothing and stopped nothing
    coalescer.close()
    assert seen(engine) == [1, 3]
    engine.close()


def test_a_failed_batch_stops_it_loudly_and_counts_its_offers(tmp_path) -> None:
    engine, started, gate = gated_engine(tmp_path / "s.duckdb")

    def batch_id(rows: pa.Table) -> int:
        if 3 in rows["n"].to_pylist():
            raise ValueError("no position for row 3")
        return last_row(rows)

    coalescer = Coalescer(engine, "numbers", batch_id).start()
    coalescer.offer(numbers(1))
    assert started.wait(30)
    coalescer.offer(numbers(2))
    coalescer.offer(numbers(3))  # waits with 2: their batch fails
    gate.set()
    with pytest.raises(CoalescerFailed) as failed:
        coalescer.drain(timeout=60)
    assert isinstance(failed.value.error, ValueError)
    assert failed.value.not_ingested == 2  # both offers of the failed batch, named
    with pytest.raises(CoalescerFailed):
        coalescer.offer(numbers(4))  # nothing after a failed batch: it would reorder
    with pytest.raises(CoalescerFailed):
        coalescer.close()
    assert seen(engine) == [1]
    engine.close()


def test_an_out_of_order_batch_id_stops_it_and_ingests_nothing(tmp_path) -> None:
    engine = open_engine(tmp_path / "s.duckdb")
    engine.ingest_and_run("numbers", numbers(10), batch_id=10)
    coalescer = Coalescer(engine, "numbers", last_row).start()
    coalescer.offer(numbers(5))  # batch-id 5 < 10: the engine refuses it
    with pytest.raises(CoalescerFailed) as failed:
        coalescer.close()
    assert isinstance(failed.value.error, OutOfOrderBatchError)
    assert failed.value.not_ingested == 1
    assert coalescer.last_ingested() == 10
    assert seen(engine) == [10]
    engine.close()


def test_an_offer_that_is_not_an_arrow_table_is_refused_at_once(tmp_path) -> None:
    engine = open_engine(tmp_path / "s.duckdb")
    coalescer = Coalescer(engine, "numbers", last_row)
    with pytest.raises(TypeError, match="pyarrow.Table"):
        coalescer.offer([(1,)])  # type: ignore[arg-type]
    coalescer.offer(numbers(1))  # the refusal changed nothing: the next offer goes in
    coalescer.close()
    assert seen(engine) == [1]
    engine.close()


def test_close_ingests_what_is_pending(tmp_path) -> None:
    engine = open_engine(tmp_path / "s.duckdb")
    coalescer = Coalescer(engine, "numbers", last_row, max_pending=100)
    for n in range(1, 51):
        coalescer.offer(numbers(n))
    coalescer.close()
    assert engine.query("SELECT count(DISTINCT n) AS d, count(*) AS c FROM seen").to_pylist() \
        == [{"d": 50, "c": 50}]
    assert coalescer.offers == 50 and coalescer.batches <= 50
    engine.close()


@pytest.mark.parametrize("point", ["te.before_commit:6", "te.after_commit:6"])
def test_sigkill_at_a_commit_then_resume_after_last_ingested_is_exactly_once(
        tmp_path, point: str) -> None:
    state, total = str(tmp_path / "s.duckdb"), 3000
    command = [sys.executable, "-m", "tests.coalesce_worker", state, str(total)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SSTORE_CRASH_AT": point}
    killed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert killed.returncode == -9, killed.stderr
    env.pop("SSTORE_CRASH_AT")
    resumed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    engine = Engine(state)
    got = engine.query("SELECT count(*) AS c, count(DISTINCT n) AS d, min(n) AS lo, "
                       "max(n) AS hi FROM seen").to_pylist()
    assert got == [{"c": total, "d": total, "lo": 1, "hi": total}]
    engine.close()


def _program(state: str, close_engine_first: bool) -> str:
    """A program that offers batches and ends without closing its coalescer; the engine's
    lock, held while it offers, keeps every offer pending until its last line."""
    return f"""
import pyarrow as pa
from sstore import Engine
from sstore.coalesce import Coalescer
from tests.coalesce_worker import declare
engine = Engine({state!r})
declare(engine)
engine.run_until_idle()
coalescer = Coalescer(engine, "numbers", lambda rows: rows["n"][-1].as_py(), max_pending=100)
with engine.lock:
    for n in range(1, 21):
        coalescer.offer(pa.table({{"n": pa.array([n], pa.int64())}}))
    if {close_engine_first!r}:
        engine.close()
print("main ends", flush=True)
"""


@pytest.mark.parametrize("close_engine_first", [False, True])
def test_a_program_that_ends_without_close_ingests_or_fails_loudly(
        tmp_path, close_engine_first: bool) -> None:
    state = str(tmp_path / "s.duckdb")
    ended = subprocess.run([sys.executable, "-c", _program(state, close_engine_first)],
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                           capture_output=True, text=True, timeout=120)
    assert "main ends" in ended.stdout
    engine = Engine(state)
    seen = engine.query("SELECT count(*) AS c FROM seen").column("c")[0].as_py()
    engine.close()
    if close_engine_first:  # the engine went away under pending offers: exit 1, and why
        assert ended.returncode == 1, (ended.returncode, ended.stderr)
        assert "20 offered batch(es) were not ingested" in ended.stderr
        assert seen == 0
    else:
        assert ended.returncode == 0, ended.stderr
        assert seen == 20
