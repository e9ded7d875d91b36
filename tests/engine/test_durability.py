"""The two durability modes: full (a DuckDB file) and weak (memory + input log replay)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from sstore import Engine, InputLogError, TransactionStateError
from sstore.storage.inputlog import HEADER, InputLog
from tests.crash_worker import ACCEPTED_TOTALS, declare_rejecting, rejected_inputs

ROOT = Path(__file__).resolve().parents[2]


def declare(engine: Engine) -> None:
    engine.stream("s", {"k": "INTEGER", "v": "BIGINT"})
    engine.execute("CREATE TABLE IF NOT EXISTS totals (k INTEGER PRIMARY KEY, v BIGINT)")

    @engine.procedure(input="s", output="changed")
    def accumulate(tx, batch):
        tx.execute("INSERT INTO totals SELECT k, sum(v) FROM batch GROUP BY k "
                   "ON CONFLICT (k) DO UPDATE SET v = totals.v + excluded.v")
        return tx.sql("SELECT DISTINCT k FROM batch")


def totals(engine: Engine) -> dict[int, int]:
    return {r["k"]: r["v"] for r in engine.query("SELECT k, v FROM totals").to_pylist()}


def weak(log: Path, declaring: Callable[[Engine], None] = declare) -> Engine:
    engine = Engine(":memory:", input_log=str(log))
    declaring(engine)
    return engine


def test_weak_mode_replays_inputs_and_oltp_after_a_restart(tmp_path: Path) -> None:
    log = tmp_path / "in.log"
    engine = weak(log)
    engine.ingest("s", [(1, 10), (2, 20)])
    engine.run_until_idle()
    with engine.transaction() as tx:
        tx.execute("UPDATE totals SET v = v * 100 WHERE k = ?", 1)
    engine.ingest("s", [(1, 1)])
    engine.ingest("s", [(3, 3)])  # ingested but not yet processed when the process ends
    expected_after_run = {1: 1001, 2: 20, 3: 3}
    del engine  # no close, no checkpoint: as if the process died
    engine = weak(log)
    assert engine.ingest("s", [(3, 3)], batch_id=3).duplicate  # the log knows batch 3
    engine.run_until_idle()
    assert totals(engine) == expected_after_run
    engine.close()


def test_weak_mode_checkpoint_then_more_input(tmp_path: Path) -> None:
    log = tmp_path / "in.log"
    engine = weak(log)
    for i in range(5):
        engine.ingest("s", [(i % 2, i)])
    engine.run_until_idle()
    snapshot = engine.checkpoint()
    assert Path(snapshot).exists() and log.stat().st_size == 0
    engine.ingest("s", [(0, 100)])
    engine.close()
    engine = weak(log)
    engine.run_until_idle()
    assert totals(engine) == {0: 0 + 2 + 4 + 100, 1: 1 + 3}
    assert engine.ingest("s", [(5, 5)]) == 7
    engine.close()


def test_a_batch_after_a_checkpoint_and_a_restart_survives_the_next_restart(
        tmp_path: Path) -> None:
    """Found by the model (benchmarks.model, weak_checkpoint_restart_loses_batch): the log
    emptied by a checkpoint numbered its records from 1 again after a restart, at or below
    the snapshot's last position, and the replay after the next restart skipped them."""
    log = tmp_path / "in.log"
    engine = weak(log)
    engine.ingest("s", [(1, 10)])
    engine.run_until_idle()
    engine.checkpoint()
    engine.close()
    engine = weak(log)
    engine.ingest("s", [(1, 5)])
    engine.run_until_idle()
    engine.close()
    engine = weak(log)
    engine.run_until_idle()
    assert totals(engine) == {1: 15}
    assert [b for b, _ in engine.batches("s")] == [1, 2]
    engine.close()


def test_a_stream_declared_with_other_types_over_a_log_without_snapshot_is_refused(
        tmp_path: Path) -> None:
    """No snapshot holds the stream's table to compare with: the logged batches' types do
    (replay cast '7' into an INTEGER before)."""
    from sstore import DeclarationError

    log = tmp_path / "in.log"
    engine = weak(log)
    engine.ingest("s", [(1, 10)])
    engine.close()
    size = log.stat().st_size

    def other(engine: Engine) -> None:
        engine.stream("s", {"k": "INTEGER", "v": "DOUBLE"})

    with pytest.raises(DeclarationError, match="column 'v' is declared double but its batches"):
        weak(log, other).run_until_idle()
    assert log.stat().st_size == size
    engine = weak(log)
    engine.run_until_idle()
    assert totals(engine) == {1: 10}
    engine.close()


