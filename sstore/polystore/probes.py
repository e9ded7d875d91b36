"""The planner's questions to the engines during one planning, each asked once, notes in bulk.

Why: planning a query over a split object asks each engine about each fragment (columns, rows,
whether a sink feeds it) and about each cached copy (its note, what changed at its source).
Asked one by one that was ten round trips for a UNION over two engines, a few milliseconds: as
much as the repeated query it plans. Here:

- the cached copies' notes are read in one question per engine (every table of the
  ``sstore_cache`` schema with its note, ``Connector.cache_notes``), the first time one is asked;
- a PostgreSQL table's growth (its sink's watermark) is asked once: the fragment's statistics
  (``describe``) and the freshness check of its copies share the answer;
- an engine stream's columns and rows come from one question (``StreamingConnector.describe``).

A ``Probes`` lives for one ``Polystore.plans`` call and is then dropped: nothing it learnt is
reused by a later planning, and the refresh of a cached copy asks the sources again when the
plan runs (``cache.refresh``), so what is memoised here prices a plan and never decides rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sstore.polystore.cache import parse_note
from sstore.polystore.catalog import EngineKind
from sstore.polystore.connectors import (
    Connector,
    Growth,
    PostgresConnector,
    StreamingConnector,
    single_table,
)
from sstore.polystore.scratch import CACHE_SCHEMA

UNKNOWN = object()


class Probes:
    """Memoised planning questions over the connectors ``connector_for`` returns."""

    def __init__(self, connector_for: Callable[[str], Connector]) -> None:
        self._connector_for = connector_for
        self._notes: dict[str, dict[str, str]] = {}           # engine -> {table: note}
        self._growth: dict[tuple[str, str, Any], Growth | None] = {}
        self.questions = 0  # round trips asked through this object (tests and profiles)
        #: (engine, physical) -> {column: type} where the probe asked it (PostgreSQL's)
        self.types: dict[tuple[str, str], dict[str, str]] = {}

    def view(self, engine: str) -> ProbeView:
        """What ``cache.changes`` asks of one engine, answered through this planning's memo."""
        return ProbeView(self, engine)

    def describe(self, engine: str, physical: str, growing: str
                 ) -> tuple[list[str], int, bool]:
        """(columns, rows, grows by ``growing``) of one fragment of a query over several
        engines; the engine's notes come with it, and an engine stream's growth since each
        watermark its copies in engines probed before carry (``Polystore._stats`` probes
        PostgreSQL first)."""
        connector = self._connector_for(engine)
        self.questions += 1
        if isinstance(connector, StreamingConnector):
            found = connector.probe(physical, growing, sorted(self._copy_marks(engine, physical)))
            self._notes.setdefault(engine, found.notes or {})
            for after, growth in found.growths.items():
                self._growth[(engine, _duck_key(physical), after)] = growth
            return found.columns, found.rows, growing in found.columns
        if isinstance(connector, PostgresConnector):
            found = connector.probe(physical, growing)
            if found.notes is not None:
                self._notes.setdefault(engine, found.notes)
            self._growth[(engine, _pg_key(physical), None)] = found.growth
            self.types[(engine, physical)] = found.types
            return found.columns, found.rows, found.growth is not None
        columns = connector.columns(physical)
        self.questions += 1
        return columns, connector.row_count(physical), False

    def _copy_marks(self, engine: str, physical: str) -> set[int]:
        """The watermarks (``hi``) of the copies of ``engine``'s ``physical`` whose notes this
        planning has read (in other engines)."""
        found = set()
        for other, notes in self._notes.items():
            if other == engine:
                continue
            for note in notes.values():
                parsed = parse_note(note)
                if parsed is None or parsed[0] != engine:
                    continue
                hi = parsed[2].get("hi")
                source = single_table(parsed[1])
                if isinstance(hi, int) and source and _duck_key(source) == _duck_key(physical):
                    found.add(hi)
        return found

    def cache_note(self, engine: str, table: str) -> str | None:
        connector = self._connector_for(engine)
        schema = table.rpartition(".")[0]
        if schema != CACHE_SCHEMA or connector.kind is EngineKind.SPARK:
            self.questions += 1
            return connector.cache_note(table)
        if engine not in self._notes:
            self.questions += 1
            self._notes[engine] = connector.cache_notes()
        return self._notes[engine].get(table)

    def growth_since(self, engine: str, sql: str, column: str, after: Any) -> Growth | None:
        connector = self._connector_for(engine)
        table = single_table(sql)
        if isinstance(connector, PostgresConnector):
            key: tuple[str, str, Any] = (engine, _pg_key(table) if table else sql, None)
        elif isinstance(connector, StreamingConnector) and table is not None:
            key = (engine, _duck_key(table), after)  # a whole table: its growth, as probed
        else:
            key = (engine, sql, after)
        found = self._growth.get(key, UNKNOWN)
        if found is UNKNOWN:
            self.questions += 1
            found = connector.growth_since(sql, column, after)
            self._growth[key] = found
        return found  # type: ignore[return-value]

    def fingerprint(self, engine: str, sql: str) -> str:
        self.questions += 1
        return self._connector_for(engine).fingerprint(sql)


class ProbeView:
    """One engine's side of ``Probes``, shaped as the part of a ``Connector`` that
    ``cache.changes`` uses."""

    def __init__(self, probes: Probes, engine: str) -> None:
        self._probes = probes
        self._engine = engine

    def cache_note(self, table: str) -> str | None:
        return self._probes.cache_note(self._engine, table)

    def growth_since(self, sql: str, column: str, after: Any) -> Growth | None:
        return self._probes.growth_since(self._engine, sql, column, after)

    def fingerprint(self, sql: str) -> str:
        return self._probes.fingerprint(self._engine, sql)


def _duck_key(table: str) -> str:
    schema, _, name = table.rpartition(".")
    return f"{schema or 'main'}.{name}"


def _pg_key(table: str) -> str:
    from migrators.postgres import split_name
    schema, name = split_name(table)
    return f"{schema}.{name}"
