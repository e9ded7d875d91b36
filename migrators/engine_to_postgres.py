"""Engine stream -> PostgreSQL table, incrementally and exactly once.

BigDAWG's S-Store-to-Postgres migrator deleted rows at the source before the target committed,
so a crash lost them. Here the source keeps every batch until the target has committed it:

Commit protocol of one chunk (consecutive committed batches ``first``..``last`` of the stream):

1. Read the chunk's rows from the engine (they are there: the stream is held for this consumer,
   so garbage collection keeps them until step 6).
2. In PostgreSQL, BEGIN and lock this (source, target) watermark row (``SELECT ... FOR UPDATE``):
   concurrent migrators of the same pair queue here.
3. If the watermark is already at or past ``last``, the chunk is there: skip to step 6.
   Rows of batches at or below the watermark are dropped (never loaded twice).
4. Binary COPY the rows: straight into the target (append), or into a temporary table and then
   ``INSERT ... ON CONFLICT (key) DO UPDATE`` (merge).
5. Set the watermark to ``last`` and COMMIT: rows and watermark become visible together, so a
   partial chunk is never visible.
6. Acknowledge ``last`` to the engine; only now may garbage collection remove those batches.

A crash before 5 leaves nothing in PostgreSQL; a crash between 5 and 6 is repaired when the
migrator starts (``start`` acknowledges what the watermark says); so neither loss nor
duplication. PostgreSQL being away or dropping the connection is retried with backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from migrators.errors import MigrationError
from migrators.postgres import (
    RetryPolicy,
    Session,
    copy_arrow,
    ensure_table,
    merge_rows,
)
from migrators.typemap import for_copy
from sstore.engine import Engine
from sstore.errors import DeclarationError
from sstore.subscriptions import Subscription

log = logging.getLogger("sstore.migrators")

WATERMARKS = "sstore.watermarks"
READ_AHEAD_ROWS = 100_000
WATERMARK_DDL = """
CREATE SCHEMA IF NOT EXISTS sstore;
CREATE TABLE IF NOT EXISTS sstore.watermarks (
    source TEXT NOT NULL, target TEXT NOT NULL, batch_id BIGINT NOT NULL,
    rows_total BIGINT NOT NULL DEFAULT 0, updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, target))
