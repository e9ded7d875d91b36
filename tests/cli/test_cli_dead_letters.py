"""``sstore dead-letters list|show|replay|discard`` on real state files, in real processes.

The program below is the owner of the state file: procedure ``count`` (on_error="dead_letter")
gives up on any batch with a row ``v = 'bad'`` until a fix is recorded. A replay sends the
dead-lettered rows in again as a new batch; when the program next runs, ``count`` takes them,
and every row is counted exactly once, also when the replay is SIGKILLed at each step of its
protocol.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from sstore import Engine, dead_letters
from sstore.base.errors import DeclarationError

ROOT = Path(__file__).resolve().parents[2]
ROWS = {1: [(1, "a"), (2, "bad"), (3, "c")], 2: [(4, "d")], 3: [(5, "bad")], 4: [(6, "f")]}


def program(path: str, *, fixed: bool = False, run: bool = True) -> Engine:
    """The state file's own program: declares, optionally records the fix, runs the dataflow."""
    eng = Engine(path)
    eng.stream("trades", {"id": "BIGINT", "v": "VARCHAR"})
    eng.execute("CREATE TABLE IF NOT EXISTS counted (id BIGINT, v VARCHAR)")
    eng.execute("CREATE TABLE IF NOT EXISTS fixes (fixed BOOLEAN)")

    @eng.procedure(input="trades", output="accepted", on_error="dead_letter", retries=0)
    def count(tx, batch):
        if not tx.fetchone("SELECT count(*) FROM fixes")[0] and \
                tx.fetchone("SELECT count(*) FROM batch WHERE v = 'bad'")[0]:
            raise ValueError("bad trade")
        tx.execute("INSERT INTO counted SELECT id, v FROM batch")
        return tx.sql("SELECT id FROM batch")

    if fixed:
        eng.execute("INSERT INTO fixes VALUES (true)")
    if run:
        eng.run_until_idle()
    return eng


def dead_lettered(path: str, fix: bool = True) -> str:
    """Four batches in, two of them (1 and 3) dead-lettered by ``count``; then ``fix``."""
    with program(path, run=False) as eng:
        for rows in ROWS.values():
            eng.ingest("trades", rows)
        eng.run_until_idle()
        if fix:
            eng.execute("INSERT INTO fixes VALUES (true)")
    return path


@pytest.fixture
def state(tmp_path: Path) -> str:
    return dead_lettered(str(tmp_path / "trades.duckdb"))


