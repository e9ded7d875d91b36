"""PostgreSQL plumbing shared by the migrators: connections, retries, binary COPY from Arrow.

Retries go through ``sstore.base.retry`` (the one retry helper) and act only on the terminal /
transient distinction, which ``migrators.pg_errors`` defines for PostgreSQL: a dropped or
refused connection, a terminated backend or a restarting server is transient and retried with
exponential backoff on a fresh connection; a constraint, a type error, a missing table or a
database that does not exist is terminal and raised at once. Every retry is logged and counted,
so an operator sees what happened.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from pgpq import ArrowToPostgresBinaryEncoder

from migrators import pg_errors  # noqa: F401 - registers PostgreSQL's retry classification
from migrators.errors import (
    IncompatibleSchemaError,
    MigrationError,
    PostgresUnavailable,
)
from migrators.typemap import check_compatible, postgres_columns
from migrators.urls import shown, with_connect_timeout
from sstore.base import retry
from sstore.base.errors import DeclarationError
from sstore.base.redact import mask_secrets
from sstore.base.retry import GaveUp, Kind, RetryPolicy, first_line, kind_of
from sstore.base.sql import ident, qualified

log = logging.getLogger("sstore.migrators")

T = TypeVar("T")

__all__ = ["RetryPolicy", "Session", "connect", "copy_arrow", "encode_copy", "ensure_table",
           "merge_rows", "parse_name", "split_name", "target_columns", "with_retries"]


def connect(url: str) -> psycopg.Connection:
    """A connection in explicit-transaction mode. An unreachable server is a transient
    ``PostgresUnavailable``; a database or role that does not exist, or refused credentials,
    a terminal ``MigrationError`` (waiting will not create them).

    Each attempt waits for an answer at most the URL's ``connect_timeout``, else
    ``SSTORE_PG_CONNECT_TIMEOUT``, else 5 s (``urls.with_connect_timeout``; psycopg waits at
    least 2 s): a caller whose retry budget is short must not lose 5 s to every silent try."""
    try:
        return psycopg.connect(with_connect_timeout(url))
    except psycopg.ProgrammingError as exc:  # a connection parameter psycopg itself rejects
        raise MigrationError(f"cannot connect to PostgreSQL at {shown(url)}: "
                             f"{first_line(exc)}") from exc
    except psycopg.OperationalError as exc:
        where = shown(url)
        if kind_of(exc) is Kind.TERMINAL:
            raise MigrationError(f"cannot connect to PostgreSQL at {where}: "
                                 f"{_connect_reason(exc)}") from exc
        raise PostgresUnavailable(f"PostgreSQL at {where} is unreachable: "
                                  f"{_connect_reason(exc)}") from exc


def _connect_reason(exc: BaseException) -> str:
    """libpq's message without its 'connection to server at ... failed:' preamble."""
    text = mask_secrets(" ".join(str(exc).split()))
    _, sep, reason = text.rpartition("failed: ")
    return reason if sep else first_line(exc)


class Session:
    """One PostgreSQL connection kept across units of work, replaced after a failure.

    ``run(work)`` hands ``work`` the connection (no transaction open); ``work`` commits what it
    wants kept. Transient failures roll back, drop the connection and try again on a new one
    (``sstore.base.retry.call``); terminal ones roll back and raise ``MigrationError`` (psycopg's
    errors) or the error as it is (sstore's own).
    """

    def __init__(self, url: str, policy: RetryPolicy | None = None,
                 stop: threading.Event | None = None) -> None:
        """``stop``: when set, a wait between retries ends at once (a stopping service)."""
        self.url = url
        self.policy = policy or RetryPolicy()
        self.stop = stop
        self._con: psycopg.Connection | None = None

    def run(self, work: Callable[[psycopg.Connection], T], what: str) -> T:
        def attempt() -> T:
            if self._con is None or self._con.closed:
                self._con = connect(self.url)
            try:
                return work(self._con)
            except BaseException as exc:
                if isinstance(exc, Exception) and kind_of(exc) is Kind.TRANSIENT:
                    self.close()
                else:
                    self._rollback()
                raise

        try:
            return retry.call(attempt, self.policy, what, stop=self.stop)
        except GaveUp as exc:
            raise PostgresUnavailable(str(exc)) from exc.__cause__
        except psycopg.Error as exc:
            raise MigrationError(f"{what}: {first_line(exc)}") from exc

    @property
    def connection(self) -> psycopg.Connection | None:
        """The open connection, if any (for tests and diagnostics)."""
        return self._con

    def _rollback(self) -> None:
        if self._con is not None and not self._con.closed:
            try:
                self._con.rollback()
            except psycopg.Error:
                self.close()

    def close(self) -> None:
        if self._con is not None:
            try:
                self._con.close()
            except psycopg.Error:
                pass
            self._con = None


