"""What every polystore connector shares: the ``Connector`` protocol (the same anatomy in
each engine, see ``sstore.polystore.connectors``), the answers connectors give the planner
(``Growth``, ``Probed``), the cache note's format, and small helpers more than one connector
uses."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from sstore.base.errors import TerminalError
from sstore.polystore.catalog import EngineKind

# A cached copy remembers what it was copied from in its table comment, written in the same
# transaction as its rows (PostgreSQL), so a copy and its description cannot disagree.
CACHE_NOTE = "sstore cache of "
PROBE = "sstore__probe_"  # prefix of the columns a probe adds beside a table's own


class CacheMoved(TerminalError):
    """A conditional append found the cache's note changed: another refresh topped it up (or
    rebuilt it) after this one read it. The caller reads the copy again and starts over."""


@dataclass(frozen=True)
class Growth:
    """What a growing source (an engine stream, a sink-fed PostgreSQL table) holds now, asked
    in one small question: its lowest and highest batch-id, its rows, how many of them are
    past the batch a copy reaches (``new``), and the source table's identity (``origin``: a
    PostgreSQL relfilenode, which TRUNCATE or a recreated table changes; None for a stream)."""

    low: Any
    high: Any
    total: int
    new: int | None     # None: the source cannot tell (a sink-fed table: see ``rows_since``)
    origin: Any = None

    def rows_since(self, mark: dict[str, Any]) -> int:
        """Rows written since a copy with watermark ``mark`` was made: asked of the source
        (a stream), or the sink's running total now minus its total then (a table)."""
        if self.new is not None:
            return self.new
        return max(0, self.total - int(mark.get("total") or 0))


@dataclass(frozen=True)
class Probed:
    """One fragment as the planner sees it, asked in one question: its columns and rows, its
    growth when it grows by batch, and the notes of the engine's cached copies (None: not
    asked)."""

    columns: list[str]
    rows: int
    growth: Growth | None
    notes: dict[str, str] | None
    growths: dict[int, Growth] = field(default_factory=dict)  # watermark -> growth since
    #: column -> the engine's type name, where the probe asks it (PostgreSQL's
    #: ``format_type``): what ``meaning.kept_types`` keeps in PostgreSQL
    types: dict[str, str] = field(default_factory=dict)


class Connector(Protocol):
    name: str
    kind: EngineKind

    def fetch(self, sql: str, time_zone: str | None = None) -> pa.Table: ...
    def store(self, table: str, rows: pa.Table, mode: str = "replace",
              note: str | None = None, delete_below: tuple[str, Any] | None = None,
              expect_note: str | None = None) -> int: ...
    def exists(self, table: str) -> bool: ...
    def drop(self, table: str) -> None: ...
    def row_count(self, physical: str) -> int: ...
    def is_empty(self, physical: str) -> bool: ...
    def columns(self, physical: str) -> list[str]: ...
    def discover(self) -> list[tuple[str, str, dict[str, str]]]: ...
    def fingerprint(self, sql: str) -> str: ...
    def growth_since(self, sql: str, column: str, after: Any) -> Growth | None: ...
    def cache_note(self, table: str) -> str | None: ...
    def cache_notes(self) -> dict[str, str]: ...
    def close(self) -> None: ...


@functools.lru_cache(maxsize=512)
def single_table(sql: str) -> str | None:
    """The one table a move's plain ``SELECT columns FROM table`` reads (None otherwise); kept
    by text (a function of it): every planning asks it of every move."""
    from sqlglot import exp

    from sstore.polystore.sqltext import parse_shared
    tree = parse_shared(sql, "postgres")
    tables = list(tree.find_all(exp.Table))
    if not isinstance(tree, exp.Select) or len(tables) != 1 or tree.args.get("where"):
        return None
    return ".".join(p for p in (tables[0].db, tables[0].name) if p)


def schema_and_name(table: str, default_schema: str) -> tuple[str, str]:
    """``schema.table`` -> (schema, table); a bare name is in ``default_schema``."""
    schema, _, name = table.rpartition(".")
    return (schema or default_schema), name


def group_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, str]]]:
    """``information_schema.columns`` rows -> ``discover``'s answer: (name, physical name,
    {column: type}) per table."""
    tables: dict[str, dict[str, str]] = {}
    for row in rows:
        tables.setdefault(row["table_name"], {})[row["column_name"]] = str(row["data_type"])
    return [(name, name, cols) for name, cols in tables.items()]
