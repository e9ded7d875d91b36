"""The one exactly-once delivery into PostgreSQL.

Every writer whose rows must land in PostgreSQL exactly once goes through ``deliver``: the
continuous sink and ``sstore migrate`` (``engine_to_postgres``), the streaming pipeline's file
rejects, the Spark DimTrade loader and the Structured Streaming baseline. Progress is one
watermark row per (source, stream, target) in ``sstore.watermarks``:

- ``source`` is who produces the batches: an engine's UUID (made with its state file, so a
  rebuilt or second state file is never taken for the first) or a named loader;
- ``stream`` is the series of batches (an engine stream, a loader's batch numbers);
- ``target`` is the table's canonical name, ``schema.table`` as PostgreSQL names it, whatever
  spelling the writer gave (``x``, ``public.x`` and ``"public"."x"`` are one watermark:
  ``canonical_target``), and ``target_oid`` the table the watermark was written for, so a
  table dropped or recreated by hand is noticed. A row recorded under another spelling of
  the same table (an older sstore kept the spelling) is adopted: rewritten to the canonical
  name in the locking transaction; two live rows for one table are refused
  (``TargetNamesConflictError``), never merged;
- ``merge_key``: the key columns of a writer that merges by key (NULL: it appends), so that a
  reader of both the stream and the table knows they cannot simply be added up.
- ``epoch``: the fence. A writer that starts (``claim``) bumps it and keeps the new value in
  its ``SinkKey``; each of its deliveries checks it under the row's lock (steps 1-2, and the
  common case's UPDATE), so a writer that started earlier (another process on a copy of the
  state file) fails with ``FencedError`` and writes nothing: two writers never both commit.

Commit protocol of one delivery (batches ``first``..``last``), in ONE PostgreSQL transaction:

1. Lock the watermark row (``SELECT ... FOR UPDATE``; made at 0 if missing): concurrent writers
   of the same (source, stream, target) queue here.
2. Read it and check the target: it must exist (``prepare_target`` may create it) and be the
   table the watermark was written for. A different table (dropped and recreated by hand)
   invalidates the watermark: it starts over at 0. A new watermark row must not meet a live
   watermark of another source for the same stream and target (two state files feeding one
   table by mistake): that is ``TargetClaimedError``, unless ``shared_target``. The same
   table found empty while the watermark counts delivered rows (a ``TRUNCATE`` by hand) starts
   over like a dropped one, unless ``drained_target`` (another process empties it on purpose).
3. Compare with what the caller planned (``after``, the batch its plan continues after): at
   ``after``, go on; at or past ``last``, the batches are there: write nothing; in between,
   ``write`` skips the batches at or below the watermark; below ``after``, the target lacks
   batches the caller thinks it has: write nothing and raise ``TargetBehind`` so the caller
   plans again from the watermark.
4. Write the rows (``write(cursor, watermark)``: binary COPY, merge).
5. Advance the watermark to ``last`` and count the rows.
6. COMMIT: rows and watermark become visible together, or neither does.
7. The caller acknowledges ``last`` to its source (an engine may then collect the batches).
   A crash between 6 and 7 is harmless: the watermark decides on restart.

The common case (the watermark row exists, stands where the caller planned from and belongs to
the table now under the target's name) does steps 1, 2, 3 and 5 in one conditional UPDATE,
sent with BEGIN, before step 4 (``planned_rows``); it holds the same row lock and commits
with the rows, and anything else matches nothing and takes the steps one by one.

The table itself (DDL, canonical names, ``reset``, what readers and upkeep ask of it) is
``migrators.watermarks``; the protocol's errors (``FencedError``, ...) are in ``migrators.errors``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import psycopg
from psycopg.pq import TransactionStatus

from migrators.errors import (
    FencedError,
    TargetBehind,
    TargetClaimedError,
    TargetMissingError,
    TargetNamesConflictError,
)
from migrators.watermarks import (
    WATERMARKS,
    Target,
    canonical_target,
    has_rows,
    refuse_replaced_target,
    spellings,
)
from sstore.base.sql import one_value, qualified

log = logging.getLogger("sstore.migrators")

Write = Callable[[psycopg.Cursor, int], int]
PrepareTarget = Callable[[psycopg.Cursor], None]
#: ``claim``'s drift check: (cursor, the fingerprint recorded at the last claim or None, the
#: checked watermark) -> the fingerprint to record now; raises to refuse the start
Fingerprint = Callable[[psycopg.Cursor, "str | None", "Watermark"], str]


@dataclass(frozen=True)
class SinkKey:
    """Whose batches (``source``), which series (``stream``), into which table (``target``).
    ``merge_key``: the key columns (comma-separated) of a writer that merges by key, recorded
    in the watermark row (not part of the identity)."""

    source: str
    stream: str
    target: str
    merge_key: str | None = field(default=None, compare=False)
    #: the fence this writer's ``claim`` got (``Watermark.epoch``); None: a writer that does
    #: not claim (it is never fenced, and fences no one)
    epoch: int | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.stream} -> {self.target} (source {self.source})"


@dataclass(frozen=True)
class Watermark:
    """Step 2's answer: the target has every batch up to ``batch_id``. ``reset``: the target
    was recreated, so an earlier watermark (``previous``) no longer counts."""

    batch_id: int
    reset: bool = False
    previous: int = 0
    emptied: bool = False  # the same table, emptied by hand (else: dropped or recreated)
    target: str = ""  # the canonical name the watermark row is keyed on (``canonical_target``)
    epoch: int | None = None  # the fence a ``claim`` took: pass it in the writer's ``SinkKey``


@dataclass(frozen=True)
class Delivery:
    """What one ``deliver`` did: ``rows`` written (0 when the batches were already there)."""

    rows: int
    watermark_before: int
    skipped: bool


def _adopt(cur: psycopg.Cursor, key: SinkKey, target: Target) -> SinkKey:
    """``key`` with its canonical target, after the watermark row of this (source, stream)
    recorded under another spelling of the same table, if any, was renamed to it (locked,
    in the caller's transaction): found by a name the table had (``_spellings``) or by the
    table it was written for (``target_oid``). Two rows both written for the table now under
    the name: ``TargetNamesConflictError`` naming both. Without a live row, the row under
    the canonical name wins, then the one under the spelling given; a stale one under the
    canonical name yields to a live one (its table is gone from that name)."""
    canonical = replace(key, target=target.name)
    rows = cur.execute(
        f"SELECT target, target_oid, batch_id FROM {WATERMARKS} WHERE source = %s AND "
        f"stream = %s AND (target = ANY(%s) OR (%s::oid IS NOT NULL AND target_oid = %s)) "
        f"ORDER BY target FOR UPDATE",
        (key.source, key.stream, spellings(target, key.target), target.oid, target.oid)
    ).fetchall()
    live = [r for r in rows if target.oid is not None and r[1] == target.oid]
    if len(live) > 1:
        raise TargetNamesConflictError(
            f"{key.stream} -> {target.name} (source {key.source}): watermark rows "
            f"{', '.join(repr(r[0]) for r in live)} (batches up to "
            f"{', '.join(str(r[2]) for r in live)}) were both written for the table now "
            f"named {target.name}, under two spellings of its name; which one counts its "
            f"batches cannot be known, so nothing is delivered. Delete the wrong one from "
            f"{WATERMARKS} (or reset the sink: sstore migrate --reset)")
    names = [r[0] for r in rows]
    chosen = (live[0][0] if live else target.name if target.name in names
              else key.target if key.target in names else names[0] if names else None)
    if chosen is None or chosen == target.name:
        return canonical
    if target.name in names:  # a stale row under the canonical name, the live one elsewhere
        log.warning("%s: forgetting the watermark row of a table no longer under that name",
                    canonical)
        cur.execute(f"DELETE FROM {WATERMARKS} WHERE source = %s AND stream = %s AND "
                    f"target = %s", (key.source, key.stream, target.name))
    log.info("%s: adopting the watermark row recorded as %r", canonical, chosen)
    cur.execute(f"UPDATE {WATERMARKS} SET target = %s WHERE source = %s AND stream = %s AND "
                f"target = %s", (target.name, key.source, key.stream, chosen))
    return canonical


def lock(cur: psycopg.Cursor, key: SinkKey, prepare_target: PrepareTarget | None = None,
         shared_target: bool = False, drained_target: bool = False,
         missing_ok: bool = False) -> Watermark:
    """Steps 1 and 2 in the caller's open transaction: the locked, checked watermark. A
    target emptied by hand (``TRUNCATE``) starts over like a dropped one, unless
    ``drained_target`` (another process takes the rows out of it on purpose). The
    watermark row is the one of the target's canonical name (``canonical_target``; a row
    under another spelling is adopted), and the answer carries that name (``target``).
    ``missing_ok`` (without ``prepare_target``): a missing target is no error, the row is
    locked (made) all the same and bound to no table; the first delivery creates the table
    and binds it (a sink claiming its fence before its stream has rows, ``claim``)."""
    key = _adopt(cur, key, canonical_target(cur, key.target))
    row = _select_for_update(cur, key)
    new = row is None
    if row is None:
        cur.execute(f"INSERT INTO {WATERMARKS} (source, stream, target, merge_key) VALUES "
                    f"(%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (key.source, key.stream, key.target, key.merge_key))
        row = _select_for_update(cur, key)
        assert row is not None
    batch_id, stored_oid, current_oid, rows_total = int(row[0]), row[1], row[2], int(row[3])
    if key.epoch is not None and not new and int(row[4]) != key.epoch:
        raise FencedError(
            f"{key}: another writer of this stream into {key.target} started after this one "
            f"(fence {int(row[4])}, this writer's {key.epoch}; it stands at batch {batch_id}): "
            f"this writer wrote nothing and stops. Two writers of one stream and target never "
            f"both commit; if this one should be the writer, start it again (it then fences "
            f"the other)")
    if current_oid is None:
        if prepare_target is None and missing_ok:
            return _unbound(cur, key, batch_id, stored_oid)
        if prepare_target is None:
            raise TargetMissingError(f"{key}: table {key.target} does not exist")
        prepare_target(cur)
        current_oid = one_value(cur.execute("SELECT to_regclass(%s)::oid",
                                            (qualified(key.target),)).fetchone())
    watermark = Watermark(batch_id, target=key.target)
    if stored_oid != current_oid:
        if stored_oid is not None and batch_id > 0:
            refuse_replaced_target(cur, key.stream, key.target, batch_id)
        if stored_oid is not None:
            _log_reset(key, "dropped or recreated", batch_id)
            watermark = Watermark(0, reset=True, previous=batch_id, target=key.target)
        _claim(cur, key, current_oid, shared_target,
               fresh=new or watermark.reset or stored_oid is None)
    elif not drained_target and _emptied(cur, key, batch_id, rows_total):
        log.warning("%s: the target was emptied (TRUNCATE?) since batch %d was delivered; its "
                    "watermark starts over", key, batch_id)
        watermark = Watermark(0, reset=True, previous=batch_id, emptied=True,
                              target=key.target)
        cur.execute(f"UPDATE {WATERMARKS} SET batch_id = 0, rows_total = 0, updated_at = now() "
                    f"WHERE source = %s AND stream = %s AND target = %s",
                    (key.source, key.stream, key.target))
    return watermark


def _unbound(cur: psycopg.Cursor, key: SinkKey, batch_id: int, stored_oid: int | None
             ) -> Watermark:
    """``lock``'s answer for a target that does not exist (``missing_ok``): the watermark as
    it stands, or, when the table it was written for was dropped since, started over at 0
    and bound to no table (as ``lock`` with ``prepare_target`` would before creating it)."""
    if stored_oid is None:
        return Watermark(batch_id, target=key.target)
    _log_reset(key, "dropped", batch_id)
    cur.execute(f"UPDATE {WATERMARKS} SET batch_id = 0, rows_total = 0, target_oid = NULL, "
                f"updated_at = now() WHERE source = %s AND stream = %s AND target = %s",
                (key.source, key.stream, key.target))
    return Watermark(0, reset=True, previous=batch_id, target=key.target)


def _log_reset(key: SinkKey, how: str, batch_id: int) -> None:
    """The warning of a watermark that starts over. One at 0 already (it started over
    before, and nothing was delivered since) names no batch: "since batch 0 was delivered"
    read as if batch 0 had been; which batches the table had held before, PostgreSQL no
    longer knows (a sink's ``GapError`` names them from the engine's acknowledgement)."""
    if batch_id > 0:
        log.warning("%s: the target was %s since batch %d was delivered; its watermark "
                    "starts over", key, how, batch_id)
    else:
        log.warning("%s: the target was %s again; its watermark had started over already "
                    "and counts no batch", key, how)


def deliver(con: psycopg.Connection, key: SinkKey, first: int, last: int, write: Write, *,
            after: int | None, prepare_target: PrepareTarget | None = None,
            shared_target: bool = False, drained_target: bool = False,
            before_commit: Callable[[psycopg.Connection], None] | None = None,
            planned_rows: int | None = None) -> Delivery:
    """Steps 1-6 for batches ``first``..``last`` (see the module docstring).

    ``after``: the batch the caller's plan continues after (``TargetBehind`` if the target is
    below it); ``None`` for a series whose batches need not follow one another. ``write``
    gets the cursor and the watermark (write only batches above it) and returns the rows
    written. ``before_commit`` is a test hook (the open connection, after step 5).

    ``planned_rows`` (with ``after``): the rows ``write`` writes when the watermark is at
    ``after``. It allows the common case in one statement instead of two (``_advance``):
    each costs a round trip per chunk, about a tenth of a 10,000-row chunk's COPY here."""
    if last < first:
        raise ValueError(f"empty batch range {first}..{last}")
    if after is not None and planned_rows is not None and planned(key, after, last):
        with own_begin(con):
            done = write_planned(con, key, after, last, write, planned_rows, drained_target,
                                 begin=True)
            if done is not None:
                if before_commit is not None:
                    before_commit(con)
                con.commit()  # step 6
                return done
            con.rollback()  # nothing changed: the steps one by one, from the start
    with con.cursor() as cur:
        watermark = lock(cur, key, prepare_target, shared_target, drained_target)  # steps 1-2
        key = replace(key, target=watermark.target)  # the canonical name
        if after is not None and watermark.batch_id < after:  # step 3
            con.commit()  # keep what step 2 learnt (a recreated target's new OID)
            raise TargetBehind(key, watermark, after)
        if watermark.batch_id >= last:
            con.commit()
            return Delivery(0, watermark.batch_id, skipped=True)
        rows = write(cur, watermark.batch_id)  # step 4
        cur.execute(f"UPDATE {WATERMARKS} SET batch_id = %s, rows_total = rows_total + %s, "
                    f"updated_at = now() WHERE source = %s AND stream = %s AND target = %s",
                    (last, rows, key.source, key.stream, key.target))  # step 5
    if before_commit is not None:
        before_commit(con)
    con.commit()  # step 6
    return Delivery(rows, watermark.batch_id, skipped=False)