def with_retries(url: str, work: Callable[[psycopg.Connection], T], policy: RetryPolicy,
                 what: str) -> T:
    """Run ``work`` on a fresh connection (closed afterwards), retrying transient failures."""
    session = Session(url, policy)
    try:
        return session.run(work, what)
    finally:
        session.close()


def copy_arrow(cur: psycopg.Cursor, table: str, rows: pa.Table,
               payload: bytes | None = None, sent: Callable[[], None] | None = None) -> int:
    """Binary COPY of an Arrow table into ``table`` (its columns by name, in its order).

    ``payload``: ``encode_copy(rows)``, made ahead of time (a sink encodes the next chunk in
    its reader thread while this one's COPY waits for PostgreSQL). ``sent``: called once the
    whole stream is handed to the socket, before waiting for PostgreSQL to take it: the
    moment a sink starts its reader thread on the next chunk. Started earlier, that thread
    held the GIL in its encoder while this one still had data to send."""
    if rows.num_rows == 0:
        return 0
    columns = ", ".join(ident(c) for c in rows.column_names)
    with cur.copy(f"COPY {qualified(table)} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
        for part in (payload,) if payload is not None else copy_parts(rows):
            copy.write(part)
        if sent is not None:
            sent()
    return int(rows.num_rows)


def copy_parts(rows: pa.Table) -> Iterator[bytes]:
    """The binary COPY stream of ``rows`` piece by piece: header, up to 65,536 rows at a
    time, trailer (sent as they are encoded, a big table is never held twice)."""
    encoder = ArrowToPostgresBinaryEncoder(rows.schema)
    yield encoder.write_header()
    for batch in rows.to_batches(max_chunksize=65536):
        yield encoder.write_batch(batch)
    yield encoder.finish()


def encode_copy(rows: pa.Table) -> bytes:
    """The whole binary COPY stream of ``rows``, for ``copy_arrow(payload=...)``."""
    return b"".join(copy_parts(rows))


TargetColumns = dict[str, tuple[str, int | None, int | None]]


def ensure_table(con: psycopg.Connection, table: str, schema: pa.Schema,
                 key: Sequence[str] = (), existing: TargetColumns | None = None,
                 source: str = "the rows") -> TargetColumns:
    """Create ``table`` from an Arrow schema (with ``key`` as primary key) if it is missing;
    if it exists, check that every column can take the rows (``IncompatibleSchemaError``).
    Returns the target's columns: name -> (data type, precision, scale) as
    ``target_columns`` gives them, so rows can be converted to a column that was widened
    and checked against a declared length (``typemap.for_target``).
    ``existing``: those columns, when the caller asked them already in this transaction.
    ``source``: what the rows are, for errors (``stream 'x'``, ``table 'y'``)."""
    wanted = postgres_columns(schema)
    missing = [k for k in key if k not in schema.names]
    if missing:
        raise DeclarationError(f"key column(s) {missing} are not among {schema.names}")
    pg_schema, _name = split_name(table)
    if existing is None:
        existing = target_columns(con, table)
    if existing:
        check_compatible(table, schema, existing, source)
        return existing
    cols = ", ".join(f"{ident(c)} {t}" for c, t in wanted)
    if key:
        cols += f", PRIMARY KEY ({', '.join(ident(k) for k in key)})"
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {ident(pg_schema)}")
    con.execute(f"CREATE TABLE IF NOT EXISTS {qualified(table)} ({cols})")
    return {}


def target_columns(con: psycopg.Connection, table: str) -> TargetColumns:
    """The columns of ``table`` as ``ensure_table`` returns them (none: no such table), in
    the caller's transaction: a writer asks them before it decides what its rows carry
    (a batch column the table has, ``engine_to_postgres``). Each is (data type, precision,
    scale); the precision is the declared one of whichever kind the type has: digits of a
    numeric, fractional-second digits of a timestamp or time (``timestamp(0)``: 0), length of
    a character type (``varchar(2)``: 2); NULL where none is declared."""
    pg_schema, name = split_name(table)
    return {column: (data_type, precision, scale) for column, data_type, precision, scale in
            con.execute("SELECT column_name, data_type, COALESCE(numeric_precision, "
                        "datetime_precision, character_maximum_length), numeric_scale "
                        "FROM information_schema.columns WHERE table_schema = %s AND "
                        "table_name = %s", (pg_schema, name)).fetchall()}


def last_per_key(rows: pa.Table, key: Sequence[str]) -> pa.Table:
    """Within one chunk a key may change several times; its last row (in batch order) wins,
    as it would have if every batch had been merged on its own."""
    if rows.num_rows < 2:
        return rows
    numbered = rows.append_column("__pos", pa.array(range(rows.num_rows), pa.int64()))
    last = numbered.group_by(list(key), use_threads=False).aggregate([("__pos", "max")])
    positions = last["__pos_max"].combine_chunks()
    return rows.take(positions.take(pc.array_sort_indices(positions)))


def merge_rows(cur: psycopg.Cursor, table: str, rows: pa.Table, key: Sequence[str]) -> None:
    """COPY into a staging table, then move its rows into ``table`` with ``INSERT ... ON
    CONFLICT (key) DO UPDATE``: binary COPY speed for rows that update existing ones. Keys
    must be unique within ``rows``. Needs an open transaction (the stage is emptied at every
    COMMIT).

    The staging table is a temporary table of the session, made once per shape of rows and
    kept, ``ON COMMIT DELETE ROWS`` (``stage_for``): PostgreSQL empties it at the end of
    every transaction, committed or not, without a new file or catalog row. A second merge of
    the same shape in one transaction finds the first one's rows still there and deletes them
    first (``stage_for`` asks, in the round trip that makes sure the stage exists). Before,
    the moving statement deleted the staged rows itself (a data-modifying CTE): 9-10 ms of an
    11,800-row DimTrade merge's 64, paid by every merge for the rare second one. A temporary
    table made and dropped per merge (earlier still) cost about 1 ms of catalog writes per
    delivery and left two catalog rows per column for autovacuum at every delivery."""
    if rows.num_rows == 0:
        return
    _refuse_null_keys(rows, key, f"a merge into {table}")
    stage = stage_for(cur, rows.schema)
    if cur.connection.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
        # autocommit without BEGIN: the COPY would commit on its own, the stage be emptied,
        # and the INSERT move nothing: every row lost without an error
        raise DeclarationError(f"merge into {table} needs an open transaction (the "
                               f"connection is in autocommit mode): send BEGIN first or use "
                               f"a connection with autocommit off")
    copy_arrow(cur, stage, rows)
    cols = [ident(c) for c in rows.column_names]
    names = ", ".join(cols)
    keys = ", ".join(ident(k) for k in key)
    sets = ", ".join(f"{c} = excluded.{c}" for c, name in zip(cols, rows.column_names)
                     if name not in key)
    action = f"DO UPDATE SET {sets}" if sets else "DO NOTHING"
    try:
        cur.execute(f"INSERT INTO {qualified(table)} ({names}) SELECT {names} FROM "
                    f"{qualified(stage)} ON CONFLICT ({keys}) {action}")
    except psycopg.errors.InvalidColumnReference:
        raise IncompatibleSchemaError(f"merge into {table} needs a primary key or unique "
                                      f"constraint on ({', '.join(key)})") from None
    except psycopg.errors.CardinalityViolation as exc:
        raise MigrationError(
            f"merge into {table}: two rows have one key ({', '.join(key)}) as PostgreSQL "
            f"compares keys: the same key twice, or keys that differ in the engine but not to "
            f"PostgreSQL (0.0 and -0.0, trailing blanks in a character(n) column, a "
            f"case-insensitive collation); which row wins would be undefined, so none is "
            f"merged ({first_line(exc)})") from None


def _refuse_null_keys(rows: pa.Table, key: Sequence[str], what: str) -> None:
    """A merge key with a NULL part is refused (``MigrationError``): PostgreSQL's ON CONFLICT
    never matches a NULL, so each such row would be appended, while the rows of one chunk
    (``last_per_key``) would collapse into one: what lands would depend on how batches were
    cut. A table the sink creates has the key as PRIMARY KEY, which refuses them too."""
    for k in key:
        if k in rows.column_names and rows.column(k).null_count:
            raise MigrationError(f"{what}: {rows.column(k).null_count} row(s) have NULL in "
                                 f"key column {k!r}; a merge key must not be NULL")


def stage_for(cur: psycopg.Cursor, schema: pa.Schema) -> str:
    """The session's staging table for rows of ``schema`` (``pg_temp.sstore_stage_<hash>``),
    created if this session has none yet, and empty: rows an earlier merge of this
    transaction staged are deleted (one round trip in the common case, where there are none:
    the CREATE and the check go as one simple-protocol message). Its columns are the rows'
    own types (``postgres_columns``, what binary COPY encodes them as), not the target's: a
    target altered since (a widened column) cannot make a kept stage stale, and the INSERT
    from it casts each column to the target's type as a COPY into the target would."""
    columns = postgres_columns(schema)
    digest = hashlib.sha1(json.dumps(columns).encode(), usedforsecurity=False).hexdigest()
    stage = f"sstore_stage_{digest[:16]}"
    defs = ", ".join(f"{ident(c)} {pg_type}" for c, pg_type in columns)
    cur.execute(f"CREATE TEMPORARY TABLE IF NOT EXISTS {ident(stage)} ({defs}) "
                f"ON COMMIT DELETE ROWS; SELECT EXISTS (SELECT FROM pg_temp.{ident(stage)})")
    cur.nextset()
    staged = cur.fetchone()
    if staged is not None and staged[0]:
        cur.execute(f"DELETE FROM pg_temp.{ident(stage)}")
    return f"pg_temp.{stage}"


def split_name(table: str) -> tuple[str, str]:
    """``schema.table`` -> (schema, table); a bare name is in ``public``. Anything else
    (``a.b.c``, empty parts) is a ``DeclarationError``. Quoted parts are unquoted
    (``parse_name``)."""
    schema, name = parse_name(table)
    return (schema if schema is not None else "public", name)


def parse_name(table: str) -> tuple[str | None, str]:
    """``TABLE`` or ``SCHEMA.TABLE`` -> (schema or None, table), each part as PostgreSQL
    names it: a quoted part (``"Orders"``, ``""`` for a quote inside) is unquoted, an unquoted
    one is taken as written (sstore never folds case: ``Orders`` is the table ``"Orders"``).

    Why one parser: the watermark of a delivery is keyed on the table's canonical name
    (``watermarks.canonical_target``), so every spelling a user may give (``x``, ``public.x``,
    ``"public"."x"``) must name the same parts. A part holding a dot cannot be written in the
    canonical ``schema.table`` form, so it is refused with the malformed names."""
    bad = DeclarationError(f"target table must be TABLE or SCHEMA.TABLE, not {table!r}")
    if not isinstance(table, str):
        raise bad
    parts: list[str] = []
    i, n = 0, len(table)
    while True:
        if i < n and table[i] == '"':
            part, i = _quoted_part(table, i + 1, bad)
        else:
            end = table.find(".", i)
            end = n if end < 0 else end
            part, i = table[i:end], end
            if '"' in part or not part.strip():
                raise bad
        if not part or "." in part:
            raise bad
        parts.append(part)
        if i == n:
            break
        if table[i] != ".":
            raise bad
        i += 1
    if len(parts) > 2:
        raise bad
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])


def _quoted_part(text: str, start: int, bad: DeclarationError) -> tuple[str, int]:
    """The identifier quoted from ``start`` (just past its opening quote) and the index just
    past its closing quote; ``""`` inside stands for one quote."""
    out: list[str] = []
    j = start
    while True:
        k = text.find('"', j)
        if k < 0:
            raise bad
        out.append(text[j:k])
        if text.startswith('""', k):
            out.append('"')
            j = k + 2
            continue
        return "".join(out), k + 1
