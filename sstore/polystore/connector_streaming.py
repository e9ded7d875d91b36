"""The polystore's connector to an sstore engine: a live ``Engine`` of this process, or a state
file opened read-only (``StateFileReader``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from sstore.base.sql import ident, literal, qualified
from sstore.engine import Engine
from sstore.polystore.catalog import EngineKind
from sstore.polystore.connector_base import (
    PROBE,
    CacheMoved,
    Growth,
    Probed,
    group_columns,
    schema_and_name,
)
from sstore.polystore.scratch import (
    CACHE_SCHEMA,
    CastExistsError,
    ProtectedObjectError,
    check_owned,
)
from sstore.storage.statefile import StateFileReader


class StreamingConnector:
    """An sstore engine. A live ``Engine`` of this process: reads go through ``Engine.query``
    (checked, in a READ ONLY transaction over the committed state), stores through one engine
    transaction. A ``StateFileReader`` (a state file the catalog names, opened here): a
    read-only DuckDB connection with external access off; nothing is ever written to it
    (``read_only``), and closing the connector closes it."""

    kind = EngineKind.STREAMING

    def __init__(self, name: str, source: Engine | StateFileReader) -> None:
        self.name = name
        self.engine: Engine | None = source if isinstance(source, Engine) else None
        self._reader = source

    @property
    def read_only(self) -> bool:
        """Opened from its state file here: plans never write into it."""
        return self.engine is None

    def fetch(self, sql: str, time_zone: str | None = None) -> pa.Table:
        """``time_zone``: the session's for this query (a plan passes PostgreSQL's, so a
        timestamptz means there what it means in PostgreSQL)."""
        return self._reader.query(sql, time_zone=time_zone)

    def store(self, table: str, rows: pa.Table, mode: str = "replace",
              note: str | None = None, delete_below: tuple[str, Any] | None = None,
              expect_note: str | None = None) -> int:
        """Rows, deletions and note in one engine transaction: one commit, all or nothing.
        ``expect_note``: an append goes ahead only if the table's note is still this one
        (else ``CacheMoved``: another refresh got there first).

        ``mode``: "replace", "append", or "create" (a new table; an existing one is a
        ``CastExistsError``). A new table is made by ``CREATE TABLE ... AS SELECT`` from the
        rows: DuckDB 2.0.0 loses the rows of a table created empty (``AS ... LIMIT 0``) and
        filled in the same transaction from later UNION ALL scans (see
        tests/polystore/test_polystore.py)."""
        engine = self.check_writable(table)
        name = qualified(table)
        schema = table.split(".")[0]
        exists = self.exists(table)
        if mode == "create" and exists:
            raise CastExistsError(f"{table} already exists in engine {self.name!r}")
        fresh = mode in ("replace", "create") or not exists
        with engine.transaction() as tx:
            tx.register("sstore_store", rows)
            tx.execute(f"CREATE SCHEMA IF NOT EXISTS {ident(schema)}")
            if fresh:
                if mode != "create":  # a create fails if the table appeared meanwhile
                    tx.execute(f"DROP TABLE IF EXISTS {name}")
                tx.execute(f"CREATE TABLE {name} AS SELECT * FROM sstore_store")
            else:
                if expect_note is not None:
                    found = tx.fetchone("SELECT comment FROM duckdb_tables() WHERE "
                                        "schema_name = ? AND table_name = ?",
                                        *schema_and_name(table, "main"))
                    if found is None or found[0] != expect_note:
                        raise CacheMoved(f"{table} changed since it was read")
                if delete_below is not None:
                    column, value = delete_below
                    tx.execute(f"DELETE FROM {name} WHERE {ident(column)} < ?", value)
                tx.execute(f"INSERT INTO {name} BY NAME SELECT * FROM sstore_store")
            if note is not None:
                tx.execute(f"COMMENT ON TABLE {name} IS {literal(note)}")
        return int(rows.num_rows)

    def drop(self, table: str) -> None:
        self.check_writable(table).execute(f"DROP TABLE IF EXISTS {qualified(table)}")

    def check_writable(self, table: str) -> Engine:
        """The engine to write ``table`` into; refused outside sstore's schemas, and always
        for a state file opened read-only here."""
        check_owned(self.kind, self.name, table)
        if self.engine is None:
            raise ProtectedObjectError(
                f"engine {self.name!r} is its state file, opened read-only here: nothing is "
                f"written into it; pass the running engine (Polystore(engines=...)) to cast "
                f"into it")
        return self.engine

    def row_count(self, physical: str) -> int:
        return int(self._one(f"SELECT count(*) AS n FROM {qualified(physical)}")["n"])

    def is_empty(self, physical: str) -> bool:
        """No row at all: one row read at most, answered without Arrow (a reused plan asks
        it of each fragment it left out as empty, every run: ``plancache``)."""
        return bool(self._one(
            f"SELECT NOT EXISTS (SELECT 1 FROM {qualified(physical)}) AS e")["e"])

    def _one(self, sql: str, *args: Any) -> dict[str, Any]:
        """The one row of a small question, as Python values (``Engine.query_rows``: an
        Arrow answer costs more than the question here; planning and every cache refresh ask
        several)."""
        names, rows = self._reader.query_rows(sql, *args)
        return dict(zip(names, rows[0]))

    def columns(self, physical: str) -> list[str]:
        return list(self.fetch(f"SELECT * FROM {qualified(physical)} LIMIT 0").column_names)

    def discover(self) -> list[tuple[str, str, dict[str, str]]]:
        """The main schema's tables and streams, not the engine's internals: sstore's schemas,
        a window's row table (``<window>__rows``: read the window's view), dead letters
        (``<input>__dead_letter``: ``sstore dead-letters``), nor the cache tables older
        versions kept in main as ``sstore_cache__*``."""
        rows = self.fetch(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'main' AND table_catalog = current_database() "
            "AND NOT starts_with(table_name, 'sstore_') "
            "AND NOT suffix(table_name, '__dead_letter') "
            "AND table_name NOT IN (SELECT name || '__rows' FROM sstore_sys.graph "
            "WHERE kind = 'window') ORDER BY table_name, ordinal_position")
        return group_columns(rows.to_pylist())

    def fingerprint(self, sql: str) -> str:
        """Count and order-independent hash of a query's rows: equal means unchanged."""
        row = self.fetch(f"SELECT count(*) AS n, sum(hash(q)) AS h FROM ({sql}) AS q"
                         ).to_pylist()[0]
        return f"{row['n']}:{row['h']}"

    def growth_since(self, sql: str, column: str, after: Any) -> Growth | None:
        """One pass over the growing column only (DuckDB reads one column, and skips row
        groups by their min/max): cheap next to moving the rows."""
        col = ident(column)
        past = ("count(*)" if after is None
                else f"count(*) FILTER (WHERE {col} > {int(after)})")
        row = self._one(f"SELECT min({col}) AS lo, max({col}) AS hi, count(*) AS n, "
                        f"{past} AS new FROM ({sql}) AS q")
        return Growth(row["lo"], row["hi"], int(row["n"]), int(row["new"]))

    def cache_note(self, table: str) -> str | None:
        """The copy's note (its table comment): a catalog lookup, no scan."""
        _names, found = self._reader.query_rows(
            "SELECT comment FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
            *schema_and_name(table, "main"))
        return (found[0][0] or "") if found else None

    def cache_notes(self) -> dict[str, str]:
        """Every table of ``sstore_cache`` with its note, in one question: the planner reads
        all its copies' notes at once (``probes``)."""
        _names, found = self._reader.query_rows(
            "SELECT schema_name || '.' || table_name AS t, comment FROM duckdb_tables() "
            "WHERE schema_name = ?", CACHE_SCHEMA)
        return {t: comment or "" for t, comment in found}

    def probe(self, physical: str, growing: str, afters: Sequence[int] = ()) -> Probed:
        """Columns, rows and the notes of every cached copy in this engine, in one question:
        the planner asks it of every engine fragment of a query over several engines. An
        engine stream grows by ``growing`` (the batch-id); ``afters``: the watermarks of its
        copies elsewhere, whose growth since (``growth_since``) is asked in the same question
        (``Probed.growths``)."""
        table = qualified(physical)
        col = ident(growing)
        # the probe's own columns carry a prefix: the table's columns follow them in the same
        # row (a table with a column ``n`` used to shadow the count, and the probe failed)
        since = "".join(f", count(*) FILTER (WHERE {col} > {int(a)}) AS {PROBE}new{i}"
                        for i, a in enumerate(afters))
        counts = (f"count(*) AS {PROBE}n, min({col}) AS {PROBE}lo, max({col}) AS {PROBE}hi"
                  f"{since}" if afters else f"count(*) AS {PROBE}n")
        question = (
            f"SELECT c.*, d.notes AS {PROBE}notes, t.* "
            f"FROM (SELECT {counts} FROM {table}) AS c "
            "CROSS JOIN (SELECT list({'t': schema_name || '.' || table_name, 'c': comment}) "
            "AS notes FROM duckdb_tables() WHERE schema_name = ?) AS d "
            f"LEFT JOIN (SELECT * FROM {table} LIMIT 0) AS t ON true")
        try:  # one row: as Python values (an Arrow answer costs more than the question)
            names, rows = self._reader.query_rows(question, CACHE_SCHEMA)
        except duckdb.Error:  # no growing column after all: ask without it
            if not afters:
                raise
            return self.probe(physical, growing)
        row = dict(zip(names, rows[0]))
        skip = 2 + (2 + len(afters) if afters else 0)
        columns = names[skip:]  # the table's own, from the empty join's columns
        notes = {n["t"]: n["c"] or "" for n in row[f"{PROBE}notes"] or []}
        n = int(row[f"{PROBE}n"])
        growths = {int(a): Growth(row[f"{PROBE}lo"], row[f"{PROBE}hi"], n,
                                  int(row[f"{PROBE}new{i}"]))
                   for i, a in enumerate(afters)}
        return Probed(columns, n, None, notes, growths)

    def identity(self) -> str | None:
        """The engine's UUID, as its sinks record it (``source`` in ``sstore.watermarks``);
        None for a state file that has none."""
        if self.engine is not None:
            return self.engine.engine_id
        try:
            found = self._reader.query("SELECT engine_id FROM sstore_sys.identity LIMIT 1")
        except duckdb.Error:
            return None
        rows = found.to_pylist()
        return str(rows[0]["engine_id"]) if rows else None

    def exists(self, table: str) -> bool:
        return bool(self._reader.query_rows(
            "SELECT 1 FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
            *schema_and_name(table, "main"))[1])

    def collected_through(self, stream: str) -> int:
        """The highest batch-id of engine stream ``stream`` that garbage collection removed
        (0: none): a batch past it that the engine ever had is still in the stream. A split
        object needs it to know whether the batches its sink's target lacks can still be read
        from the stream (``sstore.polystore.delivered``).

        A live engine answers from memory (``Engine.collected_through``, the mark a sink's
        ``GapError`` is decided by; under the engine's lock, which a cache top-up takes too:
        about a microsecond, where a question on the reader cursor costs 0.5-0.7 ms on this
        2-core machine under load). A state file answers from ``sstore_sys.collected``,
        written in the transaction that deletes the rows; a DuckDB file that sstore did not
        make has no such table: nothing was collected from it."""
        if self.engine is not None:
            return self.engine.collected_through(stream)
        try:
            _names, found = self._reader.query_rows(
                "SELECT max(through) FROM sstore_sys.collected WHERE stream = ?", stream)
        except duckdb.CatalogException:
            return 0
        return int(found[0][0] or 0) if found else 0

    def close(self) -> None:
        if isinstance(self._reader, StateFileReader):
            self._reader.close()