def planned(key: SinkKey, after: int, last: int) -> bool:
    """Whether a delivery of batches up to ``last`` planned after ``after`` may take the common
    case (``write_planned``): it moves the watermark forward, and the key is a plain
    ``schema.table`` (``_plain``)."""
    return last > after and _plain(key.target)


def write_planned(con: psycopg.Connection, key: SinkKey, after: int, last: int, write: Write,
                  planned_rows: int, drained_target: bool = False, *,
                  begin: bool) -> Delivery | None:
    """The common case's steps 1-5 (``_advance``, then ``write``) in the open transaction
    (``begin``: sent with BEGIN, the connection in autocommit mode, ``own_begin``); None when
    the watermark is not where the plan continues, with nothing changed by this call. The
    caller commits; a caller that wrote other deliveries in the same transaction before this
    one rolls them back on None, as they are no longer one transaction with this one."""
    if not _advance(con, key, after, last, planned_rows, drained_target, begin=begin):
        return None
    with con.cursor() as cur:
        rows = write(cur, after)  # step 4, the watermark already advanced
        if rows != planned_rows:  # the caller's count was off: keep the total
            cur.execute(f"UPDATE {WATERMARKS} SET rows_total = rows_total + %s "
                        f"WHERE source = %s AND stream = %s AND target = %s",
                        (rows - planned_rows, key.source, key.stream, key.target))
    return Delivery(rows, after, skipped=False)


