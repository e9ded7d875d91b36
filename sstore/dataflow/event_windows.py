"""Event-time windows: tumbling and sliding windows over a timestamp column, per key, closed by
a watermark derived from the data, with a declared policy for late rows.

``Engine.event_window(name, source, time=..., size=..., slide=..., key=[...], delay=...,
allowed_lateness=..., aggregates={...})`` declares one. Every batch ``b`` appended to
``source`` (an ingest, or a procedure's output) feeds it inside that same transaction and
appends batch ``b`` to two streams:

- ``name``: one row per window that closed or was corrected by batch ``b`` (the key columns,
  ``window_start``, ``window_end``, ``revision``, then the declared aggregates), in the order
  of window end, then key. Procedures take it as input like any stream, so each close is part
  of exactly one transaction execution, in batch order; sinks, subscribers and consumers work
  on it unchanged.
- ``name__late``: the rows of ``b`` that came too late for their windows, with the source's
  columns (kept until a reader has taken them: ``retain="all"``).

Semantics (times are integers here: microseconds since the epoch for TIMESTAMP and TIMESTAMPTZ
columns, the column's own unit for integer columns):

- Windows are ``[start, start + size)`` with ``start`` a multiple of ``slide`` (tumbling:
  ``slide == size``), one series per key. A row is in every window that contains its time.
- The watermark is ``max(event time seen) - delay``, over every row the window accepted, all
  keys together; it never goes back. It moves at the end of each batch: rows are judged
  against the watermark as it was before their batch, so the order of rows inside a batch
  never matters.
- A window closes when the watermark reaches its end: it fires (revision 1) in the batch
  that moved the watermark there, if it holds a row. It is finalized (its rows and its revision
  counter are dropped) once the watermark reaches ``end + allowed_lateness``.
- A row whose windows are all still open, or closed but not finalized, enters them all; a
  closed window it enters fires again in its batch, with ``revision + 1`` and aggregates over
  all its rows (a correction that replaces the earlier row). A row whose oldest window is
  finalized enters none of them and goes whole to ``name__late``: every row is either in all
  of its windows or in the late stream, never dropped.
- A row without an event time (NULL) makes the batch fail with ``SchemaError``, like any row
  that does not fit its stream: an ingest changes nothing, a procedure's execution fails and
  its error policy (halt, dead letter) applies.

Why aggregates and not the rows: a window's rows must be kept until it is finalized anyway (a
late row changes the result), so the engine keeps them once, in ``name__state``, and a fired
window is a single row computed by set-oriented SQL over them; a correction is a whole new row
(same key and window_start, higher revision) that a consumer upserts. A procedure that wants
the rows themselves declares ``list(...)`` or ``list(struct_pack(...))`` as an aggregate.

State, all in DuckDB and written in the transaction of the source batch (so recovery needs
nothing of its own, in both durability modes): ``name__state`` (the rows of windows not yet
finalized, with their time as ``_sstore_t``), ``name__fired`` (the revision of each fired,
not yet finalized window) and a row of ``sstore_sys.event_windows`` (watermark, maximum time,
counts of rows taken in and found late, the declaration).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from sstore.base.duck import execute, registered
from sstore.base.errors import DeclarationError, SchemaError
from sstore.base.sql import ident
from sstore.dataflow.graph import EventWindowDecl, Graph

TIMESTAMP_TYPES = ("TIMESTAMP", "TIMESTAMP WITH TIME ZONE")
INTEGER_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER")
MAX_WINDOWS_PER_ROW = 1000  # size / slide: each row is in that many windows
NO_WATERMARK = -(2 ** 62)  # "before any event time" in the SQL below
INPUT = "sstore_ev_in"
FIRED = "sstore_ev_fired"

DDL = """CREATE TABLE IF NOT EXISTS sstore_sys.event_windows (
    name VARCHAR PRIMARY KEY, spec VARCHAR NOT NULL, watermark BIGINT, max_time BIGINT,
    rows_in BIGINT NOT NULL DEFAULT 0, rows_late BIGINT NOT NULL DEFAULT 0)"""

Duration = int | datetime.timedelta | str


# ------------------------------------------------------------------------------ declaring
def declare(con: duckdb.DuckDBPyConnection, graph: Graph, name: str, source: str, *,
            time: str, size: Duration, slide: Duration | None = None,
            key: str | Sequence[str] = (), delay: Duration = 0,
            allowed_lateness: Duration = 0, aggregates: Mapping[str, str] | None = None,
            retain: str = "latest") -> EventWindowDecl:
    """Check an event window's declaration against its source and DuckDB; return it.

    The aggregates are compiled here, on empty tables of the source's types, so that a wrong
    column or a non-aggregate expression fails at declaration, not inside a transaction."""
    where = f"event window {name!r}"
    decl = graph.streams.get(source)
    if decl is None or decl.columns is None:
        raise DeclarationError(f"{where}: its source {source!r} must be a stream declared "
                               f"before it, with its columns")
    columns = _plain_types(con, decl.columns)
    keys = (key,) if isinstance(key, str) else tuple(key)
    for column in (time, *keys):
        if column not in columns:
            raise DeclarationError(f"{where}: {source!r} has no column {column!r} "
                                   f"(columns: {', '.join(columns)})")
    if len(set(keys)) != len(keys) or time in keys:
        raise DeclarationError(f"{where}: key columns must be distinct and not the time column")
    if any(c.startswith("_sstore") for c in columns):
        raise DeclarationError(f"{where}: column names starting with _sstore are reserved")
    time_type = columns[time]
    if time_type not in TIMESTAMP_TYPES + INTEGER_TYPES:
        raise DeclarationError(f"{where}: time column {time!r} is {time_type}; it must be "
                               f"TIMESTAMP, TIMESTAMPTZ or an integer type up to BIGINT")

    def unit(value: Duration, what: str) -> int:
        return _duration(con, value, time_type, f"{where}: {what}")

    n_size = unit(size, "size")
    n_slide = n_size if slide is None else unit(slide, "slide")
    n_delay, n_late = unit(delay, "delay"), unit(allowed_lateness, "allowed_lateness")
    if not 0 < n_slide <= n_size:
        raise DeclarationError(f"{where}: need 0 < slide <= size (a slide longer than the "
                               f"window would leave rows in no window)")
    if n_size // n_slide > MAX_WINDOWS_PER_ROW:
        raise DeclarationError(f"{where}: size / slide is {n_size // n_slide}; at most "
                               f"{MAX_WINDOWS_PER_ROW} windows per row")
    if n_delay < 0 or n_late < 0:
        raise DeclarationError(f"{where}: delay and allowed_lateness must be >= 0")
    aggs = tuple((dict(aggregates) if aggregates is not None else {"rows": "count(*)"}).items())
    fixed = {*keys, "window_start", "window_end", "revision"}
    for column, expression in aggs:
        if not isinstance(column, str) or not column or column in fixed \
                or column.startswith("_sstore") or not isinstance(expression, str):
            raise DeclarationError(f"{where}: aggregate {column!r} must be a new column name "
                                   f"(not a key, window_start, window_end or revision) with "
                                   f"an SQL expression")
    draft = EventWindowDecl(name, source, time, time_type, n_size, n_slide, keys, n_delay,
                            n_late, aggs, tuple(columns.items()), (), retain)
    return dataclasses.replace(draft, output=_output_types(con, draft))


def _plain_types(con: duckdb.DuckDBPyConnection, declared: Mapping[str, str]
                 ) -> dict[str, str]:
    """The source's column types as DuckDB names them, without constraints (NOT NULL,
    CHECK): from a temporary table made with the declared definitions."""
    cols = ", ".join(f"{ident(c)} {t}" for c, t in declared.items())
    con.execute(f"CREATE OR REPLACE TEMP TABLE sstore_ev_probe ({cols})")
    try:
        return {r[0]: r[1] for r in con.execute("DESCRIBE sstore_ev_probe").fetchall()}
    finally:
        con.execute("DROP TABLE IF EXISTS temp.sstore_ev_probe")


def _duration(con: duckdb.DuckDBPyConnection, value: Duration, time_type: str,
              what: str) -> int:
    """A size, slide, delay or lateness in the time column's unit (microseconds for
    timestamps: a ``timedelta`` or an interval string such as "5 minutes")."""
    if time_type in INTEGER_TYPES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise DeclarationError(f"{what}: the time column is an integer, so give an "
                                   f"integer in its unit, not {value!r}")
        return value
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(microseconds=1)
    if isinstance(value, str):
        try:
            months, micros = con.execute(
                "SELECT datepart('year', ?::INTERVAL) * 12 + datepart('month', ?::INTERVAL), "
                "epoch_us(?::INTERVAL)", [value] * 3).fetchall()[0]
        except duckdb.Error as exc:
            raise DeclarationError(f"{what}: {value!r} is not an interval ({exc})") from exc
        if months:
            raise DeclarationError(f"{what}: {value!r} has months or years, which have no "
                                   f"fixed length; give days or less")
        return int(micros)
    if value == 0 and not isinstance(value, bool):
        return 0
    raise DeclarationError(f"{what}: the time column is a timestamp, so give a "
                           f"datetime.timedelta or an interval string like '5 minutes', "
                           f"not {value!r}")


def _output_types(con: duckdb.DuckDBPyConnection, decl: EventWindowDecl
                  ) -> tuple[tuple[str, str], ...]:
    """The output stream's columns: compile the firing query over empty temporary tables."""
    state, fired = "sstore_ev_probe_state", "sstore_ev_probe_fired"
    con.execute(f"CREATE OR REPLACE TEMP TABLE {state} ({_state_columns(decl)})")
    con.execute(f"CREATE OR REPLACE TEMP TABLE {fired} ({_fired_columns(decl)})")
    con.execute(f"CREATE OR REPLACE TEMP TABLE sstore_ev_probe_in "
                f"({', '.join(f'{ident(c)} {t}' for c, t in decl.columns)})")
    try:
        sql = _firing_sql(decl, state, fired, "sstore_ev_probe_in")
        con.execute(f"CREATE OR REPLACE TEMP TABLE sstore_ev_probe_out AS {sql}",
                    {"wm_old": 0, "wm_new": 0})
        described = con.execute("DESCRIBE sstore_ev_probe_out").fetchall()
    except duckdb.Error as exc:
        raise DeclarationError(f"event window {decl.name!r}: its aggregates "
                               f"{dict(decl.aggregates)} do not compile over the rows of "
                               f"{decl.source!r}: {exc}") from exc
    finally:
        for table in (state, fired, "sstore_ev_probe_in", "sstore_ev_probe_out"):
            con.execute(f"DROP TABLE IF EXISTS temp.{table}")
    return tuple((n, t) for n, t, *_ in described if n != "_sstore_ws")


