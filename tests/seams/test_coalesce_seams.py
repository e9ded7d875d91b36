"""``sstore.coalesce.Coalescer`` at the seams a user hits by mistake: offers with no rows, two
producers starting it at once, a stop, a fork, a failure that comes while ``close`` waits,
``on_batch`` or an engine transaction waiting for the coalescer's own thread, a source that
resumes before ``last_ingested()``, a producer thread that outlives the main thread, a
dead-letter replay before a restart. Each either ingests every row once or fails loudly; none
loses or doubles rows silently, none hangs."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import sstore.coalesce as coalesce
from sstore import Engine, OutOfOrderBatchError
from sstore.coalesce import Coalescer, CoalescerFailed
from sstore.execution.interrupts import Stopped

ROOT = Path(__file__).resolve().parents[2]


def numbers(*values: int) -> pa.Table:
    return pa.table({"n": pa.array(values, pa.int64())})


def last_row(rows: pa.Table) -> int:
    return pc.max(rows["n"]).as_py()


def engine_of(path: str = ":memory:", **procedure: object) -> Engine:
    engine = Engine(path)
    engine.stream("numbers", {"n": "BIGINT"})
    engine.execute("CREATE TABLE IF NOT EXISTS seen (n BIGINT)")

    @engine.procedure(input="numbers", **procedure)
    def keep(tx, batch):
        tx.execute("INSERT INTO seen SELECT n FROM batch")

    return engine


def seen(engine: Engine) -> list[int]:
    return engine.query("SELECT n FROM seen ORDER BY n").column("n").to_pylist()


def run(program: str, tmp_path: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[BaseException | None]]:
    """Run ``call`` in a daemon thread (a hang must not hang the test run); the list gets
    None when it returned, else what it raised."""
    outcome: list[BaseException | None] = []

    def run_it() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run_it, daemon=True)
    thread.start()
    return thread, outcome


def outliving_producer(state: str, values: str, first_wait: float, last_wait: float) -> str:
    """A program whose main thread starts a producer thread and ends. After ``first_wait`` s
    the producer offers one row per value of ``values`` (a Python expression), 0.3 s apart,
    then lives ``last_wait`` s more without offering again or closing."""
    return f"""
import threading, time
import pyarrow as pa
from sstore.coalesce import Coalescer
from tests.coalesce_worker import declare
from sstore import Engine
engine = Engine({state!r})
declare(engine)
engine.run_until_idle()
coalescer = Coalescer(engine, "numbers", lambda rows: rows["n"][-1].as_py())
tables = [pa.table({{"n": pa.array([n], pa.int64())}}) for n in {values}]
def produce():
    time.sleep({first_wait})
    for rows in tables:
        coalescer.offer(rows)
        time.sleep(0.3)
    time.sleep({last_wait})