def _advance(con: psycopg.Connection, key: SinkKey, after: int, last: int, rows: int,
             drained_target: bool = False, *, begin: bool = True) -> bool:
    """BEGIN, then steps 1, 2, 3 and 5 in one statement when nothing is unusual: the
    watermark row exists, stands at ``after``, belongs to the table now under the target's
    name, and that table still has rows if the watermark counts any (an emptied target is seen
    by ``lock``). The UPDATE locks the row as ``SELECT ... FOR UPDATE`` would (a concurrent
    writer queues, then finds the watermark moved and matches nothing). False (nothing changed):
    take the full path, which sees and handles whatever is unusual (a row recorded under
    another spelling than its table's canonical name, adopted there). The new watermark is
    only visible with the rows, at COMMIT; a failed COPY rolls both back.

    BEGIN and the UPDATE go in one message (psycopg's ``ClientCursor``: the parameters are
    adapted and quoted by psycopg, then sent with the simple query protocol, which takes
    two statements), so a chunk costs the round trips of a raw COPY: this one, COPY's two
    and COMMIT. psycopg's own BEGIN would be one more, and on a loaded machine every
    round trip waits for the scheduler twice.
    ``begin=False``: the UPDATE alone, in a transaction already open (a later member of a
    sink group's transaction, ``migrators.sink_runner``).

    Only a row under its table's canonical name can match: the key is a plain ``schema.table``
    (``_plain``), quoted part by part, so the table ``to_regclass`` finds for it is named
    exactly so in ``pg_class``, and its OID must be the row's ``target_oid``."""
    still_full = "" if drained_target else (
        f" AND (rows_total = 0 OR EXISTS (SELECT 1 FROM {qualified(key.target)}))")
    with psycopg.ClientCursor(con) as cur:
        try:
            # epoch: fenced by a newer claim, no match (and ``lock`` says why); NULL: a
            # writer that does not claim, never fenced
            cur.execute(
                f"{'BEGIN; ' if begin else ''}UPDATE {WATERMARKS} SET batch_id = %s, "
                f"rows_total = rows_total + %s, updated_at = now() WHERE source = %s AND "
                f"stream = %s AND target = %s AND batch_id = %s AND "
                f"target_oid = to_regclass(%s)::oid{still_full} AND "
                f"(%s::bigint IS NULL OR epoch = %s) RETURNING batch_id",
                (last, rows, key.source, key.stream, key.target, after, qualified(key.target),
                 key.epoch, key.epoch))
            return (not begin or bool(cur.nextset())) and cur.fetchone() is not None
        except psycopg.errors.UndefinedTable:  # no target yet (or dropped): the full path
            return False


