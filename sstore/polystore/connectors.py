"""Connectors: the polystore's hands in each engine, all with the same anatomy.

Each connector runs a query in its engine's own dialect and returns Arrow (``fetch``), stores
Arrow rows as a table (``store``), and answers the planner's questions about a physical table
(``row_count``, ``columns``, ``discover``) and about cached copies (``cache_note``,
``growth_since``). Data moves
through the migrators' fast paths: DuckDB's Arrow export, ADBC binary COPY out of PostgreSQL,
pgpq binary COPY into it, Arrow into Spark and JDBC from PostgreSQL to Spark.

Reads cannot write: every ``fetch`` checks its SQL (``sstore.readonly.check_query``) and runs it
read-only where the engine can (a READ ONLY transaction in the engine or PostgreSQL, a state
file opened read-only with external access off); ``store`` and ``drop`` touch only the
polystore's own schemas (``scratch.check_owned``).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import duckdb
import pyarrow as pa

from sstore import retry
from sstore.engine import Engine
from sstore.errors import TerminalError
from sstore.polystore.catalog import EngineKind
from sstore.polystore.scratch import (
    CACHE_SCHEMA,
    CastExistsError,
    ProtectedObjectError,
    check_owned,
)
from sstore.readonly import check_query
from sstore.retry import Kind, RetryPolicy, kind_of
from sstore.sql import ident, literal, qualified
from sstore.statefile import StateFileReader

# A cached copy remembers what it was copied from in its table comment, written in the same
# transaction as its rows (PostgreSQL), so a copy and its description cannot disagree.
CACHE_NOTE = "sstore cache of "
#: The watermark rows of the sinks feeding a table, with four parameters (its name
#: ``schema.table``, its bare name when in ``public`` else the same, and twice its quoted
#: name): rows under its name written for it (or before any table was), and any row written
#: for the table now under its name whatever spelling it was recorded under (an older sstore
#: recorded the target as the writer spelt it; ``migrators.delivery`` adopts such rows at the
#: sink's next start, and until then the table is still the sink's).
SINK_ROWS = ("((target IN (%s, %s) AND (target_oid IS NULL OR target_oid = to_regclass(%s))) "
             "OR target_oid = to_regclass(%s))")
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


class Connector(Protocol):
    name: str
    kind: EngineKind

    def fetch(self, sql: str) -> pa.Table: ...
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

    def fetch(self, sql: str) -> pa.Table:
        return self._reader.query(sql)

    def store(self, table: str, rows: pa.Table, mode: str = "replace",
              note: str | None = None, delete_below: tuple[str, Any] | None = None,
              expect_note: str | None = None) -> int:
        """Rows, deletions and note in one engine transaction: one commit, all or nothing.
        ``expect_note``: an append goes ahead only if the table's note is still this one
        (else ``CacheMoved``: another refresh got there first).

        ``mode``: "replace", "append", or "create" (a new table; an existing one is a
        ``CastExistsError``). A new table is made by ``CREATE TABLE ... AS SELECT`` from the
        rows: DuckDB 2.0.0 loses the rows of a table created empty (``AS ... LIMIT 0``) and
        filled in the same transaction from later UNION ALL scans (see tests/test_polystore.py)."""
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
                                        *_schema_and_name(table, "main"))
                    if found is None or found[0] != expect_note:
                        raise CacheMoved(f"{table} changed since it was read")
                if delete_below is not None:
                    column, value = delete_below
                    tx.execute(f"DELETE FROM {name} WHERE {ident(column)} < ?", value)
                tx.execute(f"INSERT INTO {name} BY NAME SELECT * FROM sstore_store")
            if note is not None:
                tx.execute(f"COMMENT ON TABLE {name} IS {literal(note)}")
        return rows.num_rows

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
        return self.fetch(f"SELECT * FROM {qualified(physical)} LIMIT 0").column_names

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
        return _group_columns(rows.to_pylist())

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
            *_schema_and_name(table, "main"))
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
            *_schema_and_name(table, "main"))[1])

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


class PostgresConnector:
    """A PostgreSQL database: reads by ADBC (binary COPY into Arrow) in READ ONLY
    transactions, the planner's small questions on a psycopg connection whose transactions are
    all READ ONLY, stores by pgpq binary COPY with the table's note in the same transaction
    (on a connection of their own, only into sstore's schemas)."""

    kind = EngineKind.POSTGRES

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self._con: Any = None        # psycopg, autocommit, read-only: small questions
        self._lock = threading.Lock()
        self._adbc: Any = None       # ADBC: reads into Arrow
        self._adbc_lock = threading.Lock()
        self._writer: Any = None     # migrators.postgres.Session: casts and caches
        self._watermarks_seen = False  # sstore.watermarks existed at the last probe
        self._write_lock = threading.Lock()

    def fetch(self, sql: str) -> pa.Table:
        """Rows of ``sql`` as Arrow over the connector's ADBC connection (kept open: opening
        one costs ~70 ms here, a query on an open one under 1 ms); reopened once if the server
        dropped it. The SQL is checked to be a plain query and runs in a READ ONLY
        transaction, rolled back afterwards."""
        import adbc_driver_postgresql.dbapi as adbc

        from migrators.errors import MigrationError, PostgresUnavailable
        from migrators.postgres_to_engine import fetch_arrow
        from migrators.urls import parse as parse_url
        from migrators.urls import with_connect_timeout
        check_query(sql, "postgres")

        def attempt() -> pa.Table:
            try:
                if self._adbc is None:  # bounded like every sstore connection (libpq: forever)
                    self._adbc = adbc.connect(with_connect_timeout(self.url))
                table = fetch_arrow(self._adbc, sql, read_only=True)
                self._adbc.rollback()
                return table
            except adbc.Error as exc:
                if kind_of(exc) is Kind.TRANSIENT:
                    self._close_adbc()  # a fresh connection for the next attempt
                else:
                    self._rollback_adbc()
                raise

        with self._adbc_lock:
            try:
                return retry.call(attempt, RetryPolicy(attempts=3), "polystore read")
            except retry.GaveUp as exc:
                raise PostgresUnavailable(f"PostgreSQL at {parse_url(self.url).redacted()}: "
                                          f"{exc}") from exc.__cause__
            except adbc.Error as exc:
                raise MigrationError(f"query failed in PostgreSQL: {exc}") from exc

    def _rollback_adbc(self) -> None:
        try:
            self._adbc.rollback()
        except Exception:  # noqa: BLE001 - a broken connection is replaced next time
            self._close_adbc()

    def _close_adbc(self) -> None:
        if self._adbc is not None:
            with contextlib.suppress(Exception):  # closing a dead connection may fail too
                self._adbc.close()
            self._adbc = None

    def store(self, table: str, rows: pa.Table, mode: str = "replace",
              note: str | None = None, delete_below: tuple[str, Any] | None = None,
              expect_note: str | None = None) -> int:
        """``mode``: "replace", "append", or "create" (a new table: an existing one is a
        ``CastExistsError``, checked in the transaction that creates it). ``expect_note``:
        an append locks the table against other appends and goes ahead only if its note is
        still this one (else ``CacheMoved``): two processes topping up one cache cannot both
        append the same batches."""
        from migrators.postgres import copy_arrow, ensure_table
        from migrators.typemap import for_copy
        check_owned(self.kind, self.name, table)

        def work(con: Any) -> int:
            with con.cursor() as cur:
                if mode == "create" and _pg_exists(cur, table):
                    raise CastExistsError(f"{table} already exists in engine {self.name!r}")
                if mode == "replace":
                    cur.execute(f"DROP TABLE IF EXISTS {qualified(table)}")
                if expect_note is not None and mode == "append":
                    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (qualified(table),))
                    if not cur.fetchone()[0]:
                        raise CacheMoved(f"{table} is gone since it was read")
                    cur.execute(f"LOCK TABLE {qualified(table)} IN SHARE ROW EXCLUSIVE MODE")
                    cur.execute("SELECT obj_description(to_regclass(%s), 'pg_class')",
                                (qualified(table),))
                    if cur.fetchone()[0] != expect_note:
                        raise CacheMoved(f"{table} changed since it was read")
                ensure_table(con, table, for_copy(rows).schema)
                if delete_below is not None:
                    column, value = delete_below
                    cur.execute(f"DELETE FROM {qualified(table).replace('%', '%%')} WHERE "
                                f"{ident(column)} < %s",
                                (value,))
                copy_arrow(cur, table, for_copy(rows))
                if note is not None:
                    cur.execute(f"COMMENT ON TABLE {qualified(table)} IS {literal(note)}")
            con.commit()
            return rows.num_rows

        return self._write(work, f"store {table}")

    def exists(self, table: str) -> bool:
        return bool(self._execute("SELECT to_regclass(%s) IS NOT NULL", (qualified(table),)
                                  )[0][0])

    def drop(self, table: str) -> None:
        check_owned(self.kind, self.name, table)

        def work(con: Any) -> None:
            con.execute(f"DROP TABLE IF EXISTS {qualified(table)}")
            con.commit()

        self._write(work, f"drop {table}")

    def _write(self, work: Any, what: str) -> Any:
        """One write transaction on the connector's write session, kept open between writes
        (opening a connection costs more than topping up a cache by a batch), replaced after
        a failure and retried on transient ones (``migrators.postgres.Session``)."""
        from migrators.postgres import RetryPolicy, Session
        with self._write_lock:
            if self._writer is None:
                self._writer = Session(self.url, RetryPolicy())
            return self._writer.run(work, what)

    def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """One question on the connector's own connection (autocommit, every transaction
        READ ONLY; reopened after a failure): the planner asks several per query."""
        import psycopg

        from migrators.postgres import connect

        def attempt() -> list[tuple[Any, ...]]:
            if self._con is None or self._con.closed:
                self._con = connect(self.url)
                self._con.autocommit = True
                self._con.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            try:
                cur = self._con.execute(sql, params or None)
                return cur.fetchall() if cur.description else []
            except psycopg.Error as exc:
                if kind_of(exc) is Kind.TRANSIENT:
                    self._con.close()
                raise

        with self._lock:
            try:
                return retry.call(attempt, RetryPolicy(attempts=3), "polystore planning question")
            except retry.GaveUp as exc:
                from migrators.errors import PostgresUnavailable
                raise PostgresUnavailable(str(exc)) from exc.__cause__

    def row_count(self, physical: str) -> int:
        return int(self._execute(f"SELECT count(*) FROM {qualified(physical)}")[0][0])

    def is_empty(self, physical: str) -> bool:
        """No row at all: one row read at most (``count(*)`` would scan the table)."""
        return bool(self._execute(
            f"SELECT NOT EXISTS (SELECT 1 FROM {qualified(physical)})")[0][0])

    def describe(self, physical: str, growing: str) -> tuple[list[str], int, bool]:
        """(columns, rows, whether a sink appends to it by ``growing``): ``describe_growth``."""
        columns, rows, growth = self.describe_growth(physical, growing)
        return columns, rows, growth is not None

    def describe_growth(self, physical: str, growing: str
                        ) -> tuple[list[str], int, Growth | None]:
        """(columns, rows, its growth when a sink appends to it by ``growing``): ``probe``."""
        found = self.probe(physical, growing)
        return found.columns, found.rows, found.growth

    def probe(self, physical: str, growing: str) -> Probed:
        """What the planner asks of every PostgreSQL fragment of every query, in one round
        trip: its columns, whether it has rows, whether a sink appends to it by ``growing``
        (then its rows are the sink's running total and its growth is the sink's watermark
        row: no scan of a sink-fed table; rows written by hand are not counted, which only
        prices plans), and the notes of every cached copy in this database. Whether it is empty
        (which leaves it out of a plan) is always asked of the table itself (one row read,
        never estimated). The watermark row is read in the same question once this
        connection has seen ``sstore.watermarks`` exist; until then it is a second one."""
        from migrators.postgres import split_name
        schema, name = split_name(physical)
        table = qualified(physical).replace("%", "%%")  # in a query with %s placeholders
        full = f"{schema}.{name}"
        marks_sql = ("(SELECT ARRAY[max(batch_id)::text, sum(rows_total)::text, "
                     f"count(*)::text] FROM sstore.watermarks WHERE {SINK_ROWS})")
        marks_params = (full, name if schema == "public" else full, qualified(full),
                        qualified(full))
        # a table no single sink feeds is counted in the same question (its rows price plans);
        # a sink-fed one is not scanned: its watermark row says how many rows it holds
        count_sql = (f"CASE WHEN (SELECT count(*) FROM sstore.watermarks WHERE {SINK_ROWS}) "
                     f"= 1 THEN NULL ELSE (SELECT count(*) FROM {table}) END")
        question = (
            "SELECT (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a "
            "WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), "
            f"EXISTS (SELECT 1 FROM {table}), "
            "EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisunique), "
            "c.relfilenode, to_regclass('sstore.watermarks') IS NOT NULL, "
            "(SELECT array_agg(ARRAY[n2.nspname || '.' || c2.relname, "
            "coalesce(obj_description(c2.oid, 'pg_class'), '')]) FROM pg_class c2 "
            "JOIN pg_namespace n2 ON n2.oid = c2.relnamespace WHERE n2.nspname = %s), ")
        where = (" FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                 "WHERE n.nspname = %s AND c.relname = %s")

        def asked(marks: str, count: str) -> str:  # not str.format: a name may hold braces
            return question + marks + ", " + count + where

        with_marks = self._watermarks_seen
        try:
            found = self._execute(
                asked(marks_sql, count_sql) if with_marks else asked("NULL", "NULL"),
                (CACHE_SCHEMA, *(marks_params * 2 if with_marks else ()), schema, name))
        except Exception as exc:  # the watermarks table went away since: ask without it
            import psycopg
            if not with_marks or not isinstance(exc, psycopg.errors.UndefinedTable):
                raise
            self._watermarks_seen = with_marks = False
            found = self._execute(asked("NULL", "NULL"), (CACHE_SCHEMA, schema, name))
        if not found:
            return Probed(self.columns(physical), self.row_count(physical), None, None)
        cols, filled, unique, origin, has_marks, notes, marks, counted = found[0]
        columns = list(cols or [])
        notes_by_table = {t: note for t, note in (notes or [])}
        self._watermarks_seen = bool(has_marks)
        growth = None
        if growing in columns and not unique and has_marks:
            if marks is None:  # not asked in the same question: this connection's first time
                row = self._execute(
                    "SELECT max(batch_id), sum(rows_total), count(*) FROM sstore.watermarks "
                    f"WHERE {SINK_ROWS}", marks_params)[0]
            else:
                row = (None if marks[0] is None else int(marks[0]), marks[1], int(marks[2]))
            growth = _sink_growth(row, origin)
        if not filled:
            return Probed(columns, 0, growth, notes_by_table)
        if growth is not None:
            return Probed(columns, max(1, growth.total), growth, notes_by_table)
        rows = int(counted) if counted is not None else self.row_count(physical)
        return Probed(columns, rows, None, notes_by_table)

    def sink_watermarks(self, stream: str, physical: str, source: str | None,
                        known: bool = False, with_rows: bool = False
                        ) -> list[tuple[Any, ...]]:
        """The watermark rows of the sinks that deliver engine stream ``stream`` (of engine
        ``source``; None: of any engine) into table ``physical``, as (source, batch_id,
        rows_total, updated_at, whether the row was written for the table now under that
        name, the key a merging sink merges by or None); none when ``sstore.watermarks`` does
        not exist (asked first unless ``known``, a plan's run reading watermarks its planning
        found, or this planning's ``probe`` saw it exist).

        ``with_rows``: each row also says whether the table has a row (7th value; None when
        no table has that name): one ``EXISTS`` in the same question, so that a plan's run
        notices a target emptied by hand (``TRUNCATE``) while the watermark counts delivered
        rows without a round trip of its own (``sstore.polystore.delivered``).

        Raises ``UndefinedTable`` when ``known`` and the watermarks table is gone."""
        import psycopg

        from migrators.postgres import split_name
        if not (known or self._watermarks_seen) and not self._execute(
                "SELECT to_regclass('sstore.watermarks') IS NOT NULL")[0][0]:
            return []
        schema, name = split_name(physical)
        full = f"{schema}.{name}"
        question = ("SELECT source, batch_id, rows_total, updated_at, "
                    "coalesce(target_oid = to_regclass(%s)::oid, false), "
                    "to_jsonb(w) ->> 'merge_key'{rows} "  # to_jsonb: an older table has no column
                    "FROM sstore.watermarks w "
                    "WHERE stream = %s AND (target IN (%s, %s) OR "
                    "target_oid = to_regclass(%s)::oid) AND "
                    "(%s::text IS NULL OR source = %s) ORDER BY source")
        params = (qualified(full), stream, full, name if schema == "public" else full,
                  qualified(full), source, source)
        try:
            if with_rows:
                try:  # evaluated once (an InitPlan): at most one row read
                    target = qualified(full).replace("%", "%%")  # not a placeholder
                    return self._execute(question.format(
                        rows=f", EXISTS (SELECT 1 FROM {target})"), params)
                except psycopg.errors.UndefinedTable:
                    pass  # the target (or the watermarks) is gone: ask without the EXISTS
                return [(*row, None) for row in self._execute(question.format(rows=""),
                                                              params)]
            return self._execute(question.format(rows=""), params)
        except psycopg.errors.UndefinedTable:
            if known:
                raise
            self._watermarks_seen = False  # dropped since the probe saw it
            return []

    def columns(self, physical: str) -> list[str]:
        from migrators.postgres import split_name
        schema, table = split_name(physical)
        return [r[0] for r in self._execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND "
            "table_name = %s ORDER BY ordinal_position", (schema, table))]

    def discover(self, schema: str = "public") -> list[tuple[str, str, dict[str, str]]]:
        rows = self._execute(
            "SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c "
            "JOIN information_schema.tables t ON t.table_schema = c.table_schema AND "
            "t.table_name = c.table_name WHERE c.table_schema = %s ORDER BY c.table_name, "
            "c.ordinal_position", (schema,))
        found = _group_columns([{"table_name": r[0], "column_name": r[1], "data_type": r[2]}
                                for r in rows])
        if schema == "public":
            return found
        return [(name, f"{schema}.{physical}", cols) for name, physical, cols in found]

    def fingerprint(self, sql: str) -> str:
        row = self._execute(f"SELECT count(*), sum(hashtext(q::text)::numeric) FROM ({sql}) AS q"
                            )[0]
        return f"{row[0]}:{row[1]}"

    def growth_since(self, sql: str, column: str, after: Any) -> Growth | None:
        """A table fed by a sink (``sstore.watermarks`` names it as a target; append mode, so
        no primary key or unique index; a ``column`` with the batch-id) grows only by whole
        batches: its watermark row says how far it reaches and how many rows the sink has
        written (``rows_total``), so what changed since a copy is read from one row, not from
        a scan. None for any other table (its copies are checked by fingerprint).

        The table is trusted to change only through its sink: rows written into it by hand
        are not seen by a copy made by batch (see docs/polystore.md)."""
        table = single_table(sql)
        if table is None:
            return None
        from migrators.postgres import split_name
        schema, name = split_name(table)
        found = self._execute(
            "SELECT c.relfilenode, (SELECT count(*) FROM pg_index i WHERE i.indrelid = c.oid "
            "AND i.indisunique), (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid "
            "AND a.attname = %s AND NOT a.attisdropped), "
            "to_regclass('sstore.watermarks') IS NOT NULL "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s", (column, schema, name))
        if not found or found[0][1] or not found[0][2] or not found[0][3]:
            return None
        full = f"{schema}.{name}"
        marks = self._execute(
            f"SELECT max(batch_id), sum(rows_total), count(*) FROM sstore.watermarks "
            f"WHERE {SINK_ROWS}",
            (full, name if schema == "public" else full, qualified(full), qualified(full)))
        return _sink_growth(marks[0] if marks else None, found[0][0])

    def cache_note(self, table: str) -> str | None:
        from migrators.postgres import split_name
        schema, name = split_name(table)
        found = self._execute(
            "SELECT obj_description(c.oid, 'pg_class') FROM pg_class c JOIN pg_namespace n ON "
            "n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s", (schema, name))
        return (found[0][0] or "") if found else None

    def cache_notes(self) -> dict[str, str]:
        """Every table of ``sstore_cache`` with its note, in one question (``probes``)."""
        found = self._execute(
            "SELECT n.nspname || '.' || c.relname, obj_description(c.oid, 'pg_class') "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s", (CACHE_SCHEMA,))
        return {r[0]: r[1] or "" for r in found}

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
        self._close_adbc()
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class SparkConnector:
    """A Spark session: stored tables are temporary views; PostgreSQL fragments are read by
    Spark over JDBC (see the executor), the rest arrives as Arrow."""

    kind = EngineKind.SPARK

    def __init__(self, name: str, master: str | None = None) -> None:
        self.name = name
        self.master = master or None

    @property
    def spark(self) -> Any:
        from migrators.spark_session import get_spark
        return get_spark(self.master)

    def fetch(self, sql: str) -> pa.Table:
        """Spark has no read-only mode: the check on the SQL is the guard."""
        check_query(sql, "spark")
        return self.spark.sql(sql).toArrow()

    def store(self, table: str, rows: pa.Table, mode: str = "replace",
              note: str | None = None, delete_below: tuple[str, Any] | None = None,
              expect_note: str | None = None) -> int:
        from migrators.spark import arrow_to_spark
        self._creatable(table, mode)
        arrow_to_spark(self.spark, rows).createOrReplaceTempView(table)
        return rows.num_rows

    def store_from_postgres(self, table: str, url: str, sql: str) -> None:
        from migrators.spark import postgres_to_dataframe
        self._creatable(table, "replace")
        check_query(sql, "postgres")
        postgres_to_dataframe(url, query=sql, spark=self.spark).createOrReplaceTempView(table)

    def _creatable(self, table: str, mode: str) -> None:
        check_owned(self.kind, self.name, table)
        if mode == "create" and self.exists(table):
            raise CastExistsError(f"{table} already exists in engine {self.name!r}")

    def exists(self, table: str) -> bool:
        return bool(self.spark.catalog.tableExists(table))

    def drop(self, table: str) -> None:
        check_owned(self.kind, self.name, table)
        self.spark.catalog.dropTempView(table)

    def row_count(self, physical: str) -> int:
        return int(self.spark.table(physical).count())

    def is_empty(self, physical: str) -> bool:
        return not self.spark.table(physical).take(1)

    def columns(self, physical: str) -> list[str]:
        return list(self.spark.table(physical).columns)

    def discover(self) -> list[tuple[str, str, dict[str, str]]]:
        found = []
        for table in self.spark.catalog.listTables():
            cols = {c.name: c.dataType for c in self.spark.catalog.listColumns(table.name)}
            found.append((table.name, table.name, cols))
        return found

    def fingerprint(self, sql: str) -> str:
        return str(self.spark.sql(sql).count())  # never a cache source that needs more

    def growth_since(self, sql: str, column: str, after: Any) -> Growth | None:
        return None  # never a cache source that grows by batch

    def cache_note(self, table: str) -> str | None:
        return None  # temporary views do not outlive the session: never a cache

    def cache_notes(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        return None


def _sink_growth(marks: tuple[Any, Any, Any] | None, origin: Any) -> Growth | None:
    """A sink-fed table's growth from its watermark row (max batch-id, rows written, sinks
    writing it); None unless exactly one sink writes it (several: their batch-ids do not line
    up)."""
    if not marks or not marks[2] or int(marks[2]) > 1:
        return None
    high, total = marks[0], int(marks[1] or 0)
    new = None  # the caller knows: rows written since its copy's ``total``
    return Growth(0 if total else None, high, total, new, str(origin))  # type: ignore[arg-type]


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


def _schema_and_name(table: str, default_schema: str) -> tuple[str, str]:
    schema, _, name = table.rpartition(".")
    return (schema or default_schema), name


def _pg_exists(cur: Any, table: str) -> bool:
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (qualified(table),))
    return bool(cur.fetchone()[0])


def _spark_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _group_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, str]]]:
    tables: dict[str, dict[str, str]] = {}
    for row in rows:
        tables.setdefault(row["table_name"], {})[row["column_name"]] = str(row["data_type"])
    return [(name, name, cols) for name, cols in tables.items()]