def test_a_rename_over_a_log_of_the_old_program_names_the_change(tmp_path: Path) -> None:
    """Weak durability replays the log with the program that opens it; one that retired the
    procedure the log's TEs ran is told what to do (checkpoint with the old program first),
    not blamed for non-determinism, and the old program still opens."""
    from sstore import ProgramChangedError

    log = tmp_path / "in.log"
    engine = weak(log)
    engine.ingest("s", [(1, 10)])
    engine.run_until_idle()
    engine.close()

    def renamed(engine: Engine) -> None:
        engine.stream("s", {"k": "INTEGER", "v": "BIGINT"})
        engine.execute("CREATE TABLE IF NOT EXISTS totals (k INTEGER PRIMARY KEY, v BIGINT)")
        engine.retire("accumulate")

        @engine.procedure(input="s", output="changed_v2")
        def accumulate_v2(tx, batch):
            tx.execute("INSERT INTO totals SELECT k, sum(v) FROM batch GROUP BY k "
                       "ON CONFLICT (k) DO UPDATE SET v = totals.v + excluded.v")
            return tx.sql("SELECT DISTINCT k FROM batch")

    with pytest.raises(ProgramChangedError, match="Engine.checkpoint"):
        weak(log, renamed).run_until_idle()
    engine = weak(log)
    engine.run_until_idle()
    engine.checkpoint()
    engine.close()
    engine = weak(log, renamed)
    engine.run_until_idle()
    assert totals(engine) == {1: 20}  # the new procedure ran the kept batch again (retire)
    engine.close()


def test_torn_tail_is_cut_and_damage_elsewhere_is_an_error(tmp_path: Path) -> None:
    log = tmp_path / "in.log"
    engine = weak(log)
    engine.ingest("s", [(1, 1)])
    engine.ingest("s", [(1, 2)])
    engine.close()
    whole = log.read_bytes()
    log.write_bytes(whole + whole[:HEADER.size + 5])  # a torn third record
    engine = weak(log)
    engine.run_until_idle()
    assert totals(engine) == {1: 3}
    engine.close()
    after = log.read_bytes()  # the torn tail was cut off; then the two TEs' digests logged
    assert after.startswith(whole)
    assert [r.kind for r in InputLog(str(log)).records()] == ["identity", "ingest", "ingest",
                                                               "te", "te"]
    damaged = bytearray(whole)
    damaged[HEADER.size + 2] ^= 0xFF  # corrupt the first of two records
    log.write_bytes(bytes(damaged))
    with pytest.raises(InputLogError, match="checksum"):
        weak(log).run_until_idle()


def test_full_mode_survives_a_restart_without_close(state_path: str) -> None:
    engine = Engine(state_path)
    declare(engine)
    engine.ingest("s", [(1, 5)])
    engine.run_until_idle()
    engine.ingest("s", [(1, 6)])
    del engine
    engine = Engine(state_path)
    declare(engine)
    engine.run_until_idle()
    assert totals(engine) == {1: 11}
    assert engine.status().durability == "full"
    engine.close()


def test_weak_and_full_modes_give_the_same_state(tmp_path: Path) -> None:
    full = Engine(str(tmp_path / "f.duckdb"))
    declare(full)
    weak_engine = weak(tmp_path / "w.log")
    for engine in (full, weak_engine):
        for i in range(20):
            engine.ingest("s", [(i % 3, i), (i % 5, -i)])
        engine.run_until_idle()
    assert totals(full) == totals(weak_engine)


def rejecting(log: Path) -> Engine:
    return weak(log, declare_rejecting)


def test_a_refused_ingest_does_not_brick_the_restart(tmp_path: Path) -> None:
    log = tmp_path / "in.log"
    engine = rejecting(log)
    engine.ingest("s", [(1, 10)])
    with pytest.raises(duckdb.ConstraintException, match="NOT NULL"):
        engine.ingest("s", [(None, 1)])
    del engine
    engine = rejecting(log)  # replayed the refused batch and failed here, on every restart
    engine.run_until_idle()
    assert totals(engine) == {1: 10}
    engine.close()


def test_refused_inputs_leave_no_log_record(tmp_path: Path) -> None:
    """Weak mode logs only what the engine accepted: ingests refused by a NOT NULL or CHECK
    constraint and ad hoc transactions whose statement failed (raised, or swallowed by the
    program: that transaction is refused at commit) are not replayed after a restart."""
    log = tmp_path / "in.log"
    engine = rejecting(log)
    rejected_inputs(engine)
    assert totals(engine) == ACCEPTED_TOTALS
    assert engine.query("SELECT count(*) AS n FROM totals WHERE k = 9").column(0)[0].as_py() == 0
    del engine  # no close: as if the process died
    engine = rejecting(log)
    engine.run_until_idle()
    assert totals(engine) == ACCEPTED_TOTALS
    assert engine.ingest("s", [(5, 5)]) == 3  # refused ingests used no batch-id
    engine.close()