@contextlib.contextmanager
def own_begin(con: psycopg.Connection) -> Iterator[None]:
    """The connection in autocommit mode, so that ``write_planned`` sends BEGIN itself; psycopg
    then leaves the open transaction alone and ``commit`` or ``rollback`` ends it. On the
    way out the connection is back in its usual mode with no transaction open, or closed:
    a connection left in autocommit mode would commit each statement of the next delivery
    on its own."""
    con.autocommit = True
    try:
        yield
    finally:
        try:
            if con.info.transaction_status != TransactionStatus.IDLE:
                con.rollback()  # a failure in between: nothing of it is kept
            con.autocommit = False
        except psycopg.Error:
            con.close()  # broken: the caller's session connects anew


def claim(con: psycopg.Connection, key: SinkKey, prepare_target: PrepareTarget | None = None,
          shared_target: bool = False, drained_target: bool = False,
          fingerprint: Fingerprint | None = None, writer: str | None = None,
          missing_ok: bool = False) -> Watermark:
    """Steps 1-2 on their own, committed: where a writer stands before it plans (a sink's
    start). Creates the target through ``prepare_target`` if it is missing (``missing_ok``
    without it: a missing target is left to the first delivery, ``lock``). Records the
    writer's ``merge_key`` (a row made before it was recorded, or a writer whose mode
    changed). Takes the fence: the row's ``epoch`` is bumped and returned in the answer, and
    a writer that claimed before (another process) is fenced at its next delivery
    (``FencedError``): pass the answer's ``epoch`` in this writer's ``SinkKey``. A ``key``
    that carries an epoch already keeps it: checked under the row's lock (``FencedError``
    when another writer claimed since), not taken anew (a sink preparing its target when its
    stream's first rows came, after a start that had none).
    ``fingerprint``: the drift check (``migrators.drift``), given the fingerprint the last
    claim recorded; what it returns is recorded, in the same transaction. ``writer``: who
    claims (a token per engine object, ``sink_target.writer_token``): a claim by the writer
    that holds the fence already keeps it, so two sinks of one engine on one target queue on
    the row lock as before instead of fencing each other."""
    with con.cursor() as cur:
        watermark = lock(cur, key, prepare_target, shared_target, drained_target, missing_ok)
        now = None
        if fingerprint is not None:
            stored = one_value(cur.execute(
                f"SELECT fingerprint FROM {WATERMARKS} WHERE source = %s AND stream = %s AND "
                f"target = %s", (key.source, key.stream, watermark.target)).fetchone())
            now = fingerprint(cur, stored, watermark)
        epoch = one_value(cur.execute(
            f"UPDATE {WATERMARKS} SET merge_key = %s, epoch = epoch + CASE WHEN writer IS NOT "
            f"NULL AND writer = %s THEN 0 ELSE 1 END, writer = %s, "
            f"fingerprint = coalesce(%s, fingerprint) WHERE source = %s AND stream = %s AND "
            f"target = %s RETURNING epoch",
            (key.merge_key, writer, writer, now, key.source, key.stream,
             watermark.target)).fetchone())
    con.commit()
    return replace(watermark, epoch=int(epoch))


