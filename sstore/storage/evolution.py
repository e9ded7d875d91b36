"""Evolving a stream on a running state file: its table changes, its history is recorded.

A program redeclares its streams at every start. Before issue 38 a stream whose declaration
differed from its table in any way was refused, so the only way to add a column was a new
state file. Now a redeclaration is compared with the table (``plan``):

- the same columns (as DuckDB's catalog spells the types): nothing to do, no statement;
- the same columns with new ones appended, and/or a stored column *widened* (``widens``:
  a wider integer, ``DECIMAL(p,s) -> DECIMAL(p',s)`` with ``p' > p``): an **evolution**. The
  table gains the new columns (existing rows get NULL, or the ``DEFAULT`` the declaration
  gives) and the widened columns are altered; rows keep their values exactly;
- anything else (another kind of type, a narrowing, ``REAL -> DOUBLE`` whose stored values
  would read as other numbers, a reorder, a dropped or renamed column) is refused with a
  ``DeclarationError`` that names the explicit call which does it on purpose:
  ``Engine.evolve(stream, rename=..., drop=..., cast=...)``, applied before the comparison.

Every evolution of one start runs in ONE DuckDB transaction together with its version records
(``sstore_sys.stream_versions``: stream, version, columns, first_batch, change) and the rest of
the start (``versioned.start_transaction``): a crash (SIGKILL, crash points
``evolve.before_commit``, ``start.before_commit``) or a start refused after the evolution was
accepted (an event window declared differently, a switch that cannot be recorded) leaves the
old tables and no record, or the start succeeded with the new tables and their records, never
half: the program before it still starts on the file. ``first_batch`` is the first batch-id
that carries the version: the one after the newest the stream has had. Version 1 (the columns
before the first evolution) is recorded with it, so a stream that never evolved has no rows
here.

Windows over an evolved stream get the same change on their rows table (their view is made
again at every start from the declared columns). Nothing here runs per batch: procedures see
the new columns because the stream's Arrow schema is read from its table after this.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from sstore.base.errors import DeclarationError
from sstore.base.fingerprint import fingerprint
from sstore.base.sql import ident
from sstore.dataflow.graph import Graph
from sstore.dataflow.table_declarations import column_types
from sstore.storage import versioned

VERSIONS = "sstore_sys.stream_versions"
VERSIONS_DDL = f"""
CREATE TABLE IF NOT EXISTS {VERSIONS} (
    stream VARCHAR NOT NULL, version INTEGER NOT NULL, columns VARCHAR NOT NULL,
    first_batch BIGINT NOT NULL, change VARCHAR NOT NULL,
    evolved_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp,
    PRIMARY KEY (stream, version))
"""
BATCH_COLUMN = "_batch_id"

_SIGNED = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT")
_UNSIGNED = ("UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT")
_DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")

Columns = list[tuple[str, str]]


@dataclass(frozen=True)
class Explicit:
    """What ``Engine.evolve`` asked for one stream: applied to the stored columns, in this
    order, before the declaration is compared with them."""

    rename: Mapping[str, str] = field(default_factory=dict)
    drop: Sequence[str] = ()
    #: columns converted to the type the declaration gives them (column -> that type, or
    #: None: the stored values are converted by DuckDB's cast)
    cast: Mapping[str, str | None] = field(default_factory=dict)

    def describe(self) -> list[str]:
        return ([f"rename {a} -> {b}" for a, b in self.rename.items()]
                + [f"drop {c}" for c in self.drop]
                + [f"cast {c}" + (f" to {t}" if t else "") for c, t in self.cast.items()])


@dataclass
class Plan:
    """The statements that evolve one stream's table (``{table}`` stands for the table, so
    they apply to its windows' rows tables too) and the columns it has after them."""

    stream: str
    before: Columns
    after: Columns
    statements: list[str]
    change: list[str]


def widens(was: str, now: str) -> bool:
    """Whether every value of catalog type ``was`` is the same value in type ``now`` and
    reads the same (so a stored column may be altered to it without a word)."""
    if was == now:
        return True
    for chain in (_SIGNED, _UNSIGNED):
        if was in chain and now in chain:
            return chain.index(now) > chain.index(was)
    if was in _UNSIGNED and now in _SIGNED:  # UINTEGER fits BIGINT, not INTEGER
        return _SIGNED.index(now) > _UNSIGNED.index(was)
    old, new = _DECIMAL.fullmatch(was), _DECIMAL.fullmatch(now)
    if old and new:
        return old[2] == new[2] and int(new[1]) > int(old[1])
    return False


def stored_columns(con: duckdb.DuckDBPyConnection, table: str) -> Columns:
    return [(str(c), str(t)) for c, t, *_ in con.execute(f"DESCRIBE {ident(table)}").fetchall()
            if c != BATCH_COLUMN]


