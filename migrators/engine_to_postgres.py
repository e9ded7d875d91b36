"""Engine stream -> PostgreSQL table, incrementally and exactly once.

BigDAWG's S-Store-to-Postgres migrator deleted rows at the source before the target committed,
so a crash lost them. Here the source keeps every batch until the target has committed it, and
every chunk goes through the one delivery protocol (``migrators.delivery``: lock the watermark
of (engine id, stream, target), check the target, COPY, merge, advance, COMMIT, acknowledge).

A sink's life:

1. Created before the engine starts, it declares itself as a consumer of the stream
   (``Engine.consumer``): the engine keeps every batch for it from the first one on.
2. ``start``: the stream and the key columns are checked, the target is created or checked,
   the watermark is read (``delivery.claim``), and only then is the stream held (a start that
   fails leaves no hold behind). The watermark and the engine's acknowledgement are reconciled:
   a watermark ahead of the acknowledgement (a crash between COMMIT and acknowledgement) is
   acknowledged; a watermark behind it (the target was dropped or emptied by hand) moves the
   acknowledgement back, so the engine delivers those batches again. If garbage collection
   already removed batches the target lacks, the sink refuses to start (``GapError``), unless
   the gap is accepted (``accept_gap``): then it is recorded and the watermark moves past it.
3. Each chunk (consecutive committed batches ``first``..``last``, up to ``chunk_rows`` rows,
   a batch never split) is read from the engine and delivered (``delivery.deliver``); a
   target found behind the plan (``TargetBehind``) sends the sink back to step 2.
4. The engine is told (acknowledgements grouped by ``ack_every`` seconds); only then may
   garbage collection remove the batches.

A sink's ``side`` (``migrators.sink_target.SinkTarget``) knows its table: name, column types,
fence, fingerprint, the columns it follows with, the rows written for it. This module says
WHAT to write and keeps the sink's bookkeeping; it starts no thread. WHEN
and by whom is ``migrators.sink_runner``'s: one runner drives one sink or a group of them
(``SinkGroup``), in a thread of its own as batches commit (``attach``), in the committing
thread, or once (``run_once``). Transient failures (PostgreSQL away, a terminated backend)
are retried for as long as it runs; a terminal one (a schema mismatch, a gap, a target
claimed by another state file) halts the sink (``halt``), records the error in the engine
(``status`` shows it) and makes ``flush`` raise it. ``attach``, ``flush``, ``detach``,
``run_pending`` and ``run_once`` here are conveniences that hand the sink to a runner of one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from migrators import backfill, delivery, watermarks
from migrators.delivery import SinkKey
from migrators.errors import MigrationError
from migrators.postgres import RetryPolicy, Session, parse_name, with_retries
from migrators.read_ahead import Chunk, Converted, in_batch_order, in_chunks
from migrators.recent_batches import RecentBatches
from migrators.sink_runner import MigrationReport, SinkRunner
from migrators.sink_target import SinkTarget
from sstore.base.errors import DeclarationError, GapError, SStoreError
from sstore.base.retry import first_line
from sstore.base.sql import ident
from sstore.engine import Engine
from sstore.execution.backpressure import Bound
from sstore.execution.consumer_port import ConsumerPort
from sstore.observe.sinks import SinkSnapshot

log = logging.getLogger("sstore.migrators")

#: an acknowledgement waits for a busy engine's lock only once it is this old (seconds)
ACK_WAIT_MAX = 0.5


@dataclass(frozen=True)
class Delivered:
    """A chunk that reached PostgreSQL (the ``on_delivered`` hook): its batch range, the
    batches that had rows in it, how many rows, and ``time.perf_counter()`` after COMMIT."""

    first: int
    last: int
    batch_ids: list[int]
    rows: int
    committed_at: float


@dataclass
class StreamToPostgres:
    """Moves a stream's committed batches into a PostgreSQL table (see the module docstring).

    ``mode`` is "append" (new rows) or "merge" (``key`` columns identify rows to update).
    ``batch_column`` names a target column for the batch-id (none by default). A target that
    has a ``_batch_id`` column while the sink has no batch column is refused
    (``IncompatibleSchemaError``): its rows would carry NULL batch ids, which anything that
    filters or replaces by batch id misses. ``detect_batch_column``: take that column as the
    batch column instead (``sstore migrate``, which cannot know how a program's sink made
    the table).
    ``accept_gap``: start even if garbage collection removed batches the target lacks (the gap
    is recorded in the engine). ``shared_target``: other state files feed the same stream
    into the same table on purpose (otherwise that is refused). ``drained_target``: another
    process takes rows out of the table on purpose (a staging table it empties); otherwise a
    target found empty while its watermark counts delivered rows (a ``TRUNCATE`` by hand) starts
    over like a dropped one: what the engine still has is delivered again, the rest is a gap.
    ``on_delivered`` is called with a ``Delivered`` after each chunk's COMMIT (metrics).
    ``before_commit`` is a test hook called with the open connection after COPY, before COMMIT.
    ``ack_every`` (seconds): acknowledgements to the engine are grouped (each is taken in memory
    and written with the engine's next group commit or GC); correctness does not depend on
    them, since the watermark decides on restart, only how soon garbage collection may remove
    migrated batches (and how soon an ingest waiting for this sink under backpressure goes
    on).
    ``max_lag``: this sink's backpressure bound (``sstore.Bound``: batches and bytes it may
    leave retained before ingests upstream wait); None: the engine's default
    (``Engine(max_lag=...)``; see ``sstore.execution.backpressure``).
    """

    engine: Engine
    stream: str
    url: str = field(repr=False)  # a repr in a log or traceback must not show a password
    table: str
    mode: str = "append"
    key: Sequence[str] = ()
    chunk_rows: int = 10_000
    batch_column: str | None = None
    detect_batch_column: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    before_commit: Callable[[psycopg.Connection], None] | None = None
    on_delivered: Callable[[Delivered], None] | None = None
    ack_every: float = 1.0
    accept_gap: bool = False
    shared_target: bool = False
    drained_target: bool = False
    max_lag: Bound | None = None
    last_error: str | None = field(default=None, init=False)
    halted: str | None = field(default=None, init=False)
    _after: int | None = field(default=None, init=False)  # the target has every batch to here
    #: the target: its canonical name, column types, fence and follow, learnt at each start,
    #: and the rows as it takes them (``migrators.sink_target``)
    side: SinkTarget = field(init=False, repr=False)
    _session: Session | None = field(default=None, init=False)
    _port: ConsumerPort | None = field(default=None, init=False)
    _unacked: int = field(default=0, init=False)
    _unacked_since: float = field(default=0.0, init=False)  # when _unacked last left 0
    _acked_at: float = field(default=0.0, init=False)
    #: one caller at a time moves this sink's batches (its runner, ``run_once``, ``reset``)
    mutex: threading.Lock = field(default_factory=threading.Lock, init=False)
    #: set by the runner that stops feeding: cuts short the retries of this sink's session
    cancel: threading.Event = field(default_factory=threading.Event, init=False)
    #: the runner feeding this sink as batches commit (``migrators.sink_runner``), if any
    runner: SinkRunner | None = field(default=None, init=False)
    _rows_moved: int = field(default=0, init=False)  # by this object, for metrics
    _batches_moved: int = field(default=0, init=False)
    _loop_retries: int = field(default=0, init=False)  # retries of its runner's loop
    #: batches handed over by the subscription that wakes the runner, not yet delivered
    _recent: RecentBatches = field(default_factory=RecentBatches, init=False)

    def __post_init__(self) -> None:
        if self.mode not in ("append", "merge"):
            raise DeclarationError(f"mode must be 'append' or 'merge', not {self.mode!r}")
        if self.mode == "merge" and not self.key:
            raise DeclarationError("merge mode needs key columns")
        if self.chunk_rows < 1:
            raise DeclarationError("chunk_rows must be at least 1")
        parse_name(self.table)  # a malformed target name fails here, before any hold
        self.key = tuple(self.key)
        self.side = SinkTarget(self.engine, self.stream, self.table, self.mode, self.key,
                               self.batch_column, self.detect_batch_column,
                               self.shared_target, self.drained_target)
        if self.max_lag is not None:
            self.engine.backpressure.bound(self.consumer, self.max_lag)
        if not self.engine.started and not self.engine.foreign:
            self.engine.consumer(self.stream, self.consumer)  # kept from the first batch on
        self.engine.register_sink(self)  # seen by the engine's metrics and /status

    def metrics_snapshot(self) -> SinkSnapshot:
        """This sink's numbers for the engine's metrics (``sstore.observe.sinks``): read
        from its own fields, no I/O and no engine call."""
        runner = self.runner
        return SinkSnapshot(self.consumer, self.stream, self.target, self._after,
                            self._rows_moved, self._batches_moved,
                            self.retry.retries_done + self._loop_retries, self.last_error,
                            self.halted, runner is not None and runner.attached,
                            runner is not None and runner.threaded)

    @property
    def consumer(self) -> str:
        return f"migrator:{self.table}"

    @property
    def target(self) -> str:
        """The table as PostgreSQL names it (``schema.table``) once the sink started; the
        spelling given before. Every statement and the watermark's key use it, so that
        ``x``, ``public.x`` and ``"public"."x"`` feed one watermark of one table."""
        return self.side.target

    @property
    def sink_key(self) -> SinkKey:
        return self.side.sink_key

    @property
    def port(self) -> ConsumerPort:
        """Everything this sink asks of the engine about its stream, each call checked
        against what the stream committed (``sstore.execution.consumer_port``); made when first
        used, after the engine started."""
        if self._port is None:
            self._port = self.engine.port(self.stream, self.consumer)
        return self._port

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = Session(self.url, self.retry, stop=self.cancel)
        return self._session

    @property
    def after(self) -> int | None:
        """The batch the target has everything up to, as this sink last learnt it (None: not
        started, or released; the next delivery starts again)."""
        return self._after

    @property
    def acks_pending(self) -> bool:
        """Whether a delivery has not been acknowledged to the engine yet (held back by
        ``ack_every``): the runner then wakes up to tell it even when no batch commits."""
        return bool(self._unacked)

    # ------------------------------------------------------------------ setup
    def start(self, *, keep_fence: bool = False) -> int:
        """Step 2 of the module docstring; returns the batch the sink continues after.
        ``keep_fence``: check the fence this sink took (``FencedError`` if another writer
        took it since) instead of taking it anew (``plan``, at the stream's first rows)."""
        engine = self.engine
        halted = self.port.halted()
        if halted is not None:
            raise MigrationError(f"sink {self.stream} -> {self.table} ({self.consumer}) is "
                                 f"halted since {halted}; fix the cause, then resume it: "
                                 f"sstore resume STATE {self.consumer} (or Engine.resume)")
        if not engine.graph.is_stream(self.stream):
            raise MigrationError(f"no stream {self.stream!r} in this engine; streams: "
                                 f"{sorted(engine.graph.streams)}")
        schema = engine.schema(self.stream)
        missing = [k for k in self.key if schema is not None and k not in schema.names]
        if missing:
            raise DeclarationError(f"key column(s) {missing} are not columns of stream "
                                   f"{self.stream!r} ({schema.names if schema else []})")
        claimed = self.session.run(lambda con: self.side.claim(con, schema, keep_fence),
                                   f"prepare {self.table}")
        watermark, self.side.epoch = claimed.batch_id, claimed.epoch
        new_hold = self.port.hold()
        try:
            after = self._continue_from(claimed)
            if after > watermark:  # an accepted gap: the target's watermark moves past it
                self.session.run(lambda con: self.side.skip_gap(con, watermark, after),
                                 f"record the accepted gap in {self.table}")
            acked = self.port.acknowledged()
            if after > acked:
                self.port.acknowledge(after)  # crashed between COMMIT and ack
            elif after < acked:
                log.warning("%s: the target has batches up to %d only, the engine had been "
                            "told %d; delivering them again", self.sink_key, after, acked)
                self.port.rewind(after)
        except BaseException:
            if new_hold:
                self.port.drop()
            raise
        self._after, self._unacked = after, 0
        return after

    def _continue_from(self, claimed: delivery.Watermark) -> int:
        """``Engine.continue_from`` after the target's watermark; its ``GapError`` says which
        batches the target had held when it lost them.

        The watermark's reset to 0 is committed before this check (a later start must not
        count batches in a table that lost them), so after a first failed start PostgreSQL
        no longer knows them: the engine does (its acknowledgement, which a failed start never
        moves back), and this start's claim knows them when it was the one that reset."""
        try:
            return self.port.continue_from(claimed.batch_id, accept_gap=self.accept_gap)
        except GapError as gap:
            delivered = max(claimed.previous, self.port.acknowledged())
            if delivered <= claimed.batch_id:
                raise
            raise GapError(gap.stream, gap.consumer, gap.first, gap.last, why=(
                f"they had been delivered into {self.table} up to batch {delivered} and "
                f"acknowledged, and {self.table} has since lost them: dropped, recreated or "
                f"emptied, or its watermark reset, it holds batches up to {claimed.batch_id} "
                f"only")) from None

    def reset(self) -> int:
        """Forget what the target was given, so that every batch the engine still has is
        delivered again (``sstore migrate --reset``): the target's watermarks of the stream
        (every source's: ``watermarks.reset``), then this consumer's acknowledgement. Returns
        the watermarks forgotten.

        Refused (``ResetRefused``), nothing forgotten, while the target holds rows that the
        batches delivered again would not merge into (an append: ``watermarks.reset``), or
        rows of intervals sealed by a stream or replaced by a backfill
        (``backfill.check_reset``). The intervals are looked up under the table's canonical
        name (as a backfill records it) and the spelling given. One transaction."""
        def forget(con: psycopg.Connection) -> int:
            watermarks.ensure_watermarks(con)
            with con.cursor() as cur:
                canonical = watermarks.canonical_target(cur, self.table).name
            for name in dict.fromkeys((canonical, self.table)):
                backfill.check_reset(con, name)
            return watermarks.reset(con, self.stream, self.table,
                                  self.key if self.mode == "merge" else ())

        with self.mutex:
            forgotten = with_retries(self.url, forget, self.retry, f"reset {self.table}")
            self.port.rewind(0)
            self._after = None  # a running sink plans again from the watermark
        return forgotten

    def close(self) -> None:
        """Acknowledge what is pending and close the PostgreSQL connection."""
        self.acknowledge(force=True)
        if self._session is not None:
            self._session.close()

    def release(self) -> None:
        """``close``, and forget where the target stands: the next delivery starts again
        (``start``). A runner that stops feeding the sink calls it, holding ``mutex``."""
        self.close()
        self._after = None

    # ------------------------------------------------------------------ conveniences
    def run_once(self, progress: Callable[[int, int], None] | None = None) -> MigrationReport:
        """Move every committed batch not yet in PostgreSQL, chunk by chunk; then return
        (``SinkRunner.run_once``). ``progress(rows_done, rows_total)`` after each chunk."""
        return SinkRunner([self]).run_once(progress)

    def run_pending(self, ack: bool = True) -> int:
        """Move what has committed since the last delivery, in the caller's thread (one
        caller at a time); returns the rows moved. A terminal error is raised, not recorded
        as a halt (``SinkRunner.run_pending``).

        ``ack``: tell the engine at once; otherwise only once ``ack_every`` has passed."""
        return SinkRunner([self]).run_pending(ack=ack, halt=False)

    def attach(self, background: bool = True) -> None:
        """Feed the target as batches commit: a runner of one (``SinkRunner.attach``) moves
        them in a thread of its own (PostgreSQL transactions never under the engine's lock,
        so stream processing does not wait for PostgreSQL; if PostgreSQL is away it keeps
        retrying and the engine keeps the batches), or in the committing thread with
        ``background=False``. A terminal error halts the sink (see the module docstring)."""
        SinkRunner([self]).attach(background)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every batch committed so far is in PostgreSQL; False on timeout. A
        halted sink raises its error (waiting would never end). ``SinkRunner.flush_sink``,
        of the runner feeding it, if any."""
        return (self.runner or SinkRunner([self])).flush_sink(self, timeout)

    def detach(self, flush_seconds: float | None = None) -> None:
        """Stop feeding (``SinkRunner.detach``): deliver what has committed for at most
        ``flush_seconds``, finish the chunk in flight, acknowledge, close the connection. A
        member of a group is detached with its group (``SinkGroup.detach``)."""
        runner = self.runner
        if runner is None:
            with self.mutex:
                self.release()
            return
        if len(runner.sinks) > 1:
            raise MigrationError(f"sink {self.stream} -> {self.table} is fed by a sink group: "
                                 f"detach the group, not its members")
        runner.detach(flush_seconds)

    # ------------------------------------------------------------------ what to write
    def plan(self) -> list[Chunk]:
        """Step 3's chunks after where the target stands (``after``, set by ``start``). The
        first plan after the stream's first rows, when the sink started without any,
        prepares the target (created or checked, fingerprint recorded) under the fence its
        start took, before any delivery (every delivery path plans first)."""
        if not self.side.prepared and self.engine.schema(self.stream) is not None:
            self.start(keep_fence=True)
        assert self._after is not None
        return in_chunks(self.port.batches(self._after), self.chunk_rows)

    def read(self, group: list[Chunk]) -> pa.Table:
        """The rows of a group's batches, in batch order, read through ``Engine.query`` (a
        read-only cursor, committed state only, like ``Engine.read_batches``) but without
        its ORDER BY: DuckDB returns a filtered scan in insertion order, which is batch
        order, and sorting 100,000 rows again took a third of the read, under the engine's
        lock. The order is checked, and restored (a stable sort) if it is ever not so."""
        schema = self.engine.schema(self.stream)
        if schema is None:
            return pa.table({"_batch_id": pa.array([], pa.int64())})
        held = self._recent.take(group[0].first, group[-1].last, sum(c.batches for c in group),
                                 sum(c.rows for c in group), schema)
        if held is not None:
            return held  # the same rows, as the subscription handed them over
        rows = self.engine.query(f"SELECT * FROM {ident(self.stream)} WHERE _batch_id "
                                 f"BETWEEN ? AND ?", group[0].first, group[-1].last)
        return in_batch_order(rows)

    def move_chunk(self, chunk: Chunk, rows: pa.Table, ahead: Converted | None = None,
                   sent: Callable[[], None] | None = None) -> int:
        """Deliver one chunk (steps 1-6 of ``migrators.delivery``), then acknowledge it.
        ``sent``: called once its COPY is in the socket (the read-ahead's ``kick``).

        The rows are converted for the target once, before the PostgreSQL transaction (and
        its retries), or were by the reader (``ahead``); the count lets ``delivery`` lock and
        advance the watermark in one statement when it stands where the plan continues. A
        watermark elsewhere, or target types learnt anew since, convert again from the
        batches."""
        assert self._after is not None
        after, side = self._after, self.side
        types = side.types
        planned = ahead if ahead is not None and ahead.after == after and \
            ahead.types is types else side.convert(rows, after)

        def write(cur: psycopg.Cursor, watermark: int) -> int:
            if watermark == after and side.types is types:
                return side.write(cur, planned.data, planned.payload, sent=sent)
            return side.write(cur, side.rows_for_target(rows, watermark))

        done = self.session.run(
            lambda con: delivery.deliver(
                con, self.sink_key, chunk.first, chunk.last, write, after=after,
                prepare_target=side.prepare, shared_target=self.shared_target,
                drained_target=self.drained_target,
                before_commit=self.before_commit, planned_rows=planned.data.num_rows),
            f"migrate {self.stream} batches {chunk.first}-{chunk.last}")
        self.delivered(chunk, rows, done, time.perf_counter())
        return done.rows

    def delivered(self, chunk: Chunk, rows: pa.Table, done: delivery.Delivery,
                   committed_at: float) -> None:
        """After the COMMIT that delivered ``chunk`` (its own, or a sink group's): the sink
        continues after it, drops its held rows, counts it, acknowledges it (step 7)."""
        self._after = chunk.last
        if done.rows and self.side.follow:
            log.info("%s: the target followed the stream (%s) with batches %d-%d",
                     self.sink_key, "; ".join(self.side.followed()), chunk.first, chunk.last)
        if not self._unacked:
            self._unacked_since = time.monotonic()
        self._unacked = chunk.last
        self._recent.forget_through(chunk.last)
        self._rows_moved += done.rows
        self._batches_moved += chunk.batches
        self.acknowledge(force=False)  # step 7
        if self.on_delivered is not None and not done.skipped:
            ids = pc.unique(rows["_batch_id"]).to_pylist() if rows.num_rows else []
            self.on_delivered(Delivered(chunk.first, chunk.last, ids, done.rows, committed_at))

    def acknowledge(self, force: bool) -> None:
        """Step 7, at most every ``ack_every`` seconds unless ``force`` (``flush``).

        Unforced, it does not wait for the engine's lock while the oldest delivery not yet
        told is younger than ``ACK_WAIT_MAX``: a group commit holds that lock for a whole
        batch, and waiting for it after every delivery made a sink group's next round wait
        as long (84% of a round's time at 100-trade TPC-DI batches). A busy engine is told on
        a later try (the runner's thread wakes every ``ack_every`` seconds, at least every
        10 ms, while it has something to tell), and after ``ACK_WAIT_MAX`` the sink waits: garbage
        collection and backpressure are never kept waiting long."""
        now = time.monotonic()
        if not self._unacked or not (force or now - self._acked_at >= self.ack_every):
            return
        wait = force or now - self._unacked_since >= ACK_WAIT_MAX
        if self.port.acknowledge(self._unacked, wait=wait):
            self._unacked, self._acked_at = 0, now

    # ------------------------------------------------------------------ as its runner sees it
    def remember(self, batch_id: int, rows: pa.Table) -> None:
        """A batch of the stream committed (the runner's subscription): keep its rows, so
        that ``read`` need not ask the engine for them (``RecentBatches``)."""
        self._recent.remember(batch_id, rows)

    def note_retry(self, exc: BaseException) -> None:
        """Its runner retries a transient failure: shown in ``last_error`` and counted."""
        self.last_error = f"{type(exc).__name__}: {first_line(exc)}"
        self._loop_retries += 1

    def note_recovered(self) -> None:
        """Its runner got past the failures it retried."""
        self.last_error = None

    def halt(self, exc: BaseException) -> None:
        """A terminal error: record it and the halt in the engine (``status`` shows them; the
        halt lasts until ``sstore resume``). Its runner stops feeding it.

        The engine records the halt before ``halted`` is set: whoever sees ``halted`` (a
        ``flush`` raising it) then finds it in ``status`` too."""
        message = f"{type(exc).__name__}: {first_line(exc)}"
        self.last_error = message
        log.error("sink %s -> %s halted: %s", self.stream, self.table, message)
        try:
            self.port.halt(self._after or 0, message)
        except SStoreError as also:  # the engine is closing: the log line above remains
            log.error("could not record the sink's halt: %s", also)
        self.halted = message


def migrate_stream(engine: Engine, url: str, stream: str, table: str, mode: str = "append",
                   key: Sequence[str] = (), chunk_rows: int = 10_000, *,
                   accept_gap: bool = False, batch_column: str | None = None
                   ) -> MigrationReport:
    """Move everything committed on ``stream`` and not yet in ``table``; then return.
    ``batch_column``: the target column for each row's batch id (``StreamToPostgres``)."""
    if stream not in engine.graph.streams and not engine.graph.is_stream(stream):
        raise MigrationError(f"no stream {stream!r} in this engine")
    return StreamToPostgres(engine, stream, url, table, mode, tuple(key), chunk_rows,
                            batch_column=batch_column, accept_gap=accept_gap).run_once()