threading.Thread(target=produce).start()
"""


def test_an_offer_with_no_rows_does_not_become_a_batch_the_engine_numbers(tmp_path) -> None:
    """An empty poll offered alone: ``pc.max`` of no rows is None, and ``ingest`` with
    ``batch_id=None`` numbers the batch itself (last + 1). ``last_ingested()`` then said 11
    although source row 11 never came, and a source resuming after it lost row 11."""
    engine = engine_of()
    coalescer = Coalescer(engine, "numbers", last_row)
    coalescer.offer(numbers(*range(1, 11)))
    assert coalescer.drain(timeout=60)
    coalescer.offer(numbers())
    with pytest.raises(CoalescerFailed) as failed:
        coalescer.close()
    assert isinstance(failed.value.error, TypeError)
    assert "batch_id_of returned None" in str(failed.value)
    assert coalescer.last_ingested() == 10  # the source resumes at row 11: nothing skipped
    engine.close()


def test_an_offer_with_no_rows_among_others_goes_in_with_them(tmp_path) -> None:
    engine = engine_of()
    engine.run_until_idle()
    coalescer = Coalescer(engine, "numbers", last_row)
    with coalescer._cond:  # reentrant: its thread takes nothing before all three wait
        for rows in (numbers(1), numbers(), numbers(2)):
            coalescer.offer(rows)
    coalescer.close()
    assert seen(engine) == [1, 2] and coalescer.last_ingested() == 2
    engine.close()


def test_batch_id_of_giving_a_numpy_int_is_taken(tmp_path) -> None:
    engine = engine_of()
    coalescer = Coalescer(engine, "numbers", lambda rows: rows["n"].to_numpy().max())
    coalescer.offer(numbers(1, 2, 3))
    coalescer.close()
    assert seen(engine) == [1, 2, 3] and coalescer.last_ingested() == 3
    engine.close()


def test_two_producers_offering_first_at_once_start_one_thread(monkeypatch) -> None:
    """``start`` tested ``thread is None`` without a lock: two producers' first offers could
    both start a thread, two threads then took offers and ingested them concurrently (out of
    order, or ``drain`` returning while the other thread's batch was still running)."""
    loops: list[str] = []
    loop = Coalescer._loop

    def counted(self: Coalescer) -> None:
        loops.append(threading.current_thread().name)
        loop(self)

    real = threading.Thread

    class SlowToMake(real):  # widens the window between the test and the assignment
        def __init__(self, *args: object, **kwargs: object) -> None:
            time.sleep(0.2)
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Coalescer, "_loop", counted)
    monkeypatch.setattr(coalesce.threading, "Thread", SlowToMake)
    engine = engine_of()
    engine.run_until_idle()
    # ids by engine batch, not by content: which producer queues first is a race of its own
    # (producer 2 first, taken alone, then producer 1's batch 1 is refused as out of order)
    ids = itertools.count(1)
    coalescer = Coalescer(engine, "numbers", lambda _rows: next(ids), max_pending=100)
    barrier = threading.Barrier(2)

    def produce(n: int) -> None:
        barrier.wait()
        coalescer.offer(numbers(n))

    producers = [real(target=produce, args=(n,)) for n in (1, 2)]
    for p in producers:
        p.start()
    for p in producers:
        p.join(30)
    monkeypatch.setattr(coalesce.threading, "Thread", real)
    coalescer.close()
    assert len(loops) == 1
    assert seen(engine) == [1, 2]
    engine.close()


def test_a_stop_counts_the_batch_it_committed_as_ingested() -> None:
    """``ingest_and_run`` commits the batch alone before it raises ``Stopped``; the coalescer
    said its offers "were not ingested" although ``last_ingested()`` had them."""
    engine = engine_of()
    engine.run_until_idle()
    coalescer = Coalescer(engine, "numbers", last_row)
    engine.interrupt()
    coalescer.offer(numbers(1, 2, 3))
    with pytest.raises(CoalescerFailed) as failed:
        coalescer.close()
    assert isinstance(failed.value.error, Stopped)
    assert coalescer.last_ingested() == 3  # the batch is in...
    assert failed.value.not_ingested == 0  # ...and the error says so
    engine.run_until_idle()
    assert seen(engine) == [1, 2, 3]
    engine.close()