"""


def lock_watermark(cur: psycopg.Cursor, source: str, target: str) -> int:
    """In the caller's open transaction: create the (source, target) watermark row if it is
    missing, lock it (``FOR UPDATE``: concurrent writers of the pair queue here) and return
    the last batch-id it records. Every exactly-once loader into PostgreSQL starts here."""
    cur.execute(f"INSERT INTO {WATERMARKS} (source, target, batch_id) VALUES (%s, %s, 0) "
                f"ON CONFLICT DO NOTHING", (source, target))
    row = cur.execute(f"SELECT batch_id FROM {WATERMARKS} WHERE source = %s AND target = %s "
                      f"FOR UPDATE", (source, target)).fetchone()
    return int(row[0]) if row else 0


@dataclass
class Chunk:
    first: int
    last: int
    rows: int
    batches: int


def last_per_key(rows: pa.Table, key: Sequence[str]) -> pa.Table:
    """Within one chunk a key may change several times; its last row (in batch order) wins,
    as it would have if every batch had been merged on its own."""
    if rows.num_rows < 2:
        return rows
    numbered = rows.append_column("__pos", pa.array(range(rows.num_rows), pa.int64()))
    last = numbered.group_by(list(key), use_threads=False).aggregate([("__pos", "max")])
    positions = last["__pos_max"].combine_chunks()
    return rows.take(positions.take(pc.array_sort_indices(positions)))


@dataclass
class MigrationReport:
    chunks: int = 0
    batches: int = 0
    rows: int = 0
    seconds: float = 0.0
    retries: int = 0
    watermark: int = 0
    chunk_seconds: list[float] = field(default_factory=list)

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


@dataclass
class StreamToPostgres:
    """Moves a stream's committed batches into a PostgreSQL table (see the module docstring).

    ``mode`` is "append" (new rows) or "merge" (``key`` columns identify rows to update).
    ``batch_column`` names a target column for the batch-id (none by default).
    ``before_commit`` is a test hook called with the open connection after COPY, before COMMIT.
    ``ack_every`` (seconds): acknowledgements to the engine are grouped (each one is a DuckDB
    commit); correctness does not depend on them, since the watermark decides on restart, only
    how soon garbage collection may remove migrated batches.
    """

    engine: Engine
    stream: str
    url: str
    table: str
    mode: str = "append"
    key: Sequence[str] = ()
    chunk_rows: int = 10_000
    batch_column: str | None = None
    source: str | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    before_commit: Callable[[psycopg.Connection], None] | None = None
    ack_every: float = 1.0
    _ready: bool = field(default=False, init=False)
    _session: Session | None = field(default=None, init=False)
    _unacked: int = field(default=0, init=False)
    _acked_at: float = field(default=0.0, init=False)
    _mutex: threading.Lock = field(default_factory=threading.Lock, init=False)
    _wake: threading.Event = field(default_factory=threading.Event, init=False)
    _stopping: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _subscription: Subscription | None = field(default=None, init=False)
    last_error: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.mode not in ("append", "merge"):
            raise DeclarationError(f"mode must be 'append' or 'merge', not {self.mode!r}")
        if self.mode == "merge" and not self.key:
            raise DeclarationError("merge mode needs key columns")
        if self.chunk_rows < 1:
            raise DeclarationError("chunk_rows must be at least 1")
        self.key = tuple(self.key)
        self.source = self.source or f"sstore:{self.stream}"

    @property
    def consumer(self) -> str:
        return f"migrator:{self.table}"

    # ------------------------------------------------------------------ setup
    def start(self) -> int:
        """Hold the stream, prepare the target, reconcile with the watermark; return it."""
        self.engine.hold(self.stream, self.consumer)
        schema = self.engine.schema(self.stream)
        watermark = self.session.run(lambda con: self._prepare(con, schema),
                                     f"prepare {self.table}")
        if watermark > self.engine.acknowledged(self.consumer):
            self.engine.acknowledge(self.consumer, watermark)  # crashed between steps 5 and 6
        self._ready = schema is not None
        return watermark

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = Session(self.url, self.retry)
        return self._session

    def close(self) -> None:
        """Acknowledge what is pending and close the PostgreSQL connection."""
        self._acknowledge(force=True)
        if self._session is not None:
            self._session.close()

    def _prepare(self, con: psycopg.Connection, schema: pa.Schema | None) -> int:
        for statement in WATERMARK_DDL.split(";"):
            if statement.strip():
                con.execute(statement)
        if schema is not None:
            ensure_table(con, self.table, self._target_schema(schema), self.key)
        row = con.execute(f"SELECT batch_id FROM {WATERMARKS} WHERE source = %s AND target = %s",
                          (self.source, self.table)).fetchone()
        con.commit()
        return int(row[0]) if row else 0

    def _target_schema(self, schema: pa.Schema) -> pa.Schema:
        if self.batch_column:
            return schema.insert(0, pa.field(self.batch_column, pa.int64()))
        return schema

    # ------------------------------------------------------------------ moving
    def run_once(self, progress: Callable[[int, int], None] | None = None) -> MigrationReport:
        """Move every committed batch not yet in PostgreSQL, chunk by chunk; then return.

        ``progress(rows_done, rows_total)`` is called after each chunk."""
        report = MigrationReport()
        began = time.perf_counter()
        retries_before = self.retry.retries_done
        report.watermark = self.start()
        chunks = self._chunks(report.watermark)
        total = sum(c.rows for c in chunks)
        for chunk, rows in self._read_ahead(chunks):
            t0 = time.perf_counter()
            moved = self._move_chunk(chunk.first, chunk.last, rows)
            report.chunk_seconds.append(time.perf_counter() - t0)
            report.chunks += 1
            report.rows += moved
            report.batches += chunk.batches
            report.watermark = chunk.last
            if progress is not None:
                progress(report.rows, total)
        self.close()
        report.seconds = time.perf_counter() - began
        report.retries = self.retry.retries_done - retries_before
        return report

    def _chunks(self, after: int) -> list[Chunk]:
        """Consecutive batches grouped up to ``chunk_rows`` rows (a bigger batch goes alone)."""
        chunks: list[Chunk] = []
        current: Chunk | None = None
        for batch_id, n in self.engine.batches(self.stream, after):
            if current is not None and current.rows + n > self.chunk_rows:
                chunks.append(current)
                current = None
            if current is None:
                current = Chunk(batch_id, batch_id, 0, 0)
            current.last, current.rows, current.batches = batch_id, current.rows + n, \
                current.batches + 1
        if current is not None:
            chunks.append(current)
        return chunks

    def _read_ahead(self, chunks: list[Chunk]) -> Iterator[tuple[Chunk, pa.Table]]:
        """Step 1 for several chunks at once: one DuckDB query per ``READ_AHEAD_ROWS`` rows
        (a query costs milliseconds whatever its size), sliced into chunks in memory."""
        i = 0
        while i < len(chunks):
            group = [chunks[i]]
            while (i + len(group) < len(chunks)
                   and sum(c.rows for c in group) + chunks[i + len(group)].rows <= READ_AHEAD_ROWS):
                group.append(chunks[i + len(group)])
            rows = self.engine.read_batches(self.stream, group[0].first, group[-1].last)
            ids = rows["_batch_id"].to_numpy()
            for chunk in group:
                lo = int(np.searchsorted(ids, chunk.first, side="left"))
                hi = int(np.searchsorted(ids, chunk.last, side="right"))
                yield chunk, rows.slice(lo, hi - lo)
            i += len(group)

    def _move_chunk(self, first: int, last: int, rows: pa.Table | None = None) -> int:
        if rows is None:
            rows = self.engine.read_batches(self.stream, first, last)  # step 1
        if not self._ready:
            self.start()
        moved = self.session.run(lambda con: self._load(con, rows, first, last),
                                 f"migrate {self.stream} batches {first}-{last}")
        self._unacked = last
        self._acknowledge(force=False)  # step 6
        return moved

    def _acknowledge(self, force: bool) -> None:
        now = time.monotonic()
        if self._unacked and (force or now - self._acked_at >= self.ack_every):
            self.engine.acknowledge(self.consumer, self._unacked)
            self._unacked, self._acked_at = 0, now

    def _load(self, con: psycopg.Connection, rows: pa.Table, first: int, last: int) -> int:
        row = con.execute(f"SELECT batch_id FROM {WATERMARKS} WHERE source = %s AND target = %s "
                          f"FOR UPDATE", (self.source, self.table)).fetchone()  # step 2
        watermark = int(row[0]) if row else 0
        if watermark >= last:  # step 3
            con.rollback()
            return 0
        if watermark >= first:
            rows = rows.filter(pc.greater(rows["_batch_id"], watermark))
        data = rows if self.batch_column else rows.drop_columns(["_batch_id"])
        if self.batch_column:
            data = data.rename_columns([self.batch_column, *data.column_names[1:]])
        data = for_copy(data if self.mode == "append" else last_per_key(data, self.key))
        with con.cursor() as cur:  # step 4
            if self.mode == "append":
                copy_arrow(cur, self.table, data)
            else:
                merge_rows(cur, self.table, data, self.key)
            cur.execute(f"INSERT INTO {WATERMARKS} (source, target, batch_id, rows_total) "
                        f"VALUES (%s, %s, %s, %s) ON CONFLICT (source, target) DO UPDATE SET "
                        f"batch_id = excluded.batch_id, updated_at = now(), rows_total = "
                        f"{WATERMARKS}.rows_total + excluded.rows_total",
                        (self.source, self.table, last, data.num_rows))  # step 5
        if self.before_commit is not None:
            self.before_commit(con)
        con.commit()
        return data.num_rows

    # ------------------------------------------------------------------ continuous
    def attach(self, background: bool = True) -> None:
        """Feed the target as batches commit.

        Each committed batch of the stream wakes a sink thread that moves what is pending (its
        own PostgreSQL transactions, never under the engine's lock), so stream processing does
        not wait for PostgreSQL; if PostgreSQL is away the sink keeps retrying and the engine
        keeps the batches. ``background=False`` moves them in the committing thread instead.
        """
        self.start()
        if not background:
            self._subscription = self.engine.subscribe(self.stream,
                                                       lambda _b, _t: self.run_pending())
            return
        self._wake.set()  # move whatever is already committed
        self._stopping.clear()
        self._thread = threading.Thread(target=self._sink_loop, daemon=True,
                                        name=f"sstore-sink-{self.table}")
        self._thread.start()
        self._subscription = self.engine.subscribe(self.stream, lambda _b, _t: self._wake.set())

    def _sink_loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            try:
                self.run_pending()
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - a sink must outlive a bad minute
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.error("sink %s -> %s: %s; will try again", self.stream, self.table,
                          self.last_error)
                self._stopping.wait(self.retry.max_delay)
                self._wake.set()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every batch committed so far is in PostgreSQL; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pending = self.engine.batches(self.stream, self.engine.acknowledged(self.consumer))
            if not pending:
                return True
            self._wake.set()
            time.sleep(0.01)
        return False

    def detach(self) -> None:
        """Stop feeding: finish the chunk in flight, acknowledge, close the connection."""
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None
        if self._thread is not None:
            self._stopping.set()
            self._wake.set()
            self._thread.join()
            self._thread = None
        with self._mutex:
            self.close()

    def run_pending(self) -> int:
        """Move what has committed since the last acknowledgement (one caller at a time)."""
        with self._mutex:
            after = max(self.engine.acknowledged(self.consumer), self._unacked)
            moved = sum(self._move_chunk(c.first, c.last) for c in self._chunks(after))
            self._acknowledge(force=True)
            return moved


def migrate_stream(engine: Engine, url: str, stream: str, table: str, mode: str = "append",
                   key: Sequence[str] = (), chunk_rows: int = 10_000) -> MigrationReport:
    """Move everything committed on ``stream`` and not yet in ``table``; then return."""
    if stream not in engine.graph.streams and not engine.graph.is_stream(stream):
        raise MigrationError(f"no stream {stream!r} in this engine")
    return StreamToPostgres(engine, stream, url, table, mode, tuple(key), chunk_rows).run_once()
