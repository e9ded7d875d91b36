"""Cached moves: a fragment copied into another engine is kept and brought up to date, not rebuilt.

A cached copy carries a note (its table comment, written in the same transaction as its rows)
naming its source query and a small JSON *watermark* that says how far the copy reaches:

- a copy of a **growing** fragment (``incremental_by``: ``_batch_id``) records ``hi``, the
  largest batch-id it holds. An engine stream only grows and loses its oldest batches; a
  PostgreSQL table fed by a sink (``migrators.engine_to_postgres`` with
  ``batch_column="_batch_id"``, append mode) only grows, and its sink's row in
  ``sstore.watermarks`` says how far it reaches. What changed since the copy is then "the
  batches after ``hi``" (and, for a stream, the batches that left it): the freshness check is
  one small question to each engine, priced by what changed (``changes``), and the refresh
  copies only the new batches (``refresh``), deleting the dropped ones in the same transaction.
- a copy of any other table records its source's fingerprint (count and order-independent
  hash): the check is a scan of the source, priced as one, and a changed source is copied again.

The refresh always asks the source again, at execution time: a batch that arrived after
planning is copied too, so a cached plan never answers with fewer rows than the source holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from sstore.polystore.connectors import CACHE_NOTE, CacheMoved, Connector, Growth
from sstore.polystore.plan import Move
from sstore.polystore.sqltext import DIALECTS, parse, to_sql


@dataclass(frozen=True)
class Changes:
    """What the planner learns about one cached move before pricing it."""

    cached_rows: int   # rows of the source the copy already holds, up to date
    new_rows: int      # rows the refresh would copy (all of them when the copy is unusable)


@dataclass(frozen=True)
class Refresh:
    """What one ``refresh`` did: ``copied`` rows moved, ``rebuilt`` when the whole source was
    copied again (no usable copy), else only the new batches (or nothing) were."""

    copied: int
    rebuilt: bool


def _base(move: Move) -> str:
    return f"{CACHE_NOTE}{move.source}: {move.sql}"


def note_text(move: Move, mark: dict[str, Any]) -> str:
    return f"{_base(move)} @ {json.dumps(mark, sort_keys=True)}"


def parse_note(note: str) -> tuple[str, str, dict[str, Any]] | None:
    """(source engine, source query, watermark) of a copy's note; None when it is not one
    ``note_text`` wrote."""
    if not note.startswith(CACHE_NOTE):
        return None
    source, sep, rest = note[len(CACHE_NOTE):].partition(": ")
    sql, at, text = rest.rpartition(" @ ")
    if not sep or not at:
        return None
    try:
        mark = json.loads(text)
    except ValueError:
        return None
    return (source, sql, mark) if isinstance(mark, dict) else None


def read_mark(move: Move, target: Probed, note: str | None = None) -> dict[str, Any] | None:
    """The copy's watermark, when the target holds a copy of this very move (same source and
    query); None otherwise (no copy, a copy of something else, or an older note format).
    ``note``: the copy's note, if the caller has read it already."""
    if note is None:
        note = target.cache_note(move.table)
    prefix = _base(move) + " @ "
    if note is None or not note.startswith(prefix):
        return None
    try:
        mark = json.loads(note[len(prefix):])
    except ValueError:
        return None
    return mark if isinstance(mark, dict) else None


class Probed(Protocol):
    """What ``changes`` asks of an engine: a ``Connector``, or a ``probes.ProbeView`` that
    answers from one batched question."""

    def cache_note(self, table: str) -> str | None: ...
    def growth_since(self, sql: str, column: str, after: Any) -> Growth | None: ...
    def fingerprint(self, sql: str) -> str: ...