# ------------------------------------------------------------------------------ SQL pieces
def _time_us(decl: EventWindowDecl, column: str) -> str:
    """SQL: the event time of a row of the source as BIGINT."""
    if decl.time_type in TIMESTAMP_TYPES:
        return f"epoch_us({column})"
    return f"{column}::BIGINT"


def _time_of(decl: EventWindowDecl, expr: str) -> str:
    """SQL: a BIGINT time back in the time column's type (for window_start/window_end)."""
    if decl.time_type == "TIMESTAMP":
        return f"make_timestamp({expr})"
    if decl.time_type == "TIMESTAMP WITH TIME ZONE":
        return f"timezone('UTC', make_timestamp({expr}))"
    return f"({expr})::{decl.time_type}"


def _floor(expr: str, step: int) -> str:
    """SQL: the largest multiple of ``step`` at or below ``expr`` (also below zero)."""
    return f"(({expr}) - ((({expr}) % {step}) + {step}) % {step})"


def _first_start(decl: EventWindowDecl, t: str) -> str:
    """SQL: the start of the oldest window containing time ``t``."""
    return f"({_floor(f'{t} - {decl.size}', decl.slide)} + {decl.slide})"


def _late(decl: EventWindowDecl, t: str, wm: str = "$wm_old::BIGINT") -> str:
    """SQL: true when the oldest window of time ``t`` is finalized under watermark ``wm``
    (the watermark before this batch, ``$wm_old``; NULL before any row)."""
    gone = decl.size + decl.allowed_lateness
    return f"({wm} IS NOT NULL AND {_first_start(decl, t)} + {gone} <= {wm})"


