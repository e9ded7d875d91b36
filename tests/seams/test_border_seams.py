"""Border batch-ids where a user can lose a batch by mistake: a re-send must be a no-op, but
a batch that is NOT a re-send must never be taken for one.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from sstore import BatchIdTakenError, Engine, OutOfOrderBatchError
from tests.cli.test_cli_dead_letters import ROWS, counted, dead_lettered, program, read, sstore


def test_a_clients_batch_under_an_id_a_dead_letter_replay_took_is_refused(
        tmp_path: Path) -> None:
    """The client numbers its batches itself (1-4 sent). The operator replays the dead
    letters of batches 1 and 3: they go in as batches 5 and 6. The client's next batch, its
    5, used to be taken for a re-send of 5: a no-op, ``duplicate`` True, its rows lost without
    an error. It is refused now, nothing ingested, and goes in under a fresh id."""
    state = dead_lettered(str(tmp_path / "trades.duckdb"))
    done = sstore("dead-letters", "replay", state, "trades")
    assert done.returncode == 0, done.stderr
    assert read(state, "SELECT batch_id, from_batch, procedure FROM sstore_sys.replays "
                       "ORDER BY 1") == [(5, 1, "count"), (6, 3, "count")]
    with program(state) as eng:
        for taken in (5, 6):
            with pytest.raises(BatchIdTakenError, match=f"batch-id {taken} was taken by a "
                                                        f"dead-letter replay"):
                eng.ingest("trades", [(100 + taken, "client")], batch_id=taken)
        with pytest.raises(OutOfOrderBatchError):  # BatchIdTakenError is one of these
            eng.ingest_and_run("trades", [(105, "client")], batch_id=5)
        # a true re-send of the client's own batch 2 is still a no-op
        resent = eng.ingest("trades", ROWS[2], batch_id=2)
        assert resent.duplicate
        assert eng.ingest("trades", [(105, "client")], batch_id=7) == 7
        eng.run_until_idle()
    assert counted(state) == [1, 2, 3, 4, 5, 6, 105]
    with program(state) as eng:  # and after a restart
        with pytest.raises(BatchIdTakenError):
            eng.ingest("trades", [(106, "client")], batch_id=6)
        assert eng.ingest("trades", [(105, "client")], batch_id=7).duplicate


def test_a_replay_killed_before_its_commit_takes_no_id(tmp_path: Path) -> None:
    """SIGKILLed inside the replay's transaction: no batch, no record of a replay, so the
    client's batch 5 goes in under 5."""
    state = dead_lettered(str(tmp_path / "trades.duckdb"))
    crashed = sstore("dead-letters", "replay", state, "trades",
                     crash_at="ingest.before_commit:1")
    assert crashed.returncode == -signal.SIGKILL
    assert read(state, "SELECT count(*) FROM sstore_sys.replays") == [(0,)]
    with program(state) as eng:
        assert not eng.ingest("trades", [(105, "client")], batch_id=5).duplicate
        eng.run_until_idle()
    assert counted(state) == [4, 6, 105]  # the dead letters wait for their replay


def test_a_state_file_without_the_replays_table_gets_it(tmp_path: Path) -> None:
    """A state file made before ``sstore_sys.replays`` existed: it is created at open, and a
    re-send stays a no-op."""
    path = str(tmp_path / "old.duckdb")
    with Engine(path) as eng:
        eng.stream("s", {"x": "BIGINT"})
        eng.ingest("s", [(1,)], batch_id=1)
        eng.execute("DROP TABLE sstore_sys.replays")
    with Engine(path) as eng:
        eng.stream("s", {"x": "BIGINT"})
        assert eng.ingest("s", [(1,)], batch_id=1).duplicate
        assert eng.query("SELECT count(*) AS n FROM sstore_sys.replays").to_pylist() == [
            {"n": 0}]


def test_a_replay_by_the_running_program_is_seen_by_its_next_ingest(tmp_path: Path) -> None:
    """The program replays its own dead letters (``dead_letters.replay`` on its engine) after
    a re-send made the engine read the replays of the stream (none then): the replay's id is
    refused to the client all the same."""
    from sstore import dead_letters

    state = dead_lettered(str(tmp_path / "trades.duckdb"))
    with program(state) as eng:
        assert eng.ingest("trades", ROWS[2], batch_id=2).duplicate  # reads: no replays
        replayed = dead_letters.replay(eng, "trades", [1])
        assert [r.batch_id for r in replayed] == [5]
        with pytest.raises(BatchIdTakenError, match="dead letters of batch 1"):
            eng.ingest("trades", [(105, "client")], batch_id=5)
        eng.run_until_idle()
    assert counted(state) == [1, 2, 3, 4, 6]


CHILD = """
import sys
from sstore import Engine
from tests.engine.test_ledger_bounded import count_voters
eng = Engine(sys.argv[1], gc_every=1)
count_voters(eng)
eng.ingest_and_run("votes", [(int(sys.argv[2]),)])  # batch b is [(b,)]; GC runs after it
eng.close()
print("DONE")
"""


def test_a_sigkill_in_the_gc_that_compacts_border_ids_loses_no_id(tmp_path: Path) -> None:
    """200,003 collected border batch-ids; the GC transaction that compacts their commit
    records into runs is SIGKILLed before its COMMIT, in a child process. After the restart
    every id keeps its outcome (a re-send is a no-op, a never-ingested lower id refused), the
    next GC compacts, and every id keeps it again."""
    import subprocess
    import sys

    from tests.engine.test_crash import ROOT
    from tests.engine.test_ledger_bounded import (
        FIRST,
        commit_records,
        count_voters,
        resends_keep_their_outcomes,
        runs,
        weeks_of_batches,
    )

    path = str(tmp_path / "weeks.duckdb")
    last = weeks_of_batches(path, 3)
    env = {"PYTHONPATH": str(ROOT), "SSTORE_CRASH_AT": "gc.before_commit:1",
           "PATH": "/usr/bin:/bin"}
    killed = subprocess.run([sys.executable, "-c", CHILD, path, str(last + 1)], cwd=ROOT, env=env,
                            capture_output=True, timeout=600, check=False)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    ingested = [1, 3, FIRST, FIRST + 1, last - 1, last, last + 1]
    gaps = [4, FIRST - 1, FIRST + 2, last - 2]
    with Engine(path) as eng:
        count_voters(eng)
        assert runs(eng) == []  # the compaction rolled back with its transaction
        assert commit_records(eng, "votes") == 200_004
        resends_keep_their_outcomes(eng, ingested, gaps)
    env.pop("SSTORE_CRASH_AT")
    done = subprocess.run([sys.executable, "-c", CHILD, path, str(last + 2)], cwd=ROOT, env=env,
                          capture_output=True, timeout=600, check=False)
    assert done.returncode == 0 and b"DONE" in done.stdout, done.stderr.decode()[-2000:]
    with Engine(path) as eng:
        count_voters(eng)
        assert runs(eng) and commit_records(eng, "votes") == 1
        resends_keep_their_outcomes(eng, [*ingested, last + 2], gaps)
        assert eng.ingest("votes", [(3,)]) == last + 3
        assert eng.query("SELECT count(*) AS n FROM voters").to_pylist() == [{"n": 2}]