def changes(move: Move, source: Probed, target: Probed) -> Changes:
    """How much of ``move`` the target's copy already holds, asked of both engines."""
    if move.cache_key is None:
        return Changes(0, move.rows)
    mark = read_mark(move, target)
    if mark is None:
        return Changes(0, move.rows)
    if move.incremental_by is None:
        fingerprint = source.fingerprint(move.sql)
        if mark.get("fp") != fingerprint:
            return Changes(0, move.rows)
        return Changes(int(fingerprint.split(":", 1)[0]), 0)
    growth = source.growth_since(move.sql, move.incremental_by, mark.get("hi"))
    if growth is None or not _continues(mark, growth):
        return Changes(0, move.rows)
    new = growth.rows_since(mark)
    return Changes(max(0, growth.total - new), new)


def refresh(move: Move, source: Connector, target: Connector) -> Refresh:
    """Bring the cached copy of ``move`` up to date, incrementally where it can. A top-up is
    conditional on the copy's note being the one read here; when another process or thread
    changed the copy in between (``CacheMoved``), the refresh starts over from the new note."""
    for _attempt in range(4):
        try:
            return _refresh_once(move, source, target)
        except CacheMoved:
            continue
    return _refresh_once(move, source, target)


def _refresh_once(move: Move, source: Connector, target: Connector) -> Refresh:
    column = move.incremental_by
    note = target.cache_note(move.table)
    mark = read_mark(move, target, note)
    if column is None:
        fingerprint = source.fingerprint(move.sql)
        if mark is not None and mark.get("fp") == fingerprint:
            return Refresh(0, False)
        rows = source.fetch(move.sql)
        target.store(move.table, rows, mode="replace", note=note_text(move, {"fp": fingerprint}))
        return Refresh(rows.num_rows, True)
    hi = None if mark is None else mark.get("hi")
    growth = source.growth_since(move.sql, column, hi)
    if (growth is not None and growth.low is None and mark is not None and mark.get("empty")
            and mark.get("origin") == growth.origin):
        return Refresh(0, False)  # an empty source, and its copy is empty too
    if growth is None or not _continues(mark, growth):
        # no usable copy, a source that restarted, or one that is empty now (its batches were
        # all dropped): copy it whole
        rows = source.fetch(move.sql)
        mark = _mark(rows, column, None, growth) if growth is not None else {"hi": None}
        target.store(move.table, rows, mode="replace", note=note_text(move, mark))
        return Refresh(rows.num_rows, True)
    assert mark is not None
    if growth.rows_since(mark) == 0 and growth.low == mark.get("lo"):
        return Refresh(0, False)
    rows = source.fetch(_rows_after(move, source, column, hi))
    target.store(move.table, rows, mode="append", delete_below=(column, growth.low),
                 note=note_text(move, _mark(rows, column, hi, growth)), expect_note=note)
    return Refresh(rows.num_rows, False)


def _mark(rows: pa.Table, column: str, hi: Any, growth: Growth) -> dict[str, Any]:
    """The copy's new watermark: the largest batch-id it holds now, taken from the rows copied
    (not from the question asked before: a batch that committed in between is in the rows),
    the lowest batch-id its source held, and the source table's identity (``origin``)."""
    top = pc.max(rows[column]).as_py() if rows.num_rows else None
    return {"hi": top if top is not None else hi, "lo": growth.low, "origin": growth.origin,
            "total": growth.total, "empty": hi is None and rows.num_rows == 0}


def _continues(mark: dict[str, Any] | None, growth: Growth) -> bool:
    """Can the copy be topped up from ``growth``? Not when there is no copy or it reaches no
    batch, when the source is empty now, when the source's newest batch is older than the
    copy's (the source restarted its batch-ids), nor when a sink-fed table was recreated or
    truncated since the copy (another ``origin``: its relfilenode)."""
    if mark is None or mark.get("hi") is None or growth.low is None:
        return False
    if growth.high is not None and growth.high < mark["hi"]:
        return False
    return bool(mark.get("origin") == growth.origin)


def _rows_after(move: Move, source: Connector, column: str, value: object) -> str:
    """The move's query restricted to rows whose growing column is past ``value``."""
    dialect = DIALECTS[source.kind]
    tree = parse(move.sql, dialect)
    assert isinstance(tree, exp.Select)
    return to_sql(tree.where(exp.GT(this=exp.column(column, quoted=True),
                                    expression=exp.convert(value))), dialect)