def test_a_forked_child_is_refused_instead_of_waiting_forever(tmp_path) -> None:
    """In a child forked after the thread started, the thread does not exist: its offers
    were queued and never ingested, ``drain()`` waited forever."""
    program = """
import os, time
import pyarrow as pa
from sstore import Engine
from sstore.coalesce import Coalescer
engine = Engine(":memory:")
engine.stream("numbers", {"n": "BIGINT"})
coalescer = Coalescer(engine, "numbers", lambda rows: rows["n"][-1].as_py())
coalescer.offer(pa.table({"n": pa.array([1], pa.int64())}))
coalescer.drain()
pid = os.fork()
if pid == 0:
    try:
        coalescer.offer(pa.table({"n": pa.array([2], pa.int64())}))
        print("child offered; drain:", coalescer.drain(timeout=5), flush=True)
    except RuntimeError as exc:
        print("child refused:", exc, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
coalescer.close()
print("parent last", coalescer.last_ingested(), flush=True)
"""
    done = run(program, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "child refused:" in done.stdout and "forked child" in done.stdout, done.stdout
    assert "parent last 1" in done.stdout


def test_close_raises_a_failure_of_an_offer_that_came_while_it_closed(monkeypatch) -> None:
    """An offer from another thread between ``close``'s drain and its stop: its batch failed,
    the thread waited for someone to be told, and ``close`` waited for the thread: a hang."""
    engine = engine_of()
    engine.run_until_idle()
    coalescer = Coalescer(engine, "numbers", last_row)
    coalescer.offer(numbers(5))
    assert coalescer.drain(timeout=60)
    drain = Coalescer.drain
    drained = threading.Event()

    def slow_drain(self: Coalescer, timeout: float | None = None) -> bool:
        done = drain(self, timeout)
        drained.set()
        time.sleep(0.5)  # the window between drain() and _closing, widened
        return done

    monkeypatch.setattr(Coalescer, "drain", slow_drain)
    closer, outcome = in_thread(coalescer.close)
    assert drained.wait(30)
    coalescer.offer(numbers(3))  # batch-id 3 < 5: refused
    closer.join(15)
    assert not closer.is_alive(), "close() hangs"
    assert isinstance(outcome[0], CoalescerFailed)
    assert isinstance(outcome[0].error, OutOfOrderBatchError)
    engine.close()


@pytest.mark.parametrize("call", ["drain", "offer"])
def test_on_batch_that_waits_for_the_coalescer_fails_instead_of_hanging(call: str) -> None:
    engine = engine_of()
    engine.run_until_idle()
    box: dict[str, Coalescer] = {}

    def on_batch(done: object) -> None:
        if call == "drain":
            box["c"].drain()
        else:  # a follow-up offer while max_pending wait
            box["c"].offer(numbers(100))

    coalescer = box["c"] = Coalescer(engine, "numbers", last_row, max_pending=1,
                                     on_batch=on_batch)
    def produce() -> None:
        coalescer.offer(numbers(1))
        coalescer.offer(numbers(2))
        coalescer.close()

    producer, outcome = in_thread(produce)
    producer.join(15)
    assert not producer.is_alive(), f"{call}() in on_batch hangs the coalescer"
    assert isinstance(outcome[0], CoalescerFailed)
    assert "own thread" in str(outcome[0])
    engine.close()


def test_an_offer_that_must_wait_inside_an_engine_transaction_raises() -> None:
    """A producer that records its source offset in ``engine.transaction()`` and offers its
    polls in the same block holds the engine's lock: once ``max_pending`` offers wait,
    ``offer`` waited forever for a thread that needs that lock to make room."""
    engine = engine_of()
    engine.execute("CREATE TABLE offsets (pos BIGINT)")
    engine.run_until_idle()
    coalescer = Coalescer(engine, "numbers", last_row, max_pending=2)
    offered: list[int] = []
    outcome: list[BaseException | None] = []

    def produce() -> None:
        try:
            with engine.transaction() as tx:
                tx.execute("INSERT INTO offsets VALUES (6)")
                for n in range(1, 7):  # more than the thread can take plus max_pending
                    coalescer.offer(numbers(n))
                    offered.append(n)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    producer.join(15)
    assert not producer.is_alive(), "offer() inside engine.transaction() hangs"
    assert isinstance(outcome[0], RuntimeError) and "engine's lock" in str(outcome[0])
    coalescer.close()
    assert seen(engine) == offered  # every offer that returned is in, once
    engine.close()


def deliver_one_at_a_time(engine: Engine) -> None:
    """Rows 1-20 as two offers, each drained before the next: batch-ids 10 and 20."""
    coalescer = Coalescer(engine, "numbers", last_row)
    for low in (1, 11):
        coalescer.offer(numbers(*range(low, low + 10)))
        assert coalescer.drain(timeout=60)
    coalescer.close()


def redeliver_from_row_1_together(engine: Engine) -> None:
    """Rows 1-30 again as three offers that wait together (the coalescer's own lock, which is
    reentrant, holds its thread back); the first two re-send: each row must be in once."""
    coalescer = Coalescer(engine, "numbers", last_row)
    with coalescer._cond:
        for low in (1, 11, 21):
            coalescer.offer(numbers(*range(low, low + 10)))
    coalescer.close()
    assert seen(engine) == list(range(1, 31))


def test_a_source_that_resumes_before_last_ingested_is_not_doubled() -> None:
    """A source that commits its offset in ``on_batch`` re-delivers what a crash cut off
    between the engine's COMMIT and ``on_batch``. One offer at a time, the engine takes a
    re-sent batch-id as a no-op; coalesced under a newer batch-id, the re-delivered rows went in
    a second time, silently."""
    engine = engine_of()
    engine.run_until_idle()
    deliver_one_at_a_time(engine)
    redeliver_from_row_1_together(engine)
    engine.close()


def test_a_producer_thread_that_outlives_main_gets_its_offers_ingested(tmp_path) -> None:
    """The main thread starts a producer thread and ends. The coalescer's thread saw the main
    thread gone, stopped while nothing was pending, and the producer's later offers were
    never ingested: exit status 0, rows missing (with more than ``max_pending`` offers left,
    the producer waited for room forever and the process never ended)."""
    state = str(tmp_path / "s.duckdb")
    program = outliving_producer(state, "range(1, 6)", first_wait=0, last_wait=0)
    done = run(program, tmp_path)
    assert done.returncode == 0, done.stderr
    engine = Engine(state)
    assert engine.query("SELECT count(*) AS c FROM seen").column("c")[0].as_py() == 5
    engine.close()


def test_a_dead_letter_replay_does_not_move_where_the_source_resumes(tmp_path) -> None:
    """A procedure dead-letters a coalesced batch; the operator fixes it and replays the dead
    letters (``sstore dead-letters replay``) while the program is stopped: the replay is a new
    batch the engine numbers itself (last + 1). ``last_ingested()`` returned that number, and
    the source, resuming after it, skipped the row at that position: lost, exit status 0."""
    from sstore import dead_letters

    state = str(tmp_path / "s.duckdb")
    broken = {"on": True}

    def open_engine() -> Engine:
        engine = Engine(state)
        engine.stream("numbers", {"n": "BIGINT"})
        engine.execute("CREATE TABLE IF NOT EXISTS seen (n BIGINT)")

        @engine.procedure(input="numbers", on_error="dead_letter")
        def keep(tx, batch):
            if broken["on"] and 7 in batch["n"].to_pylist():
                raise ValueError("a bug")
            tx.execute("INSERT INTO seen SELECT n FROM batch")

        return engine

    engine = open_engine()
    coalescer = Coalescer(engine, "numbers", last_row)
    for low in (1, 11):
        coalescer.offer(numbers(*range(low, low + 10)))
    coalescer.close()
    engine.close()
    broken["on"] = False
    engine = open_engine()
    (replayed,) = dead_letters.replay(engine, "numbers")
    assert replayed.batch_id == 21  # numbered by the engine, not a source position
    engine.close()
    engine = open_engine()  # the program again: resume the source after last_ingested()
    engine.run_until_idle()
    coalescer = Coalescer(engine, "numbers", last_row)
    assert coalescer.last_ingested() == 20
    coalescer.offer(numbers(*range(coalescer.last_ingested() + 1, 31)))
    coalescer.close()
    assert seen(engine) == list(range(1, 31))
    engine.close()



def test_last_ingested_on_a_restart_before_anything_started_the_engine(tmp_path) -> None:
    """A program that asks ``last_ingested()`` right after declaring its dataflow (without
    the ``run_until_idle()`` that ``tests/coalesce_worker.py`` happens to call first): the
    engine had not started, had not read its state file, and the answer was 0. The source
    resumed at row 1 and, coalesced, rows 1..20 went in a second time (exit status 0)."""
    state = str(tmp_path / "s.duckdb")
    engine = engine_of(state)
    coalescer = Coalescer(engine, "numbers", last_row)
    for low in (1, 11):
        coalescer.offer(numbers(*range(low, low + 10)))
    coalescer.close()
    engine.close()
    engine = engine_of(state)  # the program again
    coalescer = Coalescer(engine, "numbers", last_row)
    start = coalescer.last_ingested() + 1
    assert start == 21
    with coalescer._cond:  # reentrant: its thread takes nothing before all wait
        for low in range(start, 31, 10):
            coalescer.offer(numbers(*range(low, low + 10)))
    coalescer.close()
    assert seen(engine) == list(range(1, 31))
    engine.close()


def test_a_stale_offer_is_caught_even_before_anything_started_the_engine(tmp_path) -> None:
    """The source resumes at row 1 on a restart (it ignored ``last_ingested()``) and its first
    offers wait together before the engine started: the staleness check must read the state
    file's last batch-id, not 0."""
    state = str(tmp_path / "s.duckdb")
    engine = engine_of(state)
    deliver_one_at_a_time(engine)
    engine.close()
    engine = engine_of(state)
    redeliver_from_row_1_together(engine)
    engine.close()


def test_a_failure_after_the_main_thread_ended_still_ends_the_process_loudly(tmp_path) -> None:
    """The coalescer's thread now outlives the main thread while producer threads run; a
    failure nobody is told of still says so on stderr and ends the process with status 1."""
    state = str(tmp_path / "s.duckdb")
    program = outliving_producer(state, "(5, 3)", first_wait=0.5, last_wait=1)  # 3 < 5
    done = run(program, tmp_path)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "1 offered batch(es) were not ingested" in done.stderr
    engine = Engine(state)
    assert engine.query("SELECT n FROM seen").column("n").to_pylist() == [5]
    engine.close()


def test_a_source_that_resumes_at_its_own_offset_with_a_bigger_poll_is_not_doubled(
        tmp_path) -> None:
    """Issue 34, item 2: a source that commits its offset in ``on_batch`` and crashed after
    the engine's COMMIT of rows 11..15 (batch-id 15) but before its own resumes after offset
    10; its poll now returns rows 11..20, one offer with batch-id 20 > 15, which was taken
    whole: rows 11..15 went in twice (25 rows, 20 distinct, exit status 0). The rows at
    positions the engine already has are trimmed: 16..20 go in, once."""
    state = str(tmp_path / "s.duckdb")
    engine = engine_of(state)
    committed: list[int] = []
    coalescer = Coalescer(engine, "numbers", last_row,
                          on_batch=lambda done: committed.append(done.batch_id))
    for low, high in ((1, 10), (11, 15)):
        coalescer.offer(numbers(*range(low, high + 1)))
        assert coalescer.drain(timeout=60)
    coalescer.close()
    engine.close()
    assert committed == [10, 15]  # the source's offset commit of 15 is what the crash lost
    engine = engine_of(state)  # the program again, resuming at its own offset, 10
    coalescer = Coalescer(engine, "numbers", last_row,
                          on_batch=lambda done: committed.append(done.batch_id))
    with coalescer._cond:  # reentrant: both polls wait together, as after a long stop
        coalescer.offer(numbers(*range(11, 21)))
        coalescer.offer(numbers(*range(21, 26)))
    coalescer.close()
    assert seen(engine) == list(range(1, 26))
    assert committed[2:] == [25]  # the overlap trimmed, the rest one engine batch
    engine.close()


def test_a_resumed_poll_that_overlaps_alone_is_trimmed_too(tmp_path) -> None:
    """The same with the resumed poll alone (nothing waiting with it): trimmed to 16..20."""
    state = str(tmp_path / "s.duckdb")
    engine = engine_of(state)
    deliver_one_at_a_time(engine)  # batch-ids 10 and 20
    engine.close()
    engine = engine_of(state)
    coalescer = Coalescer(engine, "numbers", last_row)
    coalescer.offer(numbers(*range(16, 31)))
    coalescer.close()
    assert seen(engine) == list(range(1, 31))
    engine.close()
