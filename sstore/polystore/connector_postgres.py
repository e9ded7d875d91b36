"""The polystore's connector to a PostgreSQL database (ADBC reads, pgpq binary COPY writes)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pyarrow as pa

from sstore.base import retry
from sstore.base.readonly import check_query
from sstore.base.retry import Kind, RetryPolicy, kind_of
from sstore.base.sql import ident, literal, qualified
from sstore.polystore.catalog import EngineKind
from sstore.polystore.connector_base import (
    CacheMoved,
    Growth,
    Probed,
    group_columns,
    single_table,
)
from sstore.polystore.scratch import CACHE_SCHEMA, CastExistsError, check_owned


class PostgresConnector:
    """A PostgreSQL database: reads by ADBC (binary COPY into Arrow) in READ ONLY
    transactions, the planner's small questions on a psycopg connection whose transactions are
    all READ ONLY, both as the reader role (``migrators.reader``), stores by pgpq binary
    COPY with the table's note in the same transaction
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
        self._time_zone: str | None = None

    def time_zone(self) -> str:
        """PostgreSQL's session time zone (asked once per connector): plans that run a query
        elsewhere run it in this zone, so timestamptz values mean what they mean here."""
        if self._time_zone is None:
            self._time_zone = str(self._execute("SHOW TimeZone")[0][0])
        return self._time_zone

    def fetch(self, sql: str, time_zone: str | None = None) -> pa.Table:
        """Rows of ``sql`` as Arrow over the connector's ADBC connection (kept open: opening
        one costs ~70 ms here, a query on an open one under 1 ms); reopened once if the server
        dropped it. The SQL is checked to be a plain query and runs in a READ ONLY
        transaction, rolled back afterwards. ``time_zone`` is PostgreSQL's own: ignored."""
        import adbc_driver_postgresql.dbapi as adbc

        from migrators import reader
        from migrators.errors import MigrationError, PostgresUnavailable
        from migrators.postgres_to_engine import fetch_arrow
        from migrators.urls import parse as parse_url
        from migrators.urls import with_connect_timeout
        check_query(sql, "postgres")

        def attempt() -> pa.Table:
            try:
                if self._adbc is None:  # bounded like every sstore connection (libpq: forever)
                    con = adbc.connect(with_connect_timeout(reader.reader_url(self.url)))
                    try:  # after the connect: a silent server costs one connect timeout
                        reader.ensure(self.url)
                    except BaseException:
                        con.close()
                        raise
                    self._adbc = con
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
            return int(rows.num_rows)

        return int(self._write(work, f"store {table}"))

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
        """One question on the connector's own connection (as the reader role for the whole
        session: ``migrators.reader``; reopened after a failure): the planner asks several
        per query. Each runs in a READ ONLY transaction that is rolled back, never committed:
        a few functions write even there and even as the reader (``lo_create``: any role may
        create large objects), and a rollback leaves nothing of them."""
        import psycopg

        from migrators import reader
        from migrators.postgres import connect

        def attempt() -> list[tuple[Any, ...]]:
            if self._con is None or self._con.closed:
                reader.ensure(self.url)
                self._con = connect(reader.reader_url(self.url))
                self._con.autocommit = True  # the role for the session, outside any transaction
                self._con.execute(f"SET ROLE {ident(reader.role())}")
                self._con.autocommit = False
                self._con.read_only = True
            try:
                cur = self._con.execute(sql, params or None)
                return cur.fetchall() if cur.description else []
            except psycopg.Error as exc:
                if kind_of(exc) is Kind.TRANSIENT:
                    self._con.close()
                raise
            finally:
                if not self._con.closed:
                    with contextlib.suppress(psycopg.Error):
                        self._con.rollback()

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
        from migrators import watermarks
        from migrators.postgres import split_name
        schema, name = split_name(physical)
        table = qualified(physical).replace("%", "%%")  # in a query with %s placeholders
        marks_sql = watermarks.GROWTH_ARRAY_SQL
        marks_params = watermarks.target_params(schema, name)
        # a table no single sink feeds is counted in the same question (its rows price plans);
        # a sink-fed one is not scanned: its watermark row says how many rows it holds
        count_sql = (f"CASE WHEN {watermarks.WRITERS_SQL} "
                     f"= 1 THEN NULL ELSE (SELECT count(*) FROM {table}) END")
        question = (
            "SELECT (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a "
            "WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), "
            "(SELECT array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum) "
            "FROM pg_attribute a "
            "WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), "
            f"EXISTS (SELECT 1 FROM {table}), "
            "EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisunique), "
            f"c.relfilenode, {watermarks.EXISTS_SQL}, "
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
        cols, kinds, filled, unique, origin, has_marks, notes, marks, counted = found[0]
        columns = list(cols or [])
        types = dict(zip(columns, kinds or []))
        notes_by_table = {t: note for t, note in (notes or [])}
        self._watermarks_seen = bool(has_marks)
        growth = None
        if growing in columns and not unique and has_marks:
            if marks is None:  # not asked in the same question: this connection's first time
                row = self._execute(watermarks.GROWTH_SQL, marks_params)[0]
            else:
                row = (None if marks[0] is None else int(marks[0]), marks[1], int(marks[2]))
            growth = _sink_growth(row, origin)
        if not filled:
            return Probed(columns, 0, growth, notes_by_table, types=types)
        if growth is not None:
            return Probed(columns, max(1, growth.total), growth, notes_by_table, types=types)
        rows = int(counted) if counted is not None else self.row_count(physical)
        return Probed(columns, rows, None, notes_by_table, types=types)

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

        from migrators import watermarks
        from migrators.postgres import split_name
        if not (known or self._watermarks_seen) and not self._execute(
                f"SELECT {watermarks.EXISTS_SQL}")[0][0]:
            return []
        schema, name = split_name(physical)
        full = f"{schema}.{name}"
        question = watermarks.SINK_ROWS_SQL
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
        found = group_columns([{"table_name": r[0], "column_name": r[1], "data_type": r[2]}
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
        from migrators import watermarks
        from migrators.postgres import split_name
        schema, name = split_name(table)
        found = self._execute(
            "SELECT c.relfilenode, (SELECT count(*) FROM pg_index i WHERE i.indrelid = c.oid "
            "AND i.indisunique), (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid "
            f"AND a.attname = %s AND NOT a.attisdropped), {watermarks.EXISTS_SQL} "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s", (column, schema, name))
        if not found or found[0][1] or not found[0][2] or not found[0][3]:
            return None
        marks = self._execute(watermarks.GROWTH_SQL, watermarks.target_params(schema, name))
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


def _sink_growth(marks: tuple[Any, Any, Any] | None, origin: Any) -> Growth | None:
    """A sink-fed table's growth from its watermark row (max batch-id, rows written, sinks
    writing it); None unless exactly one sink writes it (several: their batch-ids do not line
    up)."""
    if not marks or not marks[2] or int(marks[2]) > 1:
        return None
    high, total = marks[0], int(marks[1] or 0)
    new = None  # the caller knows: rows written since its copy's ``total``
    return Growth(0 if total else None, high, total, new, str(origin))


def _pg_exists(cur: Any, table: str) -> bool:
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (qualified(table),))
    return bool(cur.fetchone()[0])
