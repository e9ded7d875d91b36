"""Stopping is not failing: SIGINT/SIGTERM end a run between transactions, record nothing, and
a run on the same state file resumes exactly once.

The CLI tests start the real ``sstore demo`` in a subprocess and signal it once it has committed
batches (seen from the growing DuckDB WAL: the state file itself is locked by the writer).
150,000 votes in batches of 500 take 6-15 s here, ample time to be stopped in the middle;
whether it was really stopped in the middle is checked afterwards (the resuming run skips some
batches, not all).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from sstore import Engine
from sstore.storage.status import status_of_file

WORKTREE = str(Path(__file__).resolve().parents[2])
VOTES, BATCH = 150_000, 500
DEMO = ["demo", "--votes", str(VOTES), "--batch-size", str(BATCH), "--seed", "3"]
STOPPED = "stopped; every committed batch is safe; run again to resume"


def env() -> dict[str, str]:
    """The subprocess imports this worktree's code."""
    return {**os.environ, "PYTHONPATH": WORKTREE + os.pathsep + os.environ.get("PYTHONPATH", "")}


def sstore(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sstore.cli", *args], check=False,
                          capture_output=True, text=True, env=env(),
                          timeout=timeout)


def voter_state(path: str) -> dict[str, list[tuple]]:
    """Everything the voter dataflow keeps, sorted, read from a closed state file."""
    con = duckdb.connect(path, read_only=True)
    try:
        return {table: con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()
                for table in ("vote_totals", "contestants", "phone_votes", "vote_rejections",
                              "trending_leaderboard")}
    finally:
        con.close()


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple]]:
    """The state an uninterrupted demo run leaves."""
    path = str(tmp_path_factory.mktemp("reference") / "voter.duckdb")
    done = sstore(*DEMO, "--state", path)
    assert done.returncode == 0, done.stdout + done.stderr
    return voter_state(path)


def stop_when_ready(proc: subprocess.Popen[str], ready: Callable[[], None], signum: int
                    ) -> tuple[str, str, float]:
    """Once ``ready()`` returns, send ``signum``; the process's stdout, stderr and how many
    seconds it took to exit (killed after 30 s, so that a test never hangs)."""
    try:
        ready()
        proc.send_signal(signum)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=30)
        return out, err, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def first_line_then_wait(proc: subprocess.Popen[str], expected: str) -> Callable[[], None]:
    """A ``ready`` for ``stop_when_ready``: the program printed ``expected`` first; then half
    a second more (its long statement is running)."""
    def ready() -> None:
        assert proc.stdout is not None
        assert proc.stdout.readline() == expected, proc.communicate()
        time.sleep(0.5)
    return ready