def skip_to(cur: psycopg.Cursor, key: SinkKey, watermark: int, after: int) -> None:
    """Move the watermark from ``watermark`` to ``after`` without delivering (a gap the
    writer accepted: the batches in between are gone from the source), in the caller's
    transaction, after ``lock``; nothing changes if another writer moved it meanwhile."""
    cur.execute(f"UPDATE {WATERMARKS} SET batch_id = %s, updated_at = now() WHERE source = %s "
                f"AND stream = %s AND target = %s AND batch_id = %s",
                (after, key.source, key.stream, key.target, watermark))


def read(con: psycopg.Connection, key: SinkKey) -> int | None:
    """The watermark without locking (reports): None if there is none. Found under the
    target's canonical name, or as the row written for the table now under it (a row an
    older sstore recorded under another spelling, not adopted yet)."""
    with con.cursor() as cur:
        target = canonical_target(cur, key.target)
        row = cur.execute(
            f"SELECT batch_id FROM {WATERMARKS} WHERE source = %s AND stream = %s AND "
            f"(target = ANY(%s) OR (%s::oid IS NOT NULL AND target_oid = %s)) "
            f"ORDER BY target = %s DESC LIMIT 1",
            (key.source, key.stream, spellings(target, key.target), target.oid, target.oid,
             target.name)).fetchone()
    return int(row[0]) if row else None


