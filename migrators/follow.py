"""The warehouse follows an evolved stream, in the same transaction as the rows that need it.

A stream that gained a column or widened one (``sstore.storage.evolution``) sends rows its
PostgreSQL
target cannot take yet. Every writer (a sink, ``sstore migrate``, a table copy) asks here what
the target lacks (``plan``) before it writes, and the answer, a ``Follow``, is run by the
writer inside the PostgreSQL transaction that writes the first rows needing it (``apply``, in
step 4 of ``migrators.delivery``, before the COPY). A reader in another connection therefore
never sees the new column without its rows, nor rows without their column: ``ALTER TABLE``
holds its lock until that COMMIT, and a rollback (a failed COPY, a retry) takes the column
back with the rows.

What a target may gain:

- a column it lacks that the stream gained by evolving (a table copy: any column its source
  has): ``ADD COLUMN`` of the type the rows map to (``migrators.typemap``), nullable, so the
  rows it already holds read NULL; a column the stream always had stays an error ("has no
  column"): such a target is more likely the wrong table;
- a wider type for a column, only where the stream widened that column itself and the target
  column is exactly what an older version of it mapped to (``integer -> bigint``,
  ``numeric(10,2) -> numeric(14,2)``): a narrower column the user made on purpose keeps
  today's rules (values checked one by one, or refused).

A target that cannot follow is an ``IncompatibleSchemaError`` (terminal: the sink halts,
nothing moves) naming what it would need: a view, a foreign table, or any other relation that
is not a table; a column of another type the user made is refused by ``check_compatible`` as
before.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pyarrow as pa

from migrators.errors import IncompatibleSchemaError
from migrators.postgres import TargetColumns, ensure_table, target_columns
from migrators.typemap import check_compatible, mapping_for
from sstore.base.sql import ident, qualified

#: relkinds that take ALTER TABLE ... ADD COLUMN / ALTER COLUMN TYPE: tables, partitioned
_ALTERABLE = ("r", "p")
_KINDS = {"v": "a view", "m": "a materialized view", "f": "a foreign table"}
_INTEGERS = ("smallint", "integer", "bigint")


@dataclass(frozen=True)
class Follow:
    """The statements that make a target take the rows (none: it takes them as it is)."""

    table: str = ""
    statements: tuple[str, ...] = ()
    #: what they do, for logs and errors ("add note text", "widen id integer -> bigint")
    changes: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.statements)

    def apply(self, cur: psycopg.Cursor) -> None:
        """Run the statements in the caller's open transaction (the one with the rows)."""
        for statement in self.statements:
            cur.execute(statement)


@dataclass(frozen=True)
class Prepared:
    """A target checked for rows of a schema: the column types the rows are converted to
    (``typemap.for_target``; the columns a ``Follow`` adds or widens are left out, the rows'
    own types being what they will have) and the ``Follow`` that must run before them."""

    types: TargetColumns
    follow: Follow = field(default_factory=Follow)


def prepare(con: psycopg.Connection, table: str, schema: pa.Schema, key: tuple[str, ...] = (),
            existing: TargetColumns | None = None, source: str = "the rows",
            widened_from: Mapping[str, set[str]] | None = None,
            addable: Collection[str] | None = None) -> Prepared:
    """``postgres.ensure_table`` for a writer that lets the target follow: a missing target
    is created; an existing one is checked, and what it lacks is planned (``Follow``), not
    run. ``widened_from``: per column, the PostgreSQL types older versions of the stream
    mapped it to (``older_types``). ``addable``: the columns the target may gain (a sink:
    those the stream gained by evolving, ``older_types``; a target lacking a column the
    stream always had is more likely the wrong table); None: any (a table copy, whose source
    has no versions and whose target follows it)."""
    if existing is None:
        existing = target_columns(con, table)
    if not existing:
        return Prepared(ensure_table(con, table, schema, key, existing, source))
    statements: list[str] = []
    changes: list[str] = []
    followed: set[str] = set()
    for f in schema:
        pg_type = mapping_for(f).pg_type(f.type)
        if f.name not in existing and (addable is None or f.name in addable):
            statements.append(f"ALTER TABLE {qualified(table)} ADD COLUMN IF NOT EXISTS "
                              f"{ident(f.name)} {pg_type}")
            changes.append(f"add {f.name} {pg_type}")
        elif f.name in existing and _widens(existing[f.name], pg_type,
                                            (widened_from or {}).get(f.name, set())):
            statements.append(f"ALTER TABLE {qualified(table)} ALTER COLUMN {ident(f.name)} "
                              f"TYPE {pg_type}")
            changes.append(f"widen {f.name} {_spelled(existing[f.name])} -> {pg_type}")
        else:
            continue
        followed.add(f.name)
    kept = pa.schema([f for f in schema if f.name not in followed])
    check_compatible(table, kept, existing, source)
    if statements:
        _refuse_unalterable(con, table, source, changes)
    return Prepared({c: t for c, t in existing.items() if c not in followed},
                    Follow(table, tuple(statements), tuple(changes)))


def gained(versions: list[dict[str, Any]]) -> set[str]:
    """The columns of the stream's last version that its first did not have."""
    if len(versions) < 2:
        return set()
    return ({str(c) for c, _t in versions[-1]["columns"]}
            - {str(c) for c, _t in versions[0]["columns"]})


def older_types(versions: list[dict[str, Any]], cast: Callable[[str], pa.DataType]
                ) -> dict[str, set[str]]:
    """Per column, the PostgreSQL types the stream's versions before the last mapped it to
    (``cast``: a DuckDB type -> its Arrow type, asked of the engine)."""
    found: dict[str, set[str]] = {}
    for version in versions[:-1]:
        for column, duck_type in version["columns"]:
            arrow_type = cast(str(duck_type))
            found.setdefault(str(column), set()).add(
                mapping_for(pa.field(str(column), arrow_type)).pg_type(arrow_type))
    return found


def _widens(column: tuple[str, int | None, int | None], pg_type: str,
            older: set[str]) -> bool:
    """Whether target column ``column`` (information_schema's data type, precision, scale)
    is an older version's type of a column the stream widened to ``pg_type``."""
    spelled = _spelled(column)
    if spelled == pg_type or spelled not in older:
        return False
    data_type, precision, scale = column
    if data_type in _INTEGERS and pg_type in _INTEGERS:
        return _INTEGERS.index(pg_type) > _INTEGERS.index(data_type)
    if data_type == "numeric" and pg_type.startswith("numeric(") and precision is not None:
        wanted_precision, wanted_scale = (int(x) for x in pg_type[8:-1].split(","))
        return wanted_scale == scale and wanted_precision > precision
    return False


def _spelled(column: tuple[str, int | None, int | None]) -> str:
    """A target column's type as ``typemap`` spells what it creates (``numeric(10,2)``)."""
    data_type, precision, scale = column
    if data_type == "numeric" and precision is not None:
        return f"numeric({precision},{scale or 0})"
    return data_type


def _refuse_unalterable(con: psycopg.Connection, table: str, source: str,
                        changes: list[str]) -> None:
    row = con.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)",
                      (qualified(table),)).fetchone()
    kind = str(row[0]) if row else "?"
    if kind in _ALTERABLE:
        return
    raise IncompatibleSchemaError(
        f"target {table} is {_KINDS.get(kind, f'not a table (relkind {kind})')} and cannot "
        f"follow {source}, which needs: {'; '.join(changes)}. Nothing was written. Change "
        f"the relation by hand (its table and its definition), or write into a table")
