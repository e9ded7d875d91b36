"""Weak durability: snapshot plus input-log replay (kept apart from the operators on purpose).

Full durability needs no recovery code at all: every commit record is in the DuckDB file, and a
restart rebuilds the ledger from it. Weak durability keeps the state in memory, so after a
crash it is rebuilt here:

1. ``load_snapshot`` (when the engine opens): copy the last checkpoint's database into memory.
2. ``replay`` (when the engine starts, after the program declared its graph): for each log record
   newer than the snapshot, first run transaction executions until as many have committed as had
   when the record was first applied (``run_one(most)`` runs at most that many more, a group
   commit included), then apply the record: an ingest, an ad hoc transaction, a garbage
   collection (at the same point and with the same bounds as live, so that a stream's table
   holds what it held live), or nothing (a record of TE digests).
3. Check, at each record, that replay did what was done live: the digests
   (``sstore.base.digest``) of the TEs run since the previous record, and of an ad hoc
   transaction's statements, must equal the ones the record carries. A difference (a
   procedure calling ``random()`` or reading the clock, an ad hoc transaction reading what was
   not logged) raises ``ReplayMismatchError`` naming the transaction: the engine refuses to
   start rather than go on from another state (``Engine._start`` closes it), and neither the
   snapshot nor the log is touched.

``checkpoint`` writes a new snapshot (to a temporary file, then renamed over the old one, so a
crash leaves either the old or the new snapshot) and empties the log; the snapshot remembers the
last log position it contains so a crash between the rename and emptying the log replays
nothing twice.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection

import duckdb

from sstore.base.errors import (
    DeclarationError,
    InputLogError,
    ProgramChangedError,
    ReplayMismatchError,
)
from sstore.base.faults import crash_point
from sstore.base.files import replace_durably
from sstore.base.sql import literal
from sstore.execution import gc
from sstore.execution.runtime import Runtime
from sstore.storage import systables
from sstore.storage.inputlog import InputLog, LogRecord

SNAPSHOT_LSN = "snapshot_lsn"
SNAPSHOT_TE_SEQ = "snapshot_te_seq"


def snapshot_path(log_path: str) -> str:
    return log_path + ".snapshot"


def load_snapshot(con: duckdb.DuckDBPyConnection, log_path: str) -> bool:
    path = snapshot_path(log_path)
    if not os.path.exists(path):
        return False
    con.execute(f"ATTACH {literal(path)} AS sstore_snapshot (READ_ONLY)")
    try:
        con.execute("COPY FROM DATABASE sstore_snapshot TO memory")
    finally:
        con.execute("DETACH sstore_snapshot")
    return True


def unreplayed_batches(con: duckdb.DuckDBPyConnection, log: InputLog) -> str | None:
    """Why a stream cannot evolve before this start's replay, if it cannot: the input log
    holds batches after the snapshot, logged with the stream's old columns, and replaying
    them into the evolved table would give them other values (a default, a wider type) than
    a state file's rows got. Read only when a stream would evolve."""
    skip_through = systables.get_meta(con, SNAPSHOT_LSN)
    logged = sum(1 for r in log.records() if r.kind == "ingest" and r.lsn > skip_through)
    if not logged:
        return None
    return (f"the input log {log.path} holds {logged} batch(es) after its snapshot, logged "
            f"with the old columns. Start the program once more with the old declaration and "
            f"call Engine.checkpoint() (the snapshot then holds them), then start the new one")


def replay(rt: Runtime, log: InputLog, run_one: Callable[[int], bool],
           apply_ingest: Callable[[LogRecord], None],
           apply_oltp: Callable[[LogRecord], None]) -> int:
    """Replay the log; returns the number of records applied."""
    skip_through = systables.get_meta(rt.con, SNAPSHOT_LSN)
    rt.te_seq = systables.get_meta(rt.con, SNAPSHOT_TE_SEQ)
    applied = 0
    rt.replaying = True
    try:
        for record in log.records():
            if record.lsn <= skip_through or record.kind == "identity":
                continue
            while rt.te_seq < record.te_seq:
                if not run_one(record.te_seq - rt.te_seq):  # a group must not run past it
                    break
            _check_tes(log, record, rt.retired)
            try:
                if record.kind == "ingest":
                    apply_ingest(record)
                elif record.kind == "oltp":
                    apply_oltp(record)
                elif record.kind == "gc":
                    gc.collect(rt, keep=record.keep or {})
            except (ReplayMismatchError, DeclarationError):
                raise
            except Exception as exc:
                raise InputLogError(
                    f"{log.path}: record {record.lsn} ({_describe(record)}) was accepted when it "
                    f"was logged but fails to replay: {exc}; procedures and ad hoc transactions "
                    f"must be deterministic (see docs/engine.md, durability)") from exc
            applied += 1
    finally:
        rt.replaying = False
    # a log emptied by a checkpoint numbers nothing itself: the next record must come after
    # the snapshot's last position, or the replay after it would skip it as already taken
    log.next_lsn = max(log.next_lsn, skip_through + 1)
    return applied