def _plain(target: str) -> bool:
    """Whether ``target`` may be a canonical name (``schema.table``, no quotes): only such a
    key can match a row in ``_advance``; any other spelling takes the full path at once."""
    return '"' not in target and target.count(".") == 1


def _select_for_update(cur: psycopg.Cursor, key: SinkKey
                       ) -> tuple[int, int | None, int | None, int, int] | None:
    return cur.execute(
        f"SELECT batch_id, target_oid, to_regclass(%s)::oid, rows_total, epoch "
        f"FROM {WATERMARKS} "
        f"WHERE source = %s AND stream = %s AND target = %s FOR UPDATE",
        (qualified(key.target), key.source, key.stream, key.target)).fetchone()


def _emptied(cur: psycopg.Cursor, key: SinkKey, batch_id: int, rows_total: int) -> bool:
    """Whether the target lost every row this writer delivered (a ``TRUNCATE`` or a
    ``DELETE`` of all rows by hand: the table, and so its OID, stays): the watermark counts
    rows delivered, the table has none."""
    return batch_id > 0 and rows_total > 0 and not has_rows(cur, key.target)


def _claim(cur: psycopg.Cursor, key: SinkKey, oid: int, shared_target: bool, fresh: bool
           ) -> None:
    """Record that the watermark belongs to table ``oid``; forget watermarks of tables that no
    longer exist under the target's name; refuse a live watermark of another source for the
    same stream (unless ``shared_target``)."""
    cur.execute(f"DELETE FROM {WATERMARKS} WHERE target = %s AND target_oid IS NOT NULL AND "
                f"target_oid <> %s AND NOT (source = %s AND stream = %s)",
                (key.target, oid, key.source, key.stream))
    if fresh and not shared_target:
        other = cur.execute(
            f"SELECT source, batch_id, updated_at FROM {WATERMARKS} WHERE stream = %s AND "
            f"(target = %s OR target_oid = %s) AND source <> %s AND batch_id > 0 "
            f"ORDER BY updated_at DESC LIMIT 1",
            (key.stream, key.target, oid, key.source)).fetchone()
        if other is not None:
            when = f"{other[2]:%Y-%m-%d %H:%M:%S}"
            raise TargetClaimedError(
                f"{key.target} already holds batches up to {other[1]} of stream "
                f"{key.stream!r} from another source ({other[0]}, last delivered {when}); "
                f"this source ({key.source}) is a different one (a rebuilt or "
                f"second state file?). Nothing was written. To let this source replace it, "
                f"drop the target, or empty it (TRUNCATE) and reset the sink (sstore "
                f"migrate --reset); to feed one table from several sources on purpose, use "
                f"shared_target=True")
    cur.execute(f"UPDATE {WATERMARKS} SET target_oid = %s, batch_id = CASE WHEN target_oid IS "
                f"NULL THEN batch_id ELSE 0 END, rows_total = CASE WHEN target_oid IS NULL THEN "
                f"rows_total ELSE 0 END, updated_at = now() WHERE source = %s AND "
                f"stream = %s AND target = %s", (oid, key.source, key.stream, key.target))