@pytest.mark.parametrize("crash_at, expected, next_batch", [
    (None, ACCEPTED_TOTALS, 3),  # killed with SIGKILL once everything is done
    ("ingest.before_log:2", {1: 110, 2: 20}, 2),  # last ingest, before its log record: gone
    ("log.after_append:3", ACCEPTED_TOTALS, 3),  # logged, not committed: replayed
])
def test_restart_after_sigkill_replays_exactly_what_was_accepted(
        tmp_path: Path, crash_at: str | None, expected: dict[int, int], next_batch: int) -> None:
    log = tmp_path / "in.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SSTORE_CRASH_AT", None)
    if crash_at:
        env["SSTORE_CRASH_AT"] = crash_at
    proc = subprocess.Popen([sys.executable, "-m", "tests.crash_worker", "rejected", str(log)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready = proc.stdout.readline() if proc.stdout else b""
        if crash_at is None:
            assert ready == b"READY\n", proc.communicate(timeout=60)[1].decode()[-3000:]
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-3000:]
    engine = rejecting(log)
    engine.run_until_idle()
    assert totals(engine) == expected
    assert engine.ingest("s", [(5, 5)]) == next_batch
    engine.close()


def test_a_record_that_fails_to_replay_is_named(tmp_path: Path) -> None:
    """Should a logged record ever fail to replay (a procedure that is not deterministic), the
    restart says which record and why instead of a bare DuckDB error."""
    log = tmp_path / "in.log"
    engine = rejecting(log)
    engine.ingest("s", [(1, 1)])
    engine.close()
    forged = InputLog(str(log))
    list(forged.records())  # positions next_lsn after the identity and the batch
    forged.append_oltp([("INSERT INTO totals VALUES (?, ?)", [1, -1])], te_seq=0)
    forged.close()
    with pytest.raises(InputLogError, match=r"record 3 \(ad hoc transaction of 1 statement"
                                            r"\(s\)\) was accepted .* fails to replay"):
        rejecting(log).run_until_idle()


@pytest.mark.parametrize("mode", ["full", "weak", "none"])
def test_a_caught_statement_error_never_reports_a_commit(tmp_path: Path, mode: str) -> None:
    """DuckDB aborts a transaction at its first failed statement; COMMIT then rolls back
    silently. A block that catches the error must not believe its other writes committed."""
    engine = (Engine(str(tmp_path / "s.duckdb")) if mode == "full" else
              Engine(":memory:", input_log=str(tmp_path / "in.log")) if mode == "weak" else
              Engine(":memory:"))
    declare_rejecting(engine)
    caught = []

    def swallowing() -> None:
        with engine.transaction() as tx:
            tx.execute("INSERT INTO totals VALUES (1, 1)")
            try:
                tx.execute("INSERT INTO totals VALUES (1, 2)")
            except duckdb.ConstraintException as exc:
                caught.append(exc)
        raise AssertionError("the transaction reported a commit")

    with pytest.raises(TransactionStateError, match="Constraint Error.*nothing was committed"):
        swallowing()
    assert len(caught) == 1
    assert totals(engine) == {}
    engine.close()


def _snapshot_without_its_log_position(log: Path) -> None:
    """The snapshot forgets which log records it holds (a snapshot an older sstore wrote, or a
    log restored from a backup beside it): replay then meets batches the state already has."""
    con = duckdb.connect(str(log) + ".snapshot")
    con.execute("UPDATE sstore_sys.meta SET value = 0 WHERE key IN ('snapshot_lsn', "
                "'snapshot_te_seq')")
    con.close()


def test_replay_meets_a_logged_batch_the_state_has_as_a_resend(tmp_path: Path) -> None:
    """Replay goes through the ingest path's batch-id checks and re-send detection: a logged
    batch the snapshot already holds, with the same rows, is a no-op (not appended twice)."""
    log = tmp_path / "in.log"
    engine = weak(log)
    engine.ingest("s", [(1, 10), (2, 20)])
    saved = log.read_bytes()  # the log as it was before the checkpoint emptied it
    engine.checkpoint()
    engine.close()
    log.write_bytes(saved)
    _snapshot_without_its_log_position(log)
    engine = weak(log)
    assert engine.query("SELECT count(*) AS n FROM s").column("n").to_pylist() == [2]
    engine.run_until_idle()
    assert totals(engine) == {1: 10, 2: 20}
    engine.close()


def test_replay_meets_a_logged_batch_the_state_has_with_other_rows(tmp_path: Path) -> None:
    """The same batch-id with other rows in the log than in the snapshot: refused by the
    re-send check, naming the record, never taken as new rows or skipped silently."""
    log = tmp_path / "in.log"
    engine = weak(log)
    engine.ingest("s", [(1, 10), (2, 20)])
    engine.close()
    other = tmp_path / "other.log"
    engine = weak(other)
    engine.ingest("s", [(1, 99)])  # batch 1 again, other rows, in another log
    engine.close()
    engine = weak(log)
    engine.checkpoint()
    engine.close()
    log.write_bytes(other.read_bytes())
    _snapshot_without_its_log_position(log)
    engine = weak(log)
    with pytest.raises(InputLogError, match="batch 1 of stream 's'.*already ingested with other"):
        engine.run_until_idle()  # the engine starts (and replays) on first use