def _state_columns(decl: EventWindowDecl) -> str:
    return ", ".join(["_sstore_t BIGINT"] + [f"{ident(c)} {t}" for c, t in decl.columns])


def _fired_columns(decl: EventWindowDecl) -> str:
    types = dict(decl.columns)
    keys = [f"_sstore_k{i} {types[k]}" for i, k in enumerate(decl.key)]
    return ", ".join(keys + ["_sstore_ws BIGINT", "revision INTEGER"])


def _windows_of(decl: EventWindowDecl, relation: str, t: str, where: str, first: str,
                last: str) -> str:
    """SQL: (keys as _sstore_k<i>, _sstore_ws) of the windows containing each row whose
    start is between ``first`` and ``last`` (only those are generated: usually one or none
    per row, however many windows a row is in)."""
    keys = "".join(f"{ident(k)} AS _sstore_k{i}, " for i, k in enumerate(decl.key))
    starts = (f"generate_series(greatest({_first_start(decl, t)}, {first}), "
              f"least({_floor(t, decl.slide)}, {last}), {decl.slide})")
    return f"SELECT {keys}unnest({starts}) AS _sstore_ws FROM {relation} WHERE {where}"


def _firing_sql(decl: EventWindowDecl, state: str, fired: str, new_rows: str) -> str:
    """SQL: the windows that fire in this batch, with their revision and aggregates.

    Two kinds, after the batch's accepted rows are in ``state``: windows the watermark passed
    in this batch (end in ($wm_old, $wm_new]) and closed windows that took rows of this batch
    (end <= $wm_new). A window fires only when it holds a row (windows are made by rows)."""
    size = decl.size
    t_new = _time_us(decl, ident(decl.time))
    k = [f"_sstore_k{i}" for i in range(len(decl.key))]
    e_keys = "".join(f"e.{c}, " for c in k)
    old = f"coalesce($wm_old::BIGINT, {NO_WATERMARK})"
    closed = _floor(f"$wm_new::BIGINT - {size}", decl.slide)  # the newest start with end <= new
    first_new = f"{_floor(f'{old} - {size}', decl.slide)} + {decl.slide}"  # oldest, end > old
    touched = _windows_of(decl, new_rows, t_new, f"NOT {_late(decl, t_new)}", str(NO_WATERMARK),
                          closed)
    closing = _windows_of(decl, state, "_sstore_t",
                          f"_sstore_t > {old} - {size} AND _sstore_t < $wm_new::BIGINT",
                          first_new, closed)
    key_match = "".join(f" AND r.{ident(key)} IS NOT DISTINCT FROM e.{c}"
                        for key, c in zip(decl.key, k))
    fired_match = "".join(f" AND f.{c} IS NOT DISTINCT FROM e.{c}" for c in k)
    outputs = "".join(f"e.{c} AS {ident(key)}, " for key, c in zip(decl.key, k))
    aggs = "".join(f", {expr} AS {ident(col)}" for col, expr in decl.aggregates)
    order = ", ".join(["e._sstore_ws"] + [f"e.{c}" for c in k])
    return f"""
        WITH e AS ({touched} UNION {closing}),
        f AS (SELECT {''.join(f'{c}, ' for c in k)}_sstore_ws, max(revision) AS revision
              FROM {fired} GROUP BY ALL)
        SELECT {outputs}{_time_of(decl, 'e._sstore_ws')} AS window_start,
               {_time_of(decl, f'e._sstore_ws + {size}')} AS window_end,
               (coalesce(f.revision, 0) + 1)::INTEGER AS revision{aggs},
               e._sstore_ws AS _sstore_ws
        FROM e JOIN {state} r ON r._sstore_t >= e._sstore_ws
                                AND r._sstore_t < e._sstore_ws + {size}{key_match}
        LEFT JOIN f ON f._sstore_ws = e._sstore_ws{fired_match}
        GROUP BY {e_keys}e._sstore_ws, f.revision
        ORDER BY {order}"""