def _check_tes(log: InputLog, record: LogRecord, retired: Collection[str] = ()) -> None:
    """The TEs replayed since the previous record must be the ones ``record`` says ran live
    before it, each with the same digest (a log from before digests says nothing: no check).

    ``retired``: procedures this program retires. A log written by the program before the
    change records the old procedures' TEs, which the new program cannot run again: that is
    a ``ProgramChangedError`` saying what to do, not a blame of non-determinism."""
    replayed = log.take_tes()
    if record.tes is None:
        return
    try:
        _compare_tes(log, record, replayed)
    except ReplayMismatchError:
        if retired:
            raise ProgramChangedError(
                f"{log.path}: the input log holds transaction executions of the program before "
                f"this one, which retires {sorted(retired)}; weak durability rebuilds the state "
                f"by running the log again, which only the program that wrote it can do. Open "
                f"the old program once, call Engine.checkpoint() and close it (the log is then "
                f"empty), then open this one. The snapshot and the log are untouched") from None
        raise


def _compare_tes(log: InputLog, record: LogRecord,
                 replayed: list[tuple[str, int, int]]) -> None:
    assert record.tes is not None
    for i, (procedure, batch_id, digest) in enumerate(replayed):
        if i >= len(record.tes):
            raise ReplayMismatchError(
                f"{log.path}: before record {record.lsn} ({_describe(record)}) replay ran "
                f"procedure {procedure!r} on batch {batch_id}, which had not run live at that "
                f"point{_REFUSED}")
        if record.tes[i] != digest:
            raise ReplayMismatchError(
                f"{log.path}: before record {record.lsn} ({_describe(record)}), procedure "
                f"{procedure!r} on batch {batch_id} did not do at replay what it did live: "
                f"its statements, their parameters, their row counts or its output rows "
                f"differ (random(), the clock, or a read of what the log does not hold)"
                f"{_REFUSED}")
    if len(record.tes) > len(replayed):
        raise ReplayMismatchError(
            f"{log.path}: before record {record.lsn} ({_describe(record)}) live committed "
            f"{len(record.tes)} transaction execution(s) since the previous record, replay "
            f"only {len(replayed)} (a procedure that failed or halted at replay only)"
            f"{_REFUSED}")


#: what every replay mismatch says next
_REFUSED = ("; weak durability replays only deterministic procedures and ad hoc transactions "
            "(docs/engine.md, \"Durability modes\"), so the engine refuses to start from a "
            "state other than the one committed live. The snapshot and the log are untouched")


def _describe(record: LogRecord) -> str:
    if record.kind == "ingest":
        return f"batch {record.batch_id} of stream {record.stream!r}"
    if record.kind == "gc":
        return "a garbage collection"
    if record.kind == "te":
        return "the digests of the last transaction executions"
    return f"ad hoc transaction of {len(record.statements or [])} statement(s)"


def checkpoint(rt: Runtime, log: InputLog) -> str:
    """Write the in-memory state to the snapshot file and empty the log."""
    path = snapshot_path(log.path)
    tmp = path + ".tmp"
    for leftover in (tmp, tmp + ".wal"):
        if os.path.exists(leftover):
            os.remove(leftover)
    con = rt.con
    systables.set_meta(con, SNAPSHOT_LSN, log.next_lsn - 1)
    systables.set_meta(con, SNAPSHOT_TE_SEQ, rt.te_seq)
    con.execute(f"ATTACH {literal(tmp)} AS sstore_checkpoint")
    try:
        con.execute("COPY FROM DATABASE memory TO sstore_checkpoint")
    finally:
        con.execute("DETACH sstore_checkpoint")
    replace_durably(tmp, path)  # DuckDB's DETACH checkpointed and fsync'd the file
    crash_point("checkpoint.after_snapshot")
    log.restart()
    return path