def wait_for_commits(path: str, proc: subprocess.Popen[str], min_bytes: int = 300_000) -> None:
    """Until the state file's WAL has grown past what the declarations write alone (some
    batches have committed)."""
    deadline = time.monotonic() + 120
    wal = path + ".wal"
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if os.path.exists(wal) and os.path.getsize(wal) > min_bytes:
            return
        time.sleep(0.05)
    pytest.fail("the demo committed nothing within 120 s")


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_demo_cleanly_and_a_rerun_resumes_exactly_once(
        tmp_path: Path, never_stopped: dict[str, list[tuple]], signum: int, status: int) -> None:
    path = str(tmp_path / "voter.duckdb")
    proc = subprocess.Popen([sys.executable, "-m", "sstore.cli", *DEMO, "--state", path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    out, err, took = stop_when_ready(proc, lambda: wait_for_commits(path, proc), signum)
    assert took < 2.0, f"took {took:.1f} s to stop"
    assert proc.returncode == status, out + err
    assert STOPPED in err and "Traceback" not in err + out, out + err

    shown = sstore("status", path, "--json")
    assert shown.returncode == 0, shown.stderr
    state = json.loads(shown.stdout)
    assert state["errors"] == []
    assert [p["name"] for p in state["procedures"] if p["halted"]] == []
    con = duckdb.connect(path, read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM sstore_sys.errors").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM sstore_sys.halts").fetchone()[0] == 0
    finally:
        con.close()

    again = sstore(*DEMO, "--state", path)
    assert again.returncode == 0, again.stdout + again.stderr
    skipped = int(again.stdout.split("Skipped ")[1].split(" batches")[0].replace(",", ""))
    assert 0 < skipped < VOTES // BATCH  # stopped in the middle, resumed after its last commit
    assert voter_state(path) == never_stopped


SERVICE = """
import sys, threading
from sstore import Engine
from sstore.execution.stopping import stop_on_signals

engine = Engine(sys.argv[1])
engine.stream("s", {"n": "BIGINT"})
engine.execute("CREATE TABLE IF NOT EXISTS sums (batch_id BIGINT, total HUGEINT)")

@engine.procedure(input="s")
def add_up(tx, batch):
    tx.execute("INSERT INTO sums SELECT ?, sum(range) FROM range((SELECT max(n) FROM batch))",
               tx.batch_id)

engine.ingest("s", [(1000,)], batch_id=1)
engine.ingest("s", [(10**13,)], batch_id=2)   # hours of work
with stop_on_signals() as stop:
    engine.observe(lambda e: e.kind == "te" and print("committed", e.node, e.batch_id,
                                                      flush=True))
    engine.run(stop.event)
print("served until stopped", flush=True)
engine.close()
"""


def test_a_service_stops_on_sigterm(tmp_path: Path) -> None:
    """``Engine.run`` under ``stop_on_signals``: SIGTERM rolls back the statement in flight."""
    path = str(tmp_path / "service.duckdb")
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    proc = subprocess.Popen([sys.executable, str(script), path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env())
    out, err, took = stop_when_ready(proc, first_line_then_wait(proc, "committed add_up 1\n"),
                                     signal.SIGTERM)
    assert took < 2.0 and proc.returncode == 0, err
    assert "served until stopped" in out and "Traceback" not in err
    status = status_of_file(path)
    assert status.errors == [] and [p.halted for p in status.procedures] == [None]
    assert [p.last_batch for p in status.procedures] == [1]


def test_ctrl_c_without_a_handler_is_no_failure(tmp_path: Path) -> None:
    """A program that installs nothing: Ctrl-C reaches the procedure's Python code as
    KeyboardInterrupt or DuckDB, which turns it into ``RuntimeError('Query interrupted')`` or
    an error naming the KeyboardInterrupt; the engine rolls back and raises
    KeyboardInterrupt, recording no error and no halt."""
    path = str(tmp_path / "plain.duckdb")
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent("""
        import sys
        from sstore import Engine
        engine = Engine(sys.argv[1])
        engine.stream("s", {"n": "BIGINT"})

        @engine.procedure(input="s")
        def busy(tx, batch):  # short statements in a Python loop: Ctrl-C lands in either
            while True:
                tx.execute("SELECT sum(range) FROM range(30000000)")

        engine.ingest("s", [(1,)])
        print("running", flush=True)
        try:
            engine.run_until_idle()
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
        print("halted:", [p.halted for p in engine.status().procedures], flush=True)
        engine.close()
    """))
    proc = subprocess.Popen([sys.executable, str(script), path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env())
    out, err, _took = stop_when_ready(proc, first_line_then_wait(proc, "running\n"),
                                      signal.SIGINT)
    assert "KeyboardInterrupt" in out and "halted: [None]" in out, out + err
    con = duckdb.connect(path, read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM sstore_sys.errors").fetchone()[0] == 0
    finally:
        con.close()


def test_run_returns_promptly_when_stop_is_set(state_path: str) -> None:
    """``Engine.run(stop)`` in a thread: setting ``stop`` interrupts the statement in flight;
    the execution rolls back and runs again (exactly once) on the next run."""
    engine = Engine(state_path)
    engine.stream("s", {"x": "BIGINT"})
    engine.execute("CREATE TABLE knobs (size BIGINT)")
    engine.execute("INSERT INTO knobs VALUES (10000000000000)")  # batch 2: hours of work
    engine.execute("CREATE TABLE sums (batch_id BIGINT, total HUGEINT)")

    @engine.procedure(input="s")
    def add_up(tx, batch):
        size = "(SELECT size FROM knobs)" if tx.batch_id == 2 else "1000"
        tx.execute(f"INSERT INTO sums SELECT ?, sum(range) FROM range({size})", tx.batch_id)

    committed = threading.Event()
    engine.observe(lambda e: e.batch_id == 1 and e.kind == "te" and committed.set())
    engine.ingest("s", [(1,)])
    engine.ingest("s", [(2,)])
    stop = threading.Event()
    server = threading.Thread(target=engine.run, args=(stop,))
    server.start()
    try:
        assert committed.wait(30)
        time.sleep(0.5)  # batch 2's statement is running
        began = time.monotonic()
        stop.set()
        server.join(5)
        took = time.monotonic() - began
        assert not server.is_alive() and took < 2.0, f"run did not return ({took:.1f} s)"
    finally:
        if server.is_alive():  # the unfixed engine: end the statement so the test can end
            engine.connection.interrupt()
            server.join()
    status = engine.status()
    assert status.errors == [] and status.procedures[0].halted is None
    assert status.procedures[0].last_batch == 1
    engine.execute("UPDATE knobs SET size = 10")
    assert engine.run_until_idle() == 1
    assert engine.query("SELECT batch_id, total FROM sums ORDER BY 1").to_pylist() == [
        {"batch_id": 1, "total": 499500}, {"batch_id": 2, "total": 45}]
    engine.close()


def test_interrupt_between_executions_stops_the_next_run(engine: Engine) -> None:
    from sstore.execution.stopping import Stopped

    engine.stream("s", {"x": "INTEGER"})

    @engine.procedure(input="s", output="out")
    def copy(tx, batch):
        return tx.sql("SELECT x FROM batch")

    engine.ingest("s", [(1,)])
    engine.interrupt()
    with pytest.raises(Stopped):
        engine.run_until_idle()
    assert engine.run_until_idle() == 1  # one request, one Stopped
    assert engine.status().errors == []


SINK = """
import sys, time
from migrators import StreamToPostgres
from sstore import Engine
from sstore.execution.stopping import command_stops

state, url, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
with command_stops():
    engine = Engine(state)
    engine.stream("readings", {"id": "BIGINT"})

    @engine.procedure(input="readings", output="doubled")
    def double(tx, batch):
        return tx.sql("SELECT id, id * 2 AS twice FROM batch")

    sink = StreamToPostgres(engine, "doubled", url, "public.doubled")
    sink.attach()
    try:
        for b in range(1, batches + 1):
            engine.ingest("readings", [(b * 100 + i,) for i in range(100)], batch_id=b)
            engine.run_until_idle()
            if b == 20:
                print("running", flush=True)
    finally:
        sink.detach()
        engine.close()
print("done", flush=True)
"""


def test_a_stopped_program_with_a_sink_loses_and_repeats_nothing(tmp_path: Path,
                                                                  pg_url: str) -> None:
    """SIGINT while a sink feeds PostgreSQL: the sink detaches after its chunk in flight (what
    it had not moved stays held in the engine), and the next run delivers the rest exactly
    once."""
    import psycopg

    state, script = str(tmp_path / "sink.duckdb"), tmp_path / "sink.py"
    script.write_text(SINK)
    proc = subprocess.Popen([sys.executable, str(script), state, pg_url, "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    out, err, took = stop_when_ready(proc, first_line_then_wait(proc, "running\n"),
                                     signal.SIGINT)
    assert took < 2.0 and proc.returncode == 130, err
    assert STOPPED in err and "done" not in out and "Traceback" not in err

    status = status_of_file(state)
    assert status.errors == [] and [p.halted for p in status.procedures] == [None]
    committed = status.procedures[0].last_batch
    with psycopg.connect(pg_url) as con:
        mark, total = con.execute("SELECT batch_id, rows_total FROM sstore.watermarks").fetchone()
        rows, distinct = con.execute("SELECT count(*), count(DISTINCT id) FROM public.doubled"
                                     ).fetchone()
    assert 20 <= mark <= committed and rows == distinct == total == mark * 100

    again = subprocess.run([sys.executable, str(script), state, pg_url, str(committed + 30)],
                           check=False, capture_output=True, text=True, env=env(), timeout=120)
    assert again.returncode == 0 and "done" in again.stdout, again.stderr
    with psycopg.connect(pg_url) as con:
        rows, distinct, low, high = con.execute(
            "SELECT count(*), count(DISTINCT id), min(id), max(id) FROM public.doubled"
        ).fetchone()
    assert rows == distinct == (committed + 30) * 100
    assert (low, high) == (100, (committed + 30) * 100 + 99)


AFTER_A_STOP = """
import cProfile, sys
sys.path.insert(0, {root!r})
from tests.engine.test_stops import test_run_returns_promptly_when_stop_is_set
test_run_returns_promptly_when_stop_is_set({state!r})
profiler = cProfile.Profile()
profiler.enable()
sum(i for i in range(1000))
profiler.disable()
print("profiled", flush=True)
"""


def test_an_interruption_that_came_too_late_leaves_the_interpreter_sound(tmp_path: Path) -> None:
    """An interruption sent into a TE's thread that was not raised (the statement ended first)
    is consumed in that thread. Withdrawn with ``PyThreadState_SetAsyncExc(id, NULL)`` it left
    CPython 3.11 flagged for good, and the next profiled call in the process spun forever."""
    code = AFTER_A_STOP.format(root=str(Path(__file__).resolve().parents[2]),
                               state=str(tmp_path / "s.duckdb"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False, env=env())
    assert done.returncode == 0 and "profiled" in done.stdout, done.stderr


def test_a_crash_point_can_send_a_clean_stop_once() -> None:
    """``SSTORE_CRASH_SIGNAL=TERM`` sends SIGTERM at the named pass of a crash point instead of
    SIGKILL, and only once: the process, stopping cleanly, passes the point again, and a second
    SIGTERM would end it at once (the model's stops by signal rely on both)."""
    code = textwrap.dedent("""
        import signal
        got = []
        signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
        from sstore.base.faults import crash_point
        for _ in range(4):
            crash_point("te.before_commit")
        print(len(got))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env(), "SSTORE_CRASH_AT": "te.before_commit:2",
                               "SSTORE_CRASH_SIGNAL": "TERM"}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    bad = subprocess.run([sys.executable, "-c", "import sstore.base.faults"], capture_output=True,
                         text=True, env={**env(), "SSTORE_CRASH_AT": "te.before_commit:1",
                                         "SSTORE_CRASH_SIGNAL": "HUP"}, timeout=60)
    assert bad.returncode != 0 and "SSTORE_CRASH_SIGNAL" in bad.stderr