def _first_start_of(decl: EventWindowDecl, t: int) -> int:
    """``_first_start`` in Python (its ``//`` floors below zero too)."""
    return (t - decl.size) // decl.slide * decl.slide + decl.slide


def _crossed(decl: EventWindowDecl, old: int | None, new: int, offset: int) -> bool:
    """Whether a window start ``s`` has ``old < s + offset <= new``: some window's end
    (``offset`` = size) or finalization (size + allowed_lateness) came with this batch."""
    if old is None:
        return True
    return (new - offset) // decl.slide > (old - offset) // decl.slide


# ------------------------------------------------------------------------------ running
def state_table(decl: EventWindowDecl) -> str:
    return decl.name + "__state"


def fired_table(decl: EventWindowDecl) -> str:
    return decl.name + "__fired"


def create(con: duckdb.DuckDBPyConnection, decl: EventWindowDecl) -> None:
    """Create the window's state (at engine start); refuse a declaration that differs from
    the one this state file was fed with (its state would mean something else)."""
    con.execute(DDL)
    con.execute(f"CREATE TABLE IF NOT EXISTS {ident(state_table(decl))} "
                f"({_state_columns(decl)})")
    con.execute(f"CREATE TABLE IF NOT EXISTS {ident(fired_table(decl))} "
                f"({_fired_columns(decl)})")
    spec = json.dumps(decl.spec(), sort_keys=True)
    found = con.execute("SELECT spec FROM sstore_sys.event_windows WHERE name = ?",
                        [decl.name]).fetchall()
    if not found:
        con.execute("INSERT INTO sstore_sys.event_windows (name, spec) VALUES (?, ?)",
                    [decl.name, spec])
    elif found[0][0] != spec:
        raise DeclarationError(
            f"event window {decl.name!r} is declared differently from the one this state "
            f"file was fed with: before {found[0][0]}, now {spec}. Its windows and watermark "
            f"would not mean the same; declare it as before, or under a new name")


