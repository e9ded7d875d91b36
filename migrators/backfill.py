"""Versioned backfill: replace one interval of a table's rows in ONE PostgreSQL transaction.

A stream loads a table interval after interval (a TPC-DI batch, a range of batch-ids, a range of
dates); a batch job (Spark) may later rebuild an interval from the sources. Its rows must
replace what the stream wrote for that interval so that a reader sees the interval all old or
all new, never half of each, while the stream keeps loading later intervals.

An ``Interval`` is a named, closed range of one column (``batchid`` 2..2, ``sk_createdateid``
20170701..20170731); a ``Slice`` is the rows of one interval in one table (with an optional
fixed filter, e.g. ``messagesource = 'DimTrade'``, and the key for tables whose rows are
updated in place). Versions live in ``sstore.intervals``, one row per (target, interval),
with the interval's column and bounds. Versions are per exact interval: one that overlaps a
recorded interval of the same target and column with other bounds, or reuses a recorded name
with other bounds, is refused (``IntervalOverlap``, checked under a per-target advisory lock
by ``seal`` and ``replace``), since both would claim the shared rows:

- the stream *seals* an interval (``seal``: version 1, source ``stream``) once every row of it
  is in PostgreSQL; before that a backfill of it is refused (``IntervalNotSealed``): the
  stream may still write rows of it, and a replace now would lose them or be overwritten;
- ``replace`` stages the rebuilt rows (binary COPY into an unlogged table, its own committed
  transaction: a large stage holds no lock on the target), then in ONE transaction:

  1. checks no slice overlaps another recorded interval, locks the ``sstore.intervals`` rows
     of the slices (``FOR UPDATE``: two backfills of one interval queue) and checks each is
     sealed (a slice the stream never seals, ``sealed=False``, is recorded at version 0);
  2. locks each target ``IN SHARE ROW EXCLUSIVE MODE``: readers go on (they see the old
     rows until COMMIT), writers (the stream's sink delivering a later interval) wait for the
     swap's few milliseconds, so a sink's chunk lands wholly before or wholly after it;
  3. checks the staged rows lie in the interval (else nothing is written);
  4. deletes the interval's rows, inserts the staged ones; with a key, a staged row whose key
     is held by a row of a *later* interval (column above the range) keeps that row (it is
     newer: the stream updated it after the interval), one of an *earlier* interval is
     replaced (the interval's change to it was missing); rows above a slice's ``newer`` bound
     (written after what the rebuild read) are neither deleted nor overwritten;
  5. bumps the version (source ``backfill``, the rows now in the interval, ``replaced_at``);
  6. COMMIT; the stage tables are dropped afterwards (also on failure).

The tables are locked in name order; a writer that takes them in another order (the Spark bulk
DimTrade loader writes dimtrade, then dimessages) may deadlock with a swap: PostgreSQL aborts
one of the two, and both retry a deadlock (``migrators.pg_errors``: transient), the swap from
step 1. A sink reset (``sstore migrate --reset``) over a table holding rows of recorded
intervals is refused (``check_reset``): it would deliver the stream's rows again over them. A
process killed between staging and the swap leaves its ``sstore.backfill_stage_*`` tables
behind (nothing else): drop them by hand.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg
import pyarrow as pa

from migrators.errors import ResetRefused
from migrators.postgres import Session, copy_arrow
from sstore.base.errors import TerminalError
from sstore.base.sql import ident, qualified

INTERVALS = "sstore.intervals"
INTERVALS_DDL = (
    "CREATE SCHEMA IF NOT EXISTS sstore",
    """CREATE TABLE IF NOT EXISTS sstore.intervals (
        target TEXT NOT NULL, interval TEXT NOT NULL, version INTEGER NOT NULL,
        source TEXT NOT NULL CHECK (source IN ('stream', 'backfill')),
        rows BIGINT NOT NULL, replaced_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        bound_column TEXT, low TEXT, high TEXT,
        PRIMARY KEY (target, interval))""",
)
#: Added after the first release: a table made before has no bounds (``ensure_intervals``
#: adds the columns; a row gets its bounds when it is sealed or replaced again).
BOUNDS_DDL = ("ALTER TABLE sstore.intervals ADD COLUMN IF NOT EXISTS bound_column TEXT, "
              "ADD COLUMN IF NOT EXISTS low TEXT, ADD COLUMN IF NOT EXISTS high TEXT")

Bound = int | dt.date  # a datetime is a date too (a timestamp column)


class IntervalNotSealed(TerminalError):
    """The stream has not finished loading the interval (or never loaded it): a backfill now
    could lose rows the stream is still writing. Nothing was changed."""


class StagedRowsOutside(TerminalError):
    """The rebuilt rows include rows outside the interval they are to replace."""


class IntervalOverlap(TerminalError):
    """The interval overlaps another recorded interval of the same target and column with
    other bounds (or reuses a recorded name with other bounds). Versions are per exact
    interval: two overlapping intervals would each claim the shared rows, and neither
    version would say what the rows are. Nothing was changed."""


@dataclass(frozen=True)
class Interval:
    """``column`` BETWEEN ``low`` AND ``high``, known as ``name`` in ``sstore.intervals``."""

    name: str
    column: str
    low: Bound
    high: Bound

    def __post_init__(self) -> None:
        if self.high < self.low:  # type: ignore[operator]
            raise ValueError(f"interval {self.name!r}: high {self.high} is below low "
                             f"{self.low}")

    def bounds(self) -> tuple[str, str]:
        """``low`` and ``high`` as stored in ``sstore.intervals`` (text: ints and ISO
        dates/timestamps, read back by ``_parse``)."""
        return _text(self.low), _text(self.high)

    def overlaps(self, column: str, low: str, high: str) -> bool:
        """Whether the recorded interval ``column`` ``low``..``high`` shares values with this
        one (intervals of another column never do: they are not comparable)."""
        if column != self.column:
            return False
        mine = (_parse(_text(self.low)), _parse(_text(self.high)))
        theirs = (_parse(low), _parse(high))
        if type(mine[0]) is not type(theirs[0]):
            return True  # the same column bounded by ints and dates: treat as overlapping
        return not (mine[1] < theirs[0] or theirs[1] < mine[0])  # type: ignore[operator]

    def predicate(self, alias: str = "") -> tuple[str, tuple[Bound, Bound]]:
        column = f"{alias}.{ident(self.column)}" if alias else ident(self.column)
        return f"{column} BETWEEN %s AND %s", (self.low, self.high)


def _text(bound: Bound) -> str:
    return str(bound) if isinstance(bound, int) else bound.isoformat()


def _parse(text: str) -> int | dt.datetime:
    try:
        return int(text)
    except ValueError:
        return dt.datetime.fromisoformat(text)  # a date reads as its midnight


@dataclass(frozen=True)
class Slice:
    """The rows of ``interval`` in ``table``: those in its range that match ``where`` (a fixed
    SQL condition of the caller's own, with bound ``params``). ``key``: the table's primary
    key, for tables whose rows are updated in place (see the module docstring, step 4).

    ``newer``: (column, value): rows of the table whose ``column`` is above ``value`` were
    written after the rebuild's source (a stream still loading later batches): they are
    neither deleted nor overwritten, whatever the interval. ``sealed``: the stream seals
    this interval (a replace of an unsealed one is refused); False for an interval the
    stream never seals (a date range across its batches), whose caller has checked that
    the stream has finished what the rebuild read: its first replace records version 1."""

    table: str
    interval: Interval
    key: tuple[str, ...] = ()
    where: str | None = None
    params: tuple[object, ...] = ()
    newer: tuple[str, int] | None = None
    sealed: bool = True

    def condition(self) -> tuple[str, tuple[object, ...]]:
        sql, bounds = self.interval.predicate()
        if self.where is None:
            return sql, bounds
        return f"{sql} AND ({self.where})", (*bounds, *self.params)

    def replaceable(self) -> tuple[str, tuple[object, ...]]:
        """``condition`` without the newer rows: the rows a replace deletes."""
        sql, params = self.condition()
        if self.newer is None:
            return sql, params
        return f"{sql} AND {ident(self.newer[0])} <= %s", (*params, self.newer[1])


@dataclass(frozen=True)
class Replaced:
    """What ``replace`` did to one slice."""

    table: str
    interval: str
    version: int
    rows_before: int
    rows_deleted: int
    rows_inserted: int
    rows_kept_newer: int
    rows_after: int


def ensure_intervals(con: psycopg.Connection) -> None:
    """Create ``sstore.intervals`` if it is missing, add the bound columns to one made by an
    older sstore (own transaction, committed)."""
    bounded = con.execute("SELECT count(*) FROM information_schema.columns WHERE table_schema "
                          "= 'sstore' AND table_name = 'intervals' AND column_name IN "
                          "('target', 'bound_column')").fetchone()
    con.rollback()
    found = int(bounded[0]) if bounded else 0
    if found == 2:
        return
    try:
        for statement in INTERVALS_DDL if found == 0 else (BOUNDS_DDL,):
            con.execute(statement)
        con.commit()
    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject,
            psycopg.errors.DuplicateColumn):
        con.rollback()  # a concurrent writer created it first


def _lock_target(cur: psycopg.Cursor, table: str) -> None:
    """Serialise the writers of one target's intervals (seal, replace) until COMMIT: the
    overlap check must see every interval recorded before it."""
    cur.execute("SELECT pg_advisory_xact_lock(hashtext('sstore.intervals'), hashtext(%s))",
                (table,))


def _check_overlap(cur: psycopg.Cursor, piece: Slice) -> None:
    """Refuse (``IntervalOverlap``) an interval that overlaps a recorded one of the same
    target and column with other bounds, or reuses a recorded name with other bounds."""
    low, high = piece.interval.bounds()
    rows = cur.execute(f"SELECT interval, bound_column, low, high, version, source FROM "
                       f"{INTERVALS} WHERE target = %s AND bound_column IS NOT NULL",
                       (piece.table,)).fetchall()
    for name, column, other_low, other_high, version, source in rows:
        same = (column, other_low, other_high) == (piece.interval.column, low, high)
        if name == piece.interval.name and same:
            continue
        if name == piece.interval.name or piece.interval.overlaps(column, other_low,
                                                                  other_high):
            raise IntervalOverlap(
                f"refusing interval {piece.interval.name!r} of {piece.table} "
                f"({piece.interval.column} {low}..{high}): it overlaps interval {name!r} "
                f"({column} {other_low}..{other_high}, version {version}, {source}), and "
                f"versions are per exact interval. Backfill exactly {name!r} (or intervals "
                f"that do not overlap it). Nothing was changed")


def _count(cur: psycopg.Cursor, piece: Slice) -> int:
    sql, params = piece.condition()
    row = cur.execute(f"SELECT count(*) FROM {qualified(piece.table)} WHERE {sql}",
                      params).fetchone()
    return int(row[0]) if row else 0


def seal(con: psycopg.Connection, pieces: Sequence[Slice]) -> list[int]:
    """Record that the stream has loaded every row of these slices (version 1, source
    ``stream``), committed. Sealing again keeps the version (a backfill's stays). Returns
    each slice's version."""
    ensure_intervals(con)
    versions = []
    with con.cursor() as cur:
        for piece in sorted(pieces, key=lambda p: p.table):
            _lock_target(cur, piece.table)
        for piece in pieces:
            try:
                _check_overlap(cur, piece)
            except IntervalOverlap:
                con.rollback()
                raise
            low, high = piece.interval.bounds()
            cur.execute(f"INSERT INTO {INTERVALS} (target, interval, version, source, rows, "
                        f"bound_column, low, high) VALUES (%s, %s, 1, 'stream', %s, %s, %s, %s) "
                        f"ON CONFLICT (target, interval) DO UPDATE SET bound_column = "
                        f"excluded.bound_column, low = excluded.low, high = excluded.high "
                        f"WHERE {INTERVALS}.bound_column IS NULL",
                        (piece.table, piece.interval.name, _count(cur, piece),
                         piece.interval.column, low, high))
            row = cur.execute(f"SELECT version FROM {INTERVALS} WHERE target = %s AND "
                              f"interval = %s", (piece.table, piece.interval.name)).fetchone()
            versions.append(int(row[0]) if row else 0)
    con.commit()
    return versions


def versions(con: psycopg.Connection, table: str | None = None) -> list[dict[str, object]]:
    """The rows of ``sstore.intervals`` (of ``table``, or all), by target and interval."""
    ensure_intervals(con)
    sql = (f"SELECT target, interval, version, source, rows, replaced_at, bound_column, low, "
           f"high FROM {INTERVALS}")
    rows = con.execute(sql + (" WHERE target = %s" if table else "") + " ORDER BY 1, 2",
                       (table,) if table else ()).fetchall()
    con.rollback()
    names = ("target", "interval", "version", "source", "rows", "replaced_at", "column", "low",
             "high")
    return [dict(zip(names, r, strict=True)) for r in rows]


def check_overlaps(con: psycopg.Connection, pieces: Sequence[Slice]) -> None:
    """Refuse (``IntervalOverlap``) early, before a rebuild's work, what ``replace`` would
    refuse in its transaction; no transaction left."""
    ensure_intervals(con)
    try:
        with con.cursor() as cur:
            for piece in pieces:
                _check_overlap(cur, piece)
    finally:
        con.rollback()


def check_reset(con: psycopg.Connection, table: str) -> int:
    """Before a sink of ``table`` forgets its watermarks (``sstore migrate --reset``), in the
    caller's transaction (not committed): a reset delivers again every batch the engine
    still has, over the rows already there; where those rows belong to recorded intervals
    (sealed by the stream, replaced by a backfill) that duplicates appended rows and puts the
    stream's old rows back over a backfill's. Refused (``ResetRefused``) while ``table`` holds
    rows and has intervals; once it is empty (emptied on purpose), its interval records are
    deleted with the watermarks (the rows they counted are gone; the stream seals again).
    Returns the interval records deleted.

    Under the target's lock, as ``seal`` and ``replace``: a swap recording the table's first
    interval is not visible before its COMMIT, so without it a reset during the swap saw no
    interval and went on (and the sink delivered its batches again over the backfill's)."""
    ensure_intervals(con)
    with con.cursor() as cur:
        _lock_target(cur, table)
    recorded = con.execute(f"SELECT interval, version, source FROM {INTERVALS} WHERE target = "
                           f"%s ORDER BY interval FOR UPDATE", (table,)).fetchall()
    if not recorded:
        return 0
    exists = con.execute("SELECT to_regclass(%s) IS NOT NULL", (qualified(table),)).fetchone()
    held = exists and exists[0] and con.execute(
        f"SELECT EXISTS (SELECT 1 FROM {qualified(table)})").fetchone()
    if held and held[0]:
        con.rollback()
        names = ", ".join(f"{r[0]!r} (version {r[1]}, {r[2]})" for r in recorded[:5])
        more = f" and {len(recorded) - 5} more" if len(recorded) > 5 else ""
        raise ResetRefused(
            f"refusing to reset the sink of {table}: it holds rows of versioned intervals "
            f"{names}{more} (sstore backfill status). Delivering the engine's batches again "
            f"would duplicate appended rows and put streamed rows back over backfilled ones. "
            f"To reload it from the stream, empty it first (TRUNCATE {table}), then reset; to "
            f"correct an interval, use sstore backfill run. Nothing was changed")
    return con.execute(f"DELETE FROM {INTERVALS} WHERE target = %s", (table,)).rowcount


def unsealed(con: psycopg.Connection, pieces: Sequence[Slice]) -> list[Slice]:
    """The slices whose interval is not sealed yet (none: all are); no transaction left.
    Slices the stream never seals (``sealed=False``) are not asked for."""
    ensure_intervals(con)
    missing = [p for p in pieces if p.sealed and con.execute(
        f"SELECT 1 FROM {INTERVALS} WHERE target = %s AND interval = %s",
        (p.table, p.interval.name)).fetchone() is None]
    con.rollback()
    return missing


def replace(url: str, staged: Sequence[tuple[Slice, pa.Table]],
            not_sealed: Callable[[list[Slice]], str] | None = None,
            before_swap: Callable[[], None] | None = None,
            before_commit: Callable[[psycopg.Connection], None] | None = None
            ) -> list[Replaced]:
    """Replace each slice's rows by its staged rows, all in one transaction (module
    docstring). ``not_sealed(slices)`` words the refusal for the caller's domain;
    ``before_swap`` runs after staging, before the swap transaction, and ``before_commit``
    with the open connection before COMMIT (test hooks)."""
    tag = uuid.uuid4().hex[:12]
    stages = [f"sstore.backfill_stage_{tag}_{i}" for i in range(len(staged))]
    session = Session(url)
    try:
        session.run(lambda con: _stage(con, staged, stages), "stage the backfill's rows")
        if before_swap is not None:
            before_swap()
        return session.run(lambda con: _swap(con, staged, stages, not_sealed, before_commit),
                           "replace the interval's rows")
    finally:
        try:
            session.run(lambda con: _drop(con, stages), "drop the backfill's stage tables")
        finally:
            session.close()


def _stage(con: psycopg.Connection, staged: Sequence[tuple[Slice, pa.Table]],
           stages: list[str]) -> None:
    """Step 0: the rows into unlogged stage tables shaped like their targets (committed)."""
    ensure_intervals(con)
    with con.cursor() as cur:
        for (piece, rows), stage in zip(staged, stages, strict=True):
            cur.execute(f"CREATE UNLOGGED TABLE IF NOT EXISTS {qualified(stage)} "
                        f"(LIKE {qualified(piece.table)})")
            cur.execute(f"TRUNCATE {qualified(stage)}")  # a retried stage starts empty
            copy_arrow(cur, stage, rows)
    con.commit()


def _drop(con: psycopg.Connection, stages: list[str]) -> None:
    for stage in stages:
        con.execute(f"DROP TABLE IF EXISTS {qualified(stage)}")
    con.commit()


def _swap(con: psycopg.Connection, staged: Sequence[tuple[Slice, pa.Table]],
          stages: list[str], not_sealed: Callable[[list[Slice]], str] | None,
          before_commit: Callable[[psycopg.Connection], None] | None) -> list[Replaced]:
    """Steps 1-6 of the module docstring."""
    pieces = [piece for piece, _ in staged]
    done = []
    with con.cursor() as cur:
        locked = {}
        for table in sorted({p.table for p in pieces}):
            _lock_target(cur, table)
        try:
            for piece in pieces:
                _check_overlap(cur, piece)
        except IntervalOverlap:
            con.rollback()
            raise
        for piece in sorted(pieces, key=lambda p: (p.table, p.interval.name)):  # step 1
            if not piece.sealed:  # recorded by its first replace (version 0 -> 1 below)
                low, high = piece.interval.bounds()
                cur.execute(f"INSERT INTO {INTERVALS} (target, interval, version, source, "
                            f"rows, bound_column, low, high) VALUES (%s, %s, 0, 'backfill', 0, "
                            f"%s, %s, %s) ON CONFLICT DO NOTHING",
                            (piece.table, piece.interval.name, piece.interval.column, low,
                             high))
            row = cur.execute(f"SELECT version FROM {INTERVALS} WHERE target = %s AND "
                              f"interval = %s FOR UPDATE",
                              (piece.table, piece.interval.name)).fetchone()
            if row is not None:
                locked[piece.table, piece.interval.name] = int(row[0])
        missing = [p for p in pieces if (p.table, p.interval.name) not in locked]
        if missing:
            con.rollback()
            raise IntervalNotSealed(not_sealed(missing) if not_sealed else
                                    _not_sealed(missing))
        tables = sorted({p.table for p in pieces})  # step 2, in one order for every writer
        cur.execute(f"LOCK TABLE {', '.join(qualified(t) for t in tables)} "
                    f"IN SHARE ROW EXCLUSIVE MODE")
        for piece, stage in zip(pieces, stages, strict=True):
            sql, params = piece.interval.predicate()
            outside = cur.execute(f"SELECT count(*) FROM {qualified(stage)} WHERE NOT "
                                  f"({sql})", params).fetchone()  # step 3
            if outside and outside[0]:
                con.rollback()
                raise StagedRowsOutside(
                    f"{outside[0]} rebuilt row(s) for {piece.table} lie outside interval "
                    f"{piece.interval.name!r} ({piece.interval.column} {piece.interval.low}.."
                    f"{piece.interval.high}); nothing was replaced")
            done.append(_replace_one(cur, piece, stage,
                                     locked[piece.table, piece.interval.name]))
    if before_commit is not None:
        before_commit(con)
    con.commit()  # step 6
    return done


def _replace_one(cur: psycopg.Cursor, piece: Slice, stage: str, version: int) -> Replaced:
    """Step 4 and 5 for one slice."""
    target = qualified(piece.table)
    where, params = piece.replaceable()
    before = _count(cur, piece)
    deleted = cur.execute(f"DELETE FROM {target} WHERE {where}", params).rowcount
    columns = [r[0] for r in cur.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum", (target,)).fetchall()]
    names = ", ".join(ident(c) for c in columns)
    staged_rows = cur.execute(f"SELECT count(*) FROM {qualified(stage)}").fetchone()
    staged_n = int(staged_rows[0]) if staged_rows else 0
    insert = f"INSERT INTO {target} AS t ({names}) SELECT {names} FROM {qualified(stage)}"
    if piece.key:
        keys = ", ".join(ident(k) for k in piece.key)
        sets = ", ".join(f"{ident(c)} = excluded.{ident(c)}" for c in columns
                         if c not in piece.key)
        column = ident(piece.interval.column)
        # a row of an earlier interval is replaced; one of a later interval is newer: kept
        insert += (f" ON CONFLICT ({keys}) DO UPDATE SET {sets} WHERE "
                   f"t.{column} < %s")
        guard: tuple[object, ...] = (piece.interval.low,)
        if piece.newer is not None:  # and so is one written after the rebuild's source
            insert += f" AND t.{ident(piece.newer[0])} <= %s"
            guard = (*guard, piece.newer[1])
        inserted = cur.execute(insert, guard).rowcount
    else:
        inserted = cur.execute(insert).rowcount
    after = _count(cur, piece)
    low, high = piece.interval.bounds()
    cur.execute(f"UPDATE {INTERVALS} SET version = version + 1, source = 'backfill', rows = %s, "
                f"replaced_at = now(), bound_column = %s, low = %s, high = %s WHERE target = %s "
                f"AND interval = %s", (after, piece.interval.column, low, high, piece.table,
                                       piece.interval.name))  # step 5
    return Replaced(piece.table, piece.interval.name, version + 1, before, deleted, inserted,
                    staged_n - inserted, after)


def _not_sealed(missing: list[Slice]) -> str:
    names = ", ".join(f"{p.interval.name!r} of {p.table}" for p in missing)
    return (f"refusing to backfill {names}: the stream has not finished loading it (no row in "
            f"{INTERVALS}); wait until it has, then run the backfill again. Nothing was changed")