def plan(con: duckdb.DuckDBPyConnection, name: str, declared: Mapping[str, str],
         explicit: Explicit | None = None) -> Plan | None:
    """What redeclaring stream ``name`` with ``declared`` does to its existing table: None
    (the same), a ``Plan``, or ``DeclarationError`` (see the module docstring)."""
    stored = stored_columns(con, name)
    if [c for c, _t in stored] == list(declared) and all(
            t.upper() == declared[c].strip().upper() for c, t in stored):
        return None  # spelled as the catalog spells it: no scratch table needed
    wanted = column_types(con, name, declared)
    if wanted == stored:
        return None
    statements: list[str] = []
    change: list[str] = []
    current = list(stored)
    if explicit is not None:
        current = _apply_explicit(con, name, current, dict(wanted), explicit, statements)
        change += explicit.describe()
    now = dict(wanted)
    names = [c for c, _t in current]
    if list(now)[:len(names)] != names:
        _refuse_shape(name, names, list(now))
    for column, was in current:
        if now[column] == was:
            continue
        if not widens(was, now[column]):
            spelled = ("" if now[column] == declared[column].strip().upper()
                       else f" ({now[column]})")
            raise DeclarationError(
                f"stream {name!r}: column {column!r} is stored as {was} (its table in the "
                f"state) but this program declares it {declared[column]}{spelled}; its rows "
                f"keep the old type and new ones would be cast to it. Declare it as before "
                f"({was}), declare a stream of another name with the new type, or convert the "
                f"stored rows on purpose: Engine.evolve({name!r}, cast={{{column!r}: "
                f"{now[column]!r}}}) before the first ingest or run")
        statements.append(f"ALTER TABLE {{table}} ALTER COLUMN {ident(column)} "
                          f"TYPE {now[column]}")
        change.append(f"widen {column} {was} -> {now[column]}")
    for column in list(now)[len(names):]:
        statements.append(f"ALTER TABLE {{table}} ADD COLUMN {ident(column)} {declared[column]}")
        change.append(f"add {column} {now[column]}")
    return Plan(name, stored, list(now.items()), statements, change)


def _apply_explicit(con: duckdb.DuckDBPyConnection, name: str, current: Columns,
                    wanted: dict[str, str], explicit: Explicit, statements: list[str]
                    ) -> Columns:
    """``explicit``'s renames, drops and casts on ``current`` (statements appended)."""
    def known(column: str, what: str) -> None:
        if column not in dict(current):
            raise DeclarationError(
                f"Engine.evolve({name!r}, {what}): stream {name!r} has no column {column!r} "
                f"(it has {[c for c, _t in current]})")

    for old, new in explicit.rename.items():
        known(old, f"rename={{{old!r}: {new!r}}}")
        if new in dict(current):
            raise DeclarationError(f"Engine.evolve({name!r}, rename={{{old!r}: {new!r}}}): "
                                   f"stream {name!r} has a column {new!r} already")
        statements.append(f"ALTER TABLE {{table}} RENAME COLUMN {ident(old)} TO {ident(new)}")
        current = [(new if c == old else c, t) for c, t in current]
    for column in explicit.drop:
        known(column, f"drop=[{column!r}]")
        statements.append(f"ALTER TABLE {{table}} DROP COLUMN {ident(column)}")
        current = [(c, t) for c, t in current if c != column]
    for column, to in explicit.cast.items():
        known(column, f"cast={{{column!r}: {to!r}}}")
        if column not in wanted:
            raise DeclarationError(f"Engine.evolve({name!r}, cast=[{column!r}]): the "
                                   f"declaration of {name!r} has no column {column!r}")
        if to is not None and column_types(con, name, {column: to})[0][1] != wanted[column]:
            raise DeclarationError(f"Engine.evolve({name!r}, cast={{{column!r}: {to!r}}}): "
                                   f"the declaration gives {column!r} the type "
                                   f"{wanted[column]}; cast to the declared type")
        statements.append(f"ALTER TABLE {{table}} ALTER COLUMN {ident(column)} TYPE "
                          f"{wanted[column]}")
        current = [(c, wanted[c] if c == column else t) for c, t in current]
    return current


def _refuse_shape(name: str, stored: list[str], declared: list[str]) -> None:
    missing = [c for c in stored if c not in declared]
    if missing:
        new = [c for c in declared if c not in stored]
        hint = (f"rename={{{missing[0]!r}: {new[0]!r}}}" if new else f"drop={missing!r}")
        how = f"Engine.evolve({name!r}, {hint})"
    else:
        how = (f"declare the columns in their stored order, new ones at the end; a reorder "
               f"is not an evolution (Engine.evolve({name!r}, rename=..., drop=..., cast=...) "
               f"renames, drops and converts)")
    raise DeclarationError(
        f"stream {name!r} is declared with columns {declared} but the state file has "
        f"{stored}: only new columns appended at the end (or widened types) evolve a stream "
        f"by themselves. To change it on purpose: {how}, before the first ingest or run")