def sstore(*args: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("SSTORE_CRASH_AT", None)
    if crash_at:
        env["SSTORE_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-m", "sstore.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120, check=False)


def read(path: str, sql: str) -> list[tuple]:
    con = duckdb.connect(path, read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def counted(path: str) -> list[int]:
    return [r[0] for r in read(path, "SELECT id FROM counted ORDER BY id")]


def test_list_and_show(state: str) -> None:
    listed = sstore("dead-letters", "list", state)
    assert listed.returncode == 0, listed.stderr
    assert "trades" in listed.stdout and "ValueError: bad trade" in listed.stdout
    as_json = json.loads(sstore("dead-letters", "list", state, "--json").stdout)
    assert [(d["input"], d["procedure"], d["batch_id"], d["rows"]) for d in as_json] == \
        [("trades", "count", 1, 3), ("trades", "count", 3, 1)]
    assert as_json[0]["error"] == "ValueError: bad trade"

    shown = json.loads(sstore("dead-letters", "show", state, "trades", "--batch", "1",
                              "--json").stdout)
    assert [(r["_batch_id"], r["id"], r["v"]) for r in shown] == [(1, 1, "a"), (1, 2, "bad"),
                                                                  (1, 3, "c")]
    table = sstore("dead-letters", "show", state, "trades")
    assert table.returncode == 0 and "(4 rows)" in table.stdout and "_error" in table.stdout

    unknown = sstore("dead-letters", "show", state, "accepted")
    assert unknown.returncode == 1
    assert "no dead letters of 'accepted'; inputs with dead letters: trades" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_replay_then_the_program_counts_every_row_once(state: str) -> None:
    assert counted(state) == [4, 6]
    done = sstore("dead-letters", "replay", state, "trades", "--json")
    assert done.returncode == 0, done.stderr
    assert [(r["from_batch"], r["batch_id"], r["rows"]) for r in json.loads(done.stdout)] == \
        [(1, 5, 3), (3, 6, 1)]
    assert sstore("dead-letters", "list", state, "--json").stdout.strip() == "[]"
    assert counted(state) == [4, 6]  # the CLI never runs procedures: the program does
    again = sstore("dead-letters", "replay", state, "trades")
    assert again.returncode == 0 and "No dead letters of trades to replay" in again.stdout
    with program(state) as eng:
        assert [p.last_batch for p in eng.status().procedures] == [6]
    assert counted(state) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("point, replayed", [
    ("dead_letters.before_delete:1", False),  # appended, dead letters not yet deleted
    ("ingest.before_commit:1", False),        # both done, not committed
    ("ingest.after_commit:1", True),          # committed, not yet reported
    ("ingest.after_commit:2", True),          # first batch replayed, second committed
])
def test_a_crash_during_replay_loses_and_duplicates_nothing(state: str, point: str,
                                                            replayed: bool) -> None:
    crashed = sstore("dead-letters", "replay", state, "trades", crash_at=point)
    assert crashed.returncode == -signal.SIGKILL
    batches = read(state, "SELECT max(_batch_id) FROM trades")[0][0]
    dead = read(state, "SELECT _batch_id, count(*) FROM trades__dead_letter GROUP BY 1 "
                       "ORDER BY 1")
    if point == "ingest.after_commit:2":
        assert batches == 6 and dead == []
    elif replayed:
        assert batches == 5 and dead == [(3, 1)]  # batch 1 went in as 5, with its deletion
    else:
        assert batches == 4 and dead == [(1, 3), (3, 1)]  # nothing happened
    finish = sstore("dead-letters", "replay", state, "trades")
    assert finish.returncode == 0, finish.stderr
    assert read(state, "SELECT count(*) FROM trades__dead_letter") == [(0,)]
    assert read(state, "SELECT max(_batch_id) FROM trades") == [(6,)]
    with program(state):
        pass
    assert counted(state) == [1, 2, 3, 4, 5, 6]


def test_discard(state: str) -> None:
    needs = sstore("dead-letters", "discard", state, "trades")
    assert needs.returncode == 2 and "--all" in needs.stderr
    missing = sstore("dead-letters", "discard", state, "trades", "--batch", "2")
    assert missing.returncode == 1 and "no dead letters of 'trades' from batch(es) 2" in \
        missing.stderr
    one = sstore("dead-letters", "discard", state, "trades", "--batch", "3")
    assert one.returncode == 0 and "Discarded 1 dead-lettered row of trades" in one.stdout
    assert read(state, "SELECT DISTINCT _batch_id FROM trades__dead_letter") == [(1,)]
    assert sstore("dead-letters", "discard", state, "trades", "--all").returncode == 0
    assert read(state, "SELECT count(*) FROM trades__dead_letter") == [(0,)]


def derived_state(path: str) -> str:
    """``check`` dead-letters batches of ``accepted``, a stream that ``count`` writes."""
    eng = Engine(path)
    eng.stream("trades", {"id": "BIGINT", "v": "VARCHAR"})

    @eng.procedure(input="trades", output="accepted")
    def count(tx, batch):
        return tx.sql("SELECT id, v FROM batch")

    @eng.procedure(input="accepted", on_error="dead_letter", retries=0)
    def check(tx, batch):
        raise ValueError("always")

    eng.ingest("trades", [(1, "a")])
    eng.run_until_idle()
    eng.close()
    return path


def shared_state(path: str, reader: str) -> str:
    """``count`` dead-letters batch 1 of ``trades``, which ``reader`` also follows."""
    eng = Engine(path)
    eng.stream("trades", {"id": "BIGINT", "v": "VARCHAR"})
    if reader == "consumer":
        eng.consumer("trades", "migrator:dw.trades")
    elif reader == "window":
        eng.window("recent", "trades", rows=10)
    elif reader == "trigger":
        eng.execute("CREATE TABLE audit (id BIGINT)")
        eng.trigger("trades", "INSERT INTO audit SELECT id FROM new_rows")

    @eng.procedure(input="trades", on_error="dead_letter", retries=0)
    def count(tx, batch):
        raise ValueError("always")

    if reader == "procedure":
        @eng.procedure(input="trades")
        def audit_trades(tx, batch):
            return None

    eng.ingest("trades", [(1, "a")])
    eng.run_until_idle()
    eng.close()
    return path


@pytest.mark.parametrize("case, why", [
    ("derived", "stream 'accepted' is written by procedure 'count'"),
    ("consumer", "also read by consumer migrator:dw.trades"),
    ("window", "also read by window recent"),
    ("trigger", "also read by a trigger"),
    ("procedure", "also read by procedure audit_trades"),
])
def test_replay_refuses_what_would_reach_anything_twice(tmp_path: Path, case: str,
                                                        why: str) -> None:
    path = str(tmp_path / "s.duckdb")
    if case == "derived":
        derived_state(path)
        name = "accepted"
    else:
        shared_state(path, case)
        name = "trades"
    before = read(path, f"SELECT count(*) FROM {name}__dead_letter")
    batches = read(path, "SELECT max(_batch_id) FROM trades")
    refused = sstore("dead-letters", "replay", path, name)
    assert refused.returncode == 1 and why in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert read(path, f"SELECT count(*) FROM {name}__dead_letter") == before != [(0,)]
    assert read(path, "SELECT max(_batch_id) FROM trades") == batches


def test_replay_refuses_several_inputs_and_weak_durability(tmp_path: Path) -> None:
    with Engine(str(tmp_path / "two.duckdb")) as eng:
        eng.stream("a", {"x": "INTEGER"})
        eng.stream("b", {"x": "INTEGER"})

        @eng.procedure(input=["a", "b"], on_error="dead_letter", retries=0)
        def join(tx, batches):
            raise ValueError("always")

        eng.ingest("a", [(1,)])
        eng.ingest("b", [(2,)])
        eng.run_until_idle()
        with pytest.raises(dead_letters.DeadLetterError, match="reads a, b"):
            dead_letters.replay(eng, "a")

    weak = Engine(":memory:", input_log=str(tmp_path / "in.log"))
    weak.stream("s", {"x": "INTEGER"})

    @weak.procedure(input="s", on_error="dead_letter", retries=0)
    def fail(tx, batch):
        raise ValueError("always")

    weak.ingest("s", [(1,)])
    weak.run_until_idle()
    with pytest.raises(dead_letters.DeadLetterError, match="weak durability"):
        dead_letters.replay(weak, "s")
    with pytest.raises(DeclarationError, match="needs full durability"):
        weak.ingest("s", [(2,)], along=lambda tx: None)
    weak.close()


def test_replay_needs_the_state_file_to_itself(state: str) -> None:
    with program(state, run=False):
        busy = sstore("dead-letters", "replay", state, "trades")
    assert busy.returncode == 1 and "in use by another process" in busy.stderr
    assert read(state, "SELECT count(*) FROM trades__dead_letter") == [(4,)]