@dataclass(frozen=True)
class Fed:
    """What one source batch did: the windows it fired and the rows it found late."""

    fired: pa.Table | None  # None: nothing fired (the caller appends an empty batch)
    late: pa.Table | None


def feed(con: duckdb.DuckDBPyConnection, decl: EventWindowDecl, batch_id: int,
         rows: pa.Table) -> Fed:
    """Feed batch ``batch_id`` of the source (inside the caller's transaction).

    An empty batch costs nothing. Otherwise: one statement reads the watermark and checks
    the batch against it, one stores its accepted rows, one updates the watermark and the
    counts; only when needed (decided in Python from the watermark and the batch's oldest
    accepted time), one computes the windows that fire and one records their revisions, one
    selects the late rows, two drop the windows finalized. In time order most batches need
    none of these."""
    if not rows.num_rows:
        return Fed(None, None)
    t = _time_us(decl, ident(decl.time))
    name, state, fired = decl.name, ident(state_table(decl)), ident(fired_table(decl))
    with registered(con, INPUT, rows):
        late_now = _late(decl, t, "w.watermark")
        wm_old, max_old, nulls, max_t, n_late, oldest = execute(
            con,
            f"SELECT w.watermark, w.max_time, count(*) FILTER ({t} IS NULL), max({t}), "
            f"count(*) FILTER ({t} IS NOT NULL AND {late_now}), "
            f"min({t}) FILTER (NOT {late_now}) "
            f"FROM {INPUT}, sstore_sys.event_windows w WHERE w.name = ? "
            f"GROUP BY w.watermark, w.max_time", [name]).fetchall()[0]
        if nulls:
            raise SchemaError(
                f"event window {name!r}: {nulls} row(s) of batch {batch_id} of "
                f"{decl.source!r} have no event time ({decl.time!r} is NULL); the batch is "
                f"refused (filter such rows before the window, e.g. in a cleaning procedure)")
        max_new = max_t if max_old is None else max(max_old, max_t)
        wm_new = max_new - decl.delay
        params = {"wm_old": wm_old, "wm_new": wm_new}
        cols = ", ".join(ident(c) for c, _ in decl.columns)
        if n_late < rows.num_rows:
            execute(con, f"INSERT INTO {state} SELECT {t}, {cols} FROM {INPUT} "
                         f"WHERE NOT {_late(decl, t)}", {"wm_old": wm_old})
        out: pa.Table | None = None
        corrects = oldest is not None and _first_start_of(decl, oldest) + decl.size <= wm_new
        if corrects or _crossed(decl, wm_old, wm_new, decl.size):
            out = con.sql(_firing_sql(decl, state, fired, INPUT), params=params).to_arrow_table()
        late = None
        if n_late:
            late = con.sql(f"SELECT {cols} FROM {INPUT} WHERE {_late(decl, t)}",
                           params={"wm_old": wm_old}).to_arrow_table()
    if out is not None:
        if out.num_rows:
            keys = "".join(f"{ident(k)}, " for k in decl.key)
            with registered(con, FIRED, out):
                execute(con, f"INSERT INTO {fired} SELECT {keys}_sstore_ws, revision "
                             f"FROM {FIRED}")
        out = out.drop_columns(["_sstore_ws"])
    gone = decl.size + decl.allowed_lateness
    if _crossed(decl, wm_old, wm_new, gone):
        con.execute(f"DELETE FROM {fired} WHERE _sstore_ws + {gone} <= ?", [wm_new])
        con.execute(f"DELETE FROM {state} WHERE {_floor('_sstore_t', decl.slide)} + {gone} "
                    f"<= ?", [wm_new])
    execute(con, "UPDATE sstore_sys.event_windows SET watermark = ?, max_time = ?, "
                 "rows_in = rows_in + ?, rows_late = rows_late + ? WHERE name = ?",
            [wm_new, max_new, rows.num_rows, n_late, name])
    return Fed(out, late)