def next_batch(con: duckdb.DuckDBPyConnection, graph: Graph, stream: str) -> int:
    """The first batch-id that will carry a version made now: past every batch ``stream``
    has had (commit records of it and of its producer, collected and compacted ids, rows)."""
    nodes = [stream] + [p for p in [graph.producer_of(stream)] if p is not None]
    found = con.execute(
        f"SELECT greatest(coalesce((SELECT max(batch_id) FROM sstore_sys.commits WHERE "
        f"list_contains(?, node)), 0), coalesce((SELECT max(through) FROM "
        f"sstore_sys.collected WHERE stream = ?), 0), coalesce((SELECT max(last_batch) FROM "
        f"sstore_sys.ingested_runs WHERE stream = ?), 0), coalesce((SELECT max(_batch_id) "
        f"FROM {ident(stream)}), 0))", [nodes, stream, stream]).fetchall()[0][0]
    return int(found) + 1


def apply(con: duckdb.DuckDBPyConnection, graph: Graph, plans: list[Plan],
          blocked: Callable[[], str | None] | None = None) -> None:
    """Run ``plans`` and record their versions, in the start's transaction (nothing stays on
    error: ``DeclarationError`` naming the stream and DuckDB's reason, the start rolled
    back). ``blocked``: why no stream may evolve now, if it cannot (weak durability with
    batches in the input log)."""
    if not plans:
        return
    what = f"stream {plans[0].stream!r} cannot evolve ({'; '.join(plans[0].change)})"
    with versioned.one_change(con, VERSIONS_DDL, what, blocked, "evolve.before_commit"):
        for p in plans:
            tables = [p.stream] + [w.name + "__rows" for w in graph.windows_on(p.stream)]
            for table in tables:
                for statement in p.statements:
                    try:
                        con.execute(statement.format(table=ident(table)))
                    except duckdb.Error as exc:
                        raise DeclarationError(
                            f"stream {p.stream!r} could not evolve ({'; '.join(p.change)}): "
                            f"{statement.format(table=table)} failed: {exc}. Nothing was "
                            f"changed") from None
            _record(con, p, next_batch(con, graph, p.stream))


def _record(con: duckdb.DuckDBPyConnection, p: Plan, first_batch: int) -> None:
    last = con.execute(f"SELECT max(version) FROM {VERSIONS} WHERE stream = ?",
                       [p.stream]).fetchall()[0][0]
    if last is None:
        con.execute(f"INSERT INTO {VERSIONS} (stream, version, columns, first_batch, change) "
                    f"VALUES (?, 1, ?, 1, 'created')", [p.stream, json.dumps(p.before)])
        last = 1
    con.execute(f"INSERT INTO {VERSIONS} (stream, version, columns, first_batch, change) "
                f"VALUES (?, ?, ?, ?, ?)", [p.stream, int(last) + 1, json.dumps(p.after),
                                            first_batch, "; ".join(p.change)])


def load(con: duckdb.DuckDBPyConnection, stream: str | None = None) -> list[dict[str, Any]]:
    """The recorded versions (of ``stream``, or of every stream), oldest first: dicts of
    stream, version, columns ([name, type] pairs), first_batch, change, evolved_at. None in
    a state file that never evolved a stream (the table is made on first use)."""
    if not versioned.has_table(con, "stream_versions"):
        return []
    rows = con.execute(f"SELECT stream, version, columns, first_batch, change, "
                       f"evolved_at::VARCHAR FROM {VERSIONS} WHERE ? IS NULL OR stream = ? "
                       f"ORDER BY stream, version", [stream, stream]).fetchall()
    return [{"stream": s, "version": int(v), "columns": [tuple(c) for c in json.loads(cols)],
             "first_batch": int(b), "change": ch, "evolved_at": at}
            for s, v, cols, b, ch, at in rows]


def resent_fingerprint(con: duckdb.DuckDBPyConnection, stream: str, batch_id: int,
                       table: pa.Table) -> int | None:
    """The fingerprint ``table`` (a re-send of batch ``batch_id``, conformed to the stream's
    columns now) would have had as the version that owned that batch took it: its columns,
    with their types then. A batch ingested before an evolution is re-sent by a client that
    does not know of it; its rows are the same rows. None when that cannot be told: no older
    version owns the batch, a column it had is gone, a value does not fit the old type, or
    the re-send carries values in a column the batch did not have. Only on a re-send whose
    fingerprint differs (``sstore.execution.ingest``), never per batch."""
    versions = load(con, stream)
    owners = [v for v in versions if v["first_batch"] <= batch_id]
    if not owners or owners[-1] is versions[-1]:
        return None
    old = owners[-1]["columns"]
    names = [str(c) for c, _t in old]
    if any(n not in table.column_names for n in names) or any(
            table.column(n).null_count != table.num_rows
            for n in table.column_names if n not in names):
        return None
    schema = con.sql("SELECT " + ", ".join(f"CAST(NULL AS {t}) AS {ident(str(c))}"
                                           for c, t in old)).to_arrow_table().schema
    try:
        return fingerprint(table.select(names).cast(schema, safe=True))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
