"""Cached moves: a fragment copied into another engine is kept and reused while it is valid.

A cached copy carries a note (its table comment) naming its source query, and, for a copy of a
table that can change anywhere, a fingerprint of the source rows (count and an order-independent
hash). Valid means: same source query and, for a fingerprinted copy, the same fingerprint. An
append-only engine stream (``incremental_by``: ``_batch_id``) is kept up to date instead: rows of
batches that have left the source are deleted from the copy, newer batches are appended, so a
repeated query pays only for what arrived since.
"""

from __future__ import annotations

from sqlglot import exp

from sstore.polystore.connectors import CACHE_NOTE, Connector
from sstore.polystore.plan import Move
from sstore.polystore.sqltext import DIALECTS, parse, to_sql


def _note(move: Move, fingerprint: str | None) -> str:
    base = f"{CACHE_NOTE}{move.source}: {move.sql}"
    return base if fingerprint is None else f"{base} @ {fingerprint}"


def valid_rows(move: Move, source: Connector, target: Connector) -> int:
    """Rows of ``move`` the target already holds, up to date (0: none or stale)."""
    if move.cache_key is None:
        return 0
    state = target.cache_state(move.table, move.incremental_by)
    if state is None:
        return 0
    if move.incremental_by is not None:
        return state.rows if state.note == _note(move, None) else 0
    return state.rows if state.note == _note(move, source.fingerprint(move.sql)) else 0


def refresh(move: Move, source: Connector, target: Connector) -> int:
    """Bring the cached copy of ``move`` up to date; return the rows copied."""
    column = move.incremental_by
    if column is None:
        fingerprint = source.fingerprint(move.sql)
        state = target.cache_state(move.table, None)
        note = _note(move, fingerprint)
        if state is not None and state.note == note:
            return 0
        return target.store(move.table, source.fetch(move.sql), mode="replace", note=note)
    note = _note(move, None)
    state = target.cache_state(move.table, column)
    low, _high, _count = source.growth(move.sql, column)
    if state is None or state.note != note or state.max_growing is None or low is None:
        # no usable copy, or the source is empty now (its batches were all dropped)
        return target.store(move.table, source.fetch(move.sql), mode="replace", note=note)
    newer = _rows_after(move, source, column, state.max_growing)
    rows = source.fetch(newer)
    return target.store(move.table, rows, mode="append",
                        delete_below=(column, low) if low is not None else None)


def _rows_after(move: Move, source: Connector, column: str, value: object) -> str:
    """The move's query restricted to rows whose growing column is past ``value``."""
    dialect = DIALECTS[source.kind]
    tree = parse(move.sql, dialect)
    assert isinstance(tree, exp.Select)
    return to_sql(tree.where(exp.GT(this=exp.column(column, quoted=True),
                                    expression=exp.convert(value))), dialect)
