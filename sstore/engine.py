"""The public face of sstore: declare a dataflow, ingest batches, run it, query the state.

An ``Engine`` is opened on a state file (full durability), on ``":memory:"`` with an
``input_log`` (weak durability: state in memory, border inputs logged and replayed), or on
``":memory:"`` alone (nothing survives the process; for tests and experiments).

The program declares its streams, windows, triggers, tables and procedures every time it starts.
The engine starts on first use (``ingest``, ``run_until_idle``, ``query``, ``transaction``...):
it checks the graph, creates what is missing, rebuilds its ledger from the commit records and,
in weak mode, replays the input log. From then on the graph is fixed.

``Engine`` is the facade: its methods check their arguments and hand the work to a module each
(``lifecycle``: open, start, close; ``ingest``; ``running``: the TEs; ``adhoc``: statements,
queries, ad hoc transactions; ``halts``; ``consumers``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any, TypeVar

import duckdb
import pyarrow as pa

from sstore.base.duck import arrow
from sstore.base.errors import ChainedBatchError, DeclarationError, SStoreError, UnknownStreamError
from sstore.base.readonly import check_query
from sstore.base.rows import RowsLike
from sstore.base.sql import bind, literal
from sstore.dataflow import event_windows, fusion
from sstore.dataflow.graph import (
    ErrorPolicy,
    Graph,
    ProcedureDecl,
    StreamDecl,
    TriggerDecl,
    WindowDecl,
)
from sstore.engine_view import EngineView
from sstore.execution import adhoc, consumer_port, gc, halts, lifecycle, recovery, running
from sstore.execution.backpressure import DEFAULT_TIMEOUT, Backpressure, Bound, runner
from sstore.execution.consumer_port import ConsumerPort
from sstore.execution.ingest import Ingested, ingest_batch, replay_ingest
from sstore.execution.interrupts import Interrupts, Stopped
from sstore.execution.runtime import CommitEvent, Runtime
from sstore.execution.sink_view import ObservableSink
from sstore.execution.transaction import Transaction
from sstore.storage import consumers, evolution, owners, upgrades
from sstore.storage.checkpoints import WAL_LIMIT_BYTES
from sstore.storage.consumers import ConsumerStatus
from sstore.storage.evolution import Explicit
from sstore.storage.status import EngineStatus, read_status
from sstore.storage.subscriptions import Callback, Subscribers, Subscription
from sstore.storage.upgrades import Upgrade

log = logging.getLogger("sstore")
T = TypeVar("T")

GC_EVERY = 64


class Engine:
    """A transactional streaming engine over one DuckDB database."""

    def __init__(self, path: str = ":memory:", *, input_log: str | None = None,
                 fsync: bool = True, gc_every: int = GC_EVERY,
                 gc_min_seconds: float | None = None, group_commit: bool = True,
                 chain_sql: bool = True,
                 checkpoint_wal_bytes: int = WAL_LIMIT_BYTES, max_lag: Bound | None = None,
                 ingest_timeout: float = DEFAULT_TIMEOUT) -> None:
        if input_log is not None and path != ":memory:":
            raise DeclarationError("input_log is for weak durability, whose state is in memory: "
                                   "use Engine(':memory:', input_log=...)")
        self.path = path
        self.durability = "full" if path != ":memory:" else "weak" if input_log else "none"
        if gc_every < 1 or (gc_min_seconds is not None and gc_min_seconds < 0):
            raise DeclarationError(f"gc_every must be at least 1 and gc_min_seconds at least 0 "
                                   f"(got {gc_every} and {gc_min_seconds})")
        self.gc_every = gc_every
        #: GC runs every ``gc_every`` TEs, not sooner than this after the previous one
        #: (``gc.due``); None: ``gc.MIN_SECONDS`` with the default ``gc_every``, 0 with a
        #: ``gc_every`` of your own (that asks for exactly that rhythm)
        self.gc_min_seconds = ((gc.MIN_SECONDS if gc_every == GC_EVERY else 0.0)
                               if gc_min_seconds is None else gc_min_seconds)
        #: run the TEs of one batch as one DuckDB transaction (``sstore.execution.group``); False:
        #: one transaction per TE (same results, slower; for comparing and for debugging)
        self.group_commit = group_commit
        #: run consecutive SQL procedures of a batch as one statement inside a group commit
        #: (``sstore.dataflow.fusion``); False: each runs its own statement (same rows out
        #: downstream)
        self.chain_sql = chain_sql
        #: a file-backed engine checkpoints after a commit once the WAL is this big, and when
        #: idle; never inside a transaction (``sstore.storage.checkpoints``)
        self.checkpoint_wal_bytes = checkpoint_wal_bytes
        self._owner_key = owners.claim_state(path, self)
        self._log_lock: IO[bytes] | None = None
        try:
            if input_log is not None:
                self._log_lock = owners.lock_input_log(input_log)
            self._con, self._input_log, self.engine_id = lifecycle.open_state(
                path, input_log, fsync)
        except BaseException:
            self._let_go()
            raise
        #: procedures the last program declared that this one retires on purpose
        #: (``retire``; ``sstore.storage.redeclared``)
        self._retired: set[str] = set()
        #: explicit changes of stored streams (``evolve``; ``sstore.storage.evolution``)
        self._evolutions: dict[str, Explicit] = {}
        #: declared procedure versions and explicit switches (``upgrade``;
        #: ``sstore.storage.upgrades``)
        self._versions: dict[str, int] = {}
        self._upgrades: dict[str, Upgrade] = {}
        self._graph = Graph()
        self._lock = threading.RLock()
        self._rt: Runtime | None = None
        self._subscribers = Subscribers()
        self._closed = False
        self._foreign = False
        self._observers: list[Callable[[CommitEvent], None]] = []
        self._declared_consumers: list[tuple[str, str]] = []
        self._interrupts = Interrupts()
        self._sinks: dict[str, ObservableSink] = {}
        #: every reader's bound on what it leaves retained, and the ingests waiting on them
        #: (``sstore.execution.backpressure``): ``max_lag`` is the default bound, ``ingest_timeout``
        #: how long an ingest waits for a running reader before ``IngestTimeoutError``
        self.backpressure = Backpressure(max_lag, ingest_timeout, self.sinks)
        #: told of each registered sink, and run first in ``close``: the hooks of what reads
        #: this engine through ``view()`` (``sstore.observe``), which the engine never imports
        self._sink_listeners: list[Callable[[ObservableSink], None]] = []
        self._close_hooks: list[Callable[[], None]] = []
        self._view = EngineView(self, self._sink_listeners, self._close_hooks)
        #: per border stream, the batch-ids dead-letter replays took (-> the dead-lettered
        #: batch), read on the first re-send; an ``along`` ingest (a replay) forgets it
        self._replayed: dict[str, dict[int, int]] = {}

    @classmethod
    def open_existing(cls, path: str) -> Engine:
        """Open a state file with the graph its program declared last time, to read its
        streams, migrate them or inspect them. Its procedures are known (for ordering and
        garbage collection) but never run here: their code lives in that program."""
        if not os.path.exists(path):
            raise DeclarationError(f"no state file at {path}")
        engine = cls(path)
        engine._foreign = True
        lifecycle.declare_saved_graph(engine._con, engine._graph)
        return engine

    # ------------------------------------------------------------------ declarations
    def _declaring(self) -> None:
        if self._rt is not None:
            raise DeclarationError("the engine has started; declare streams, windows, triggers "
                                   "and procedures before the first ingest, run or query")

    def stream(self, name: str, columns: Mapping[str, str] | None = None, *,
               retain: str = "latest") -> str:
        """Declare a stream. ``columns`` maps column name to DuckDB type; a stream that only a
        procedure writes and none reads may leave it out (its first batch decides).

        ``retain`` decides what garbage collection does with batches that no procedure and no
        declared consumer reads: "latest" keeps only the newest batch; "all" keeps every
        batch until a consumer declared later has acknowledged it (use it for an output that
        a job you do not declare here, such as a periodic ``sstore migrate``, moves later)."""
        self._declaring()
        self._graph.add_stream(StreamDecl(name, dict(columns) if columns is not None else None,
                                          retain))
        return name

    def consumer(self, stream: str, name: str) -> None:
        """Declare an external consumer of ``stream`` (a sink, a migration job) with the
        dataflow: from the first batch on, garbage collection keeps every batch of ``stream``
        until ``name`` has acknowledged it (``acknowledge``). The declaration is recorded in
        the state file and holds across restarts until ``drop_consumer``. Sinks such as
        ``migrators.StreamToPostgres`` declare themselves when created before the engine
        starts. After the engine has started this is ``hold``."""
        if self._rt is not None:
            self.hold(stream, name)
            return
        if not self._graph.is_stream(stream) and stream not in self._graph.streams:
            raise UnknownStreamError(f"no stream {stream!r}; declare it before its consumers")
        if (stream, name) not in self._declared_consumers:
            self._declared_consumers.append((stream, name))

    @property
    def foreign(self) -> bool:
        """Opened from a state file by another program than its own (``open_existing``): the
        dataflow is not declared here, so neither are its consumers."""
        return self._foreign

    @property
    def started(self) -> bool:
        """Whether the engine has started (its graph is then fixed)."""
        return self._rt is not None

    @property
    def closed(self) -> bool:
        """Whether the engine was closed (it then refuses every call that needs its state)."""
        return self._closed

    def window(self, name: str, source: str, *, rows: int | None = None,
               batches: int | None = None, slide: int = 1) -> str:
        """Declare a window over ``source``: the last ``rows`` tuples or ``batches`` batches,
        moving ``slide`` at a time. Procedures may take it as input (one execution per slide)."""
        self._declaring()
        if (rows is None) == (batches is None):
            raise DeclarationError(f"window {name!r}: give exactly one of rows= or batches=")
        size, unit = (rows, "rows") if rows is not None else (batches, "batches")
        self._graph.add_window(WindowDecl(name, source, int(size or 0), int(slide), unit))
        return name

    def event_window(self, name: str, source: str, *, time: str,
                     size: event_windows.Duration, slide: event_windows.Duration | None = None,
                     key: str | Sequence[str] = (), delay: event_windows.Duration = 0,
                     allowed_lateness: event_windows.Duration = 0,
                     aggregates: Mapping[str, str] | None = None,
                     retain: str = "latest") -> str:
        """Declare an event-time window over ``source`` (``sstore.dataflow.event_windows`` has the
        semantics): windows of ``size`` every ``slide`` (default: tumbling) over the column
        ``time``, per ``key``, closed when the watermark (max event time seen - ``delay``)
        passes their end, corrected by late rows until it passes end + ``allowed_lateness``.

        Makes two streams: ``name``, a batch per source batch with one row per window that
        closed or was corrected (the key, window_start, window_end, revision and the
        ``aggregates``: output column -> SQL aggregate over the window's rows, default
        ``{"rows": "count(*)"}``), and ``name + "__late"``, the rows too late for any window.
        Durations: ``timedelta`` or an interval string ("5 minutes") for a timestamp column,
        integers in its unit for an integer column. ``retain`` is the output stream's."""
        self._declaring()
        decl = event_windows.declare(self._con, self._graph, name, source, time=time,
                                     size=size, slide=slide, key=key, delay=delay,
                                     allowed_lateness=allowed_lateness,
                                     aggregates=aggregates, retain=retain)
        self._graph.add_event_window(decl)
        return name

    def trigger(self, target: str, sql: str) -> None:
        """Attach SQL to a stream or window (an EE trigger). It runs inside the transaction that
        appends to ``target``; the appended rows are the relation ``new_rows`` (for a window:
        its contents after the slide) and ``$batch_id`` is the batch-id."""
        self._declaring()
        self._graph.add_trigger(TriggerDecl(target, sql))

    def retire(self, name: str) -> None:
        """Say that procedure ``name``, which the program that last ran on this state file
        declared, is gone on purpose. Without it, a new procedure on the same inputs is
        refused at start as a probable rename (``sstore.storage.redeclared``): run under a new name
        it would process every kept batch again. With it, the new one does. It does not hand
        over the old one's output stream: a new procedure writing it from a batch at or below
        its last is refused at start (a stream's batch-ids are written once, in order)."""
        self._declaring()
        if name in self._graph.procedures:
            raise DeclarationError(f"procedure {name!r} is declared by this program; only one "
                                   f"it no longer declares can be retired")
        self._retired.add(name)

    def evolve(self, stream: str, *, rename: Mapping[str, str] | None = None,
               drop: Sequence[str] = (),
               cast: Mapping[str, str | None] | Sequence[str] | None = None) -> None:
        """Change a stored stream on purpose where redeclaring it is refused (a rename, a
        dropped column, a type that is not a widening: ``sstore.storage.evolution``). Declare the
        stream with its new columns, then call this before the first ingest or run: at start
        the stored table is renamed, dropped and cast (``cast``: column -> type, or columns
        whose declared type they take; the stored values are converted, and a value that does
        not convert refuses the whole start, nothing changed), then compared with the
        declaration as usual. All of it, and the new version's record, is one transaction.
        Once the table matches the declaration this is a no-op, so a program may keep it."""
        self._declaring()
        decl = self._graph.streams.get(stream)
        if decl is None or decl.columns is None:
            raise DeclarationError(f"evolve({stream!r}): declare the stream with its new "
                                   f"columns first (engine.stream)")
        casts = dict(cast) if isinstance(cast, Mapping) else dict.fromkeys(cast or ())
        self._evolutions[stream] = Explicit(dict(rename or {}), tuple(drop), casts)

    def upgrade(self, name: str, new_fn: Callable[..., Any], *,
                from_batch: int | None = None) -> None:
        """Replace procedure ``name``'s code at a batch boundary (``sstore.storage.upgrades``):
        declare it as before, then call this before the first ingest or run. Pending batches
        below ``from_batch`` still run the declared code; batches from it on run ``new_fn``,
        recorded as the next version. ``from_batch`` must come after every batch the
        procedure committed (default: the next one). Once recorded, the call is a no-op."""
        self._declaring()
        if name not in self._graph.procedures:
            raise DeclarationError(f"upgrade({name!r}): declare the procedure first, as "
                                   f"before (its current version's code)")
        self._upgrades[name] = Upgrade(new_fn, from_batch)

    def procedure_versions(self, name: str | None = None) -> list[dict[str, Any]]:
        """The recorded versions of procedure ``name`` (or of all), oldest first
        (``sstore.storage.upgrades.load``); none for a procedure that never changed."""
        rt = self._runtime()
        with rt.lock:
            return upgrades.load(rt.con, name)

    def stream_versions(self, stream: str | None = None) -> list[dict[str, Any]]:
        """The recorded versions of ``stream`` (or of every stream), oldest first
        (``sstore.storage.evolution.load``); none for a stream that never evolved."""
        rt = self._runtime()
        with rt.lock:
            return evolution.load(rt.con, stream)

    def procedure(self, input: str | Sequence[str], output: str | Sequence[str] = (), *,
                  name: str | None = None, on_error: str | ErrorPolicy = ErrorPolicy.HALT,
                  retries: int = 2, timeout: float | None = None, version: int = 1
                  ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Declare a stored procedure: ``fn(tx, batch)`` runs once per batch as one transaction.

        ``batch`` is the input batch as an Arrow table (and the SQL relation ``batch``); with
        several inputs it is a dict of tables (relations ``<input>_batch``). What ``fn`` returns
        becomes batch b of the output stream (a dict of stream to rows with several outputs).
        ``on_error``: "halt" (default) or "dead_letter"; ``retries``: how often a transient
        error is tried again. ``timeout``: seconds one execution may run; past it, the
        execution is interrupted (its SQL statement and its Python code), rolled back, and
        ``on_error`` applies. None (the default): no limit, so a procedure that never returns
        holds the engine (every stream, ``status()``) until the process ends.
        ``version``: the version of its code; a higher one than the state file recorded runs
        from the batch after the procedure's last (``sstore.storage.upgrades``).
        """
        self._declaring()
        inputs = (input,) if isinstance(input, str) else tuple(input)
        outputs = (output,) if isinstance(output, str) else tuple(output)

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._graph.add_procedure(ProcedureDecl(
                name or fn.__name__, fn, inputs, outputs, ErrorPolicy(on_error), retries,
                doc=(fn.__doc__ or "").strip().split("\n")[0], timeout=timeout))
            self._versions[name or fn.__name__] = version
            return fn

        return register

    def sql_procedure(self, name: str, sql: str, *, input: str, output: str,
                      on_error: str | ErrorPolicy = ErrorPolicy.HALT, retries: int = 2,
                      timeout: float | None = None, doc: str = "", version: int = 1) -> None:
        """Declare a stored procedure that is one SELECT over its input batch ``batch``: its
        rows become batch b of ``output``. The same as a function procedure returning
        ``tx.sql(sql)``, but the engine may chain it with the SQL procedure that reads its
        output, running both (and the rest of such a chain) as one statement in the batch's
        group commit (``sstore.dataflow.fusion``: an intermediate batch is then never materialized).
        The SELECT must not depend on the order of its input rows."""
        sql = fusion.check_select(name, sql)
        self._declaring()

        def run(tx: Transaction, batch: pa.Table) -> pa.Table:
            return tx.sql(sql)

        self._graph.add_procedure(ProcedureDecl(
            name, run, (input,), (output,), ErrorPolicy(on_error), retries,
            doc=doc or sql.strip().split("\n")[0], timeout=timeout, sql=sql))
        self._versions[name] = version

    # ------------------------------------------------------------------ starting
    def _runtime(self) -> Runtime:
        if self._closed:
            raise SStoreError("the engine is closed")
        if self._rt is None:
            with self._lock:
                if self._rt is None:
                    self._start()
        assert self._rt is not None
        return self._rt

    def _start(self) -> None:
        rt = lifecycle.build_runtime(
            self._con, self._graph, declared_consumers=self._declared_consumers,
            foreign=self._foreign, subscribers=self._subscribers, lock=self._lock,
            input_log=self._input_log, observers=self._observers, path=self.path,
            checkpoint_wal_bytes=self.checkpoint_wal_bytes, interrupts=self._interrupts,
            chain_sql=self.chain_sql, retired=self._retired, evolutions=self._evolutions,
            versions=self._versions, upgrades=self._upgrades)
        self._rt = rt
        if self._input_log is not None:
            try:
                count = recovery.replay(
                    rt, self._input_log,
                    lambda most: running.run_one(rt, self.group_commit, self.gc_every,
                                                 self.gc_min_seconds, most),
                    functools.partial(replay_ingest, rt),
                    functools.partial(adhoc.replay_oltp, rt))
            except BaseException:
                self.close()  # never serve a state replayed halfway (the log is untouched)
                raise
            log.info("replayed %d input-log records", count)
            if rt.store.evolved:  # the snapshot must hold the evolved tables before a batch
                with rt.lock:     # is logged with their columns (``sstore.storage.evolution``)
                    recovery.checkpoint(rt, self._input_log)

    # ------------------------------------------------------------------ input
    def ingest(self, stream: str, rows: RowsLike, batch_id: int | None = None, *,
               along: Callable[[Transaction], None] | None = None) -> Ingested:
        """Append one atomic batch to a border stream; return its batch-id.

        Without ``batch_id`` the next id is used. Re-sending an id that was already ingested with
        the same rows is a no-op (the result's ``duplicate`` is True); with other rows (another
        count, or another fingerprint, ``sstore.base.fingerprint``) it is refused with
        ``ResendMismatchError``, nothing ingested; a new id lower than the last one is rejected
        with ``OutOfOrderBatchError``, and so is an id a dead-letter replay took for its rows
        (``BatchIdTakenError``: the batch sent is not a re-send of it). Bad rows raise
        ``SchemaError`` and change nothing. A reader downstream past its backpressure bound
        makes it wait, then raise ``IngestTimeoutError``, or refuse at once
        (``ConsumerStalledError``), the batch not ingested (``sstore.execution.backpressure``).

        ``along(tx)``: more statements that must commit with this batch or not at all; they
        run in the ingest's transaction after its rows (``sstore.dead_letters.replay`` deletes
        the dead letters it sends again there). Not with weak durability: its input log keeps
        the batch, not what ``along`` did, so a replay would lose it.
        """
        rt = self._runtime()
        if along is not None and rt.input_log is not None:
            raise DeclarationError("ingest(along=...) needs full durability: the input log of "
                                   "weak durability records the batch, not along's statements")
        return ingest_batch(rt, self.backpressure, self._replayed, stream, rows, batch_id,
                            along=along)

    def ingest_and_run(self, stream: str, rows: RowsLike,
                       batch_id: int | None = None) -> Ingested:
        """``ingest`` followed by ``run_until_idle``, faster: the batch and the transaction
        executions of that batch that it makes runnable commit as one DuckDB transaction (a
        group commit led by the ingest, ``sstore.execution.group.ingest_and_run``), and its rows
        are not
        stored when nothing can read them from the table (``sstore.execution.passing``). Same
        outcome, same
        guarantees, same errors as the two calls: a refused batch raises and changes nothing; if a
        procedure fails, the batch is committed on its own and the procedures run as they would
        after ``ingest``. A caller that feeds and runs in one thread (a loader, a benchmark) saves a
        COMMIT, a stored copy and a read of every batch.

        With weak durability (``input_log``) and with ``group_commit=False`` it is exactly
        the two calls."""
        rt = self._runtime()
        before = rt.te_seq
        try:  # the ingest path decides whether the batch leads the group (``_may_lead``)
            ingested = ingest_batch(rt, self.backpressure, self._replayed, stream, rows,
                                    batch_id, run=self.group_commit)
        except Stopped:  # the batch is in (committed alone); one request, one Stopped,
            self._interrupts.stop_requested.clear()  # as from run_until_idle
            rt.subscribers.publish(rt.take_outbox())
            raise
        self.run_until_idle()
        return Ingested(ingested, ingested.duplicate, ingested.rows, rt.te_seq - before)

    # ------------------------------------------------------------------ running
    @runner
    def run_until_idle(self, max_executions: int | None = None) -> int:
        """Run pending transaction executions in order until none is runnable; return how many
        ran (committed or dead-lettered). A halted procedure stops only itself and downstream.

        Raises ``Stopped`` when ``interrupt()`` (or ``sstore.execution.stopping`` on a signal)
        asked the
        engine to stop: the execution in flight rolled back, nothing was recorded as an error.
        One request, one ``Stopped``: a later call runs again (unless the whole process is
        stopping)."""
        return running.run_until_idle(self._runtime(), self._interrupts, self.group_commit,
                                      self.gc_every, self.gc_min_seconds, max_executions)

    @runner
    def run(self, stop: threading.Event, poll_seconds: float = 0.2) -> None:
        """Serve: run transaction executions as batches arrive until ``stop`` is set.

        Setting ``stop`` interrupts the execution in flight (it rolls back and runs again next
        time; no error, no halt) and ``run`` returns. ``interrupt()`` and
        ``sstore.execution.stopping`` end it the same way."""
        running.run_until_stopped(self._runtime(), self._interrupts, stop, poll_seconds,
                                  self.run_until_idle, self.interrupt)

    def interrupt(self) -> None:
        """Ask the engine to stop, from any thread (a signal handler should call it from a
        helper thread, as ``sstore.execution.stopping`` does).

        The transaction execution in flight is interrupted (its DuckDB statement and its
        Python code) and rolls back, unless it is already committing; ``run_until_idle``
        raises ``Stopped`` and ``run`` returns. Nothing is recorded: no error, no halt. Ingests,
        queries and ad hoc transactions in flight are not interrupted (they are short)."""
        running.request_stop(self._interrupts, self._rt)

    def resume(self, procedure: str) -> bool:
        """Let a halted procedure, or a halted consumer (a sink), try its failing batch again:
        its halt is deleted from the state file (a halt lasts across restarts until resumed).
        False if it was not halted; ``DeclarationError`` if there is no such procedure or
        consumer."""
        return halts.resume(self._runtime(), procedure, self._foreign)

    def halt_consumer(self, consumer: str, batch_id: int, message: str) -> None:
        """Record that ``consumer`` (a sink) stopped on a terminal error after ``batch_id``:
        the error and a halt, in one transaction. The halt lasts across restarts until
        ``resume`` (``sstore resume STATE CONSUMER``); ``status`` shows it."""
        halts.halt_consumer(self._runtime(), consumer, batch_id, message)

    def consumer_halt(self, consumer: str) -> str | None:
        """Why ``consumer`` is halted ("batch N: error"), or None."""
        return halts.consumer_halt(self._runtime(), consumer)

    def port(self, stream: str, consumer: str) -> ConsumerPort:
        """Everything ``consumer`` may ask of this engine about ``stream`` (list, read, hold,
        acknowledge, rewind, halt, subscribe, drop), each call checked against what the
        stream committed (``sstore.execution.consumer_port``)."""
        streams = self._runtime().graph.streams  # starts the engine: outputs declared
        if stream not in streams:
            raise UnknownStreamError(f"no stream {stream!r}; streams: {sorted(streams)}")
        return ConsumerPort(self._runtime, stream, consumer, self.subscribe)

    def collect_garbage(self) -> int:
        rt = self._runtime()
        with rt.lock:
            return gc.collect(rt)

    # ------------------------------------------------------------------ state access
    def execute(self, statement: str, *args: Any,
                params: Sequence[Any] | Mapping[str, Any] | None = None) -> None:
        """Run a statement (or several, separated by semicolons) outside any stream transaction
        (DDL, seed data), each statement on its own.

        Declaring a table again on an existing state file is fine when the declaration is the
        same: a ``CREATE TABLE [IF NOT EXISTS]`` of a table that exists with the same columns
        is skipped; with other columns (names, types, order) it raises ``DeclarationError``
        naming the table and both column lists. Any other CREATE whose object already exists
        (view, sequence, index, schema...) is taken as that declaration and skipped.
        Statements that write a stream's table are refused (``StreamWriteError``), before
        any of them runs: a stream's batches come from ingests and procedures.
        """
        bound = bind(args, params)
        with self._lock:
            adhoc.execute_statements(self._con, statement, bound, self._rt, self._graph)
            if self._rt is not None:  # before the start DuckDB's own checkpoints are on
                adhoc.checkpoint_if_due(self._rt)

    def query(self, sql: str, *args: Any,
              params: Sequence[Any] | Mapping[str, Any] | None = None,
              time_zone: str | None = None) -> pa.Table:
        """Run a read query over the current committed state; return an Arrow table.

        Read-only by construction, in two layers (statements that change state go through
        ``execute`` or ``transaction``):

        1. ``sstore.base.readonly.check_query``: one plain query (SELECT, WITH, set operations,
           VALUES) that calls nothing reaching outside the database, else
           ``ReadOnlyQueryError`` naming what was refused.
        2. It runs on a cursor of its own in a READ ONLY transaction: even SQL the check let
           through cannot change the state, and the query sees committed state only (not an
           open transaction of the engine's connection, nor Arrow tables registered there).

        The engine's connection keeps external access (weak durability ATTACHes snapshot
        files; DuckDB cannot switch it off for one cursor), so step 1 is what keeps files out.

        ``time_zone``: the query's session time zone (timestamptz values shown, cut and cast
        in it; the polystore passes PostgreSQL's), set on the reader cursor for this query
        only.
        """
        def run(cursor: duckdb.DuckDBPyConnection, bound: Any) -> pa.Table:
            if not time_zone:
                return arrow(cursor, sql, bound, large=True)
            cursor.execute(f"SET TimeZone = {literal(time_zone)}")
            try:
                found = arrow(cursor, sql, bound, large=True)
            except BaseException:  # the failed query aborted the transaction: end it to
                cursor.execute("ROLLBACK")  # reset the cursor's zone, give the caller an
                cursor.execute("RESET TimeZone")  # open one to roll back
                cursor.execute("BEGIN TRANSACTION READ ONLY")
                raise
            cursor.execute("RESET TimeZone")
            return found
        return self._read(sql, bind(args, params), run)

    def query_rows(self, sql: str, *args: Any,
                   params: Sequence[Any] | Mapping[str, Any] | None = None
                   ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """``query`` for a small answer, as (column names, Python rows): no Arrow. Converting
        a one-row answer to Arrow costs a few times more than the query itself here (the
        planner's probes answer in one row: ``polystore.connectors``)."""
        def rows(cursor: duckdb.DuckDBPyConnection, bound: Any
                 ) -> tuple[list[str], list[tuple[Any, ...]]]:
            found = cursor.execute(sql, bound).fetchall()
            return [d[0] for d in cursor.description or ()], found
        return self._read(sql, bind(args, params), rows)

    def _read(self, sql: str, bound: Any,
              run: Callable[[duckdb.DuckDBPyConnection, Any], T]) -> T:
        """``run`` on the reader cursor in a READ ONLY transaction, ``sql`` checked first."""
        check_query(sql, "duckdb")
        return adhoc.read_committed(self._runtime(), bound, run)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """An ad hoc ACID transaction, serializable with the stream's transaction executions."""
        rt = self._runtime()
        with adhoc.transaction(rt, log_it=rt.input_log is not None) as tx:
            yield tx

    def subscribe(self, stream: str, callback: Callback | None = None) -> Subscription:
        """Be told of each committed batch of ``stream``: pushed to ``callback(batch_id, rows)``,
        or, without a callback, queued for ``Subscription.poll()``."""
        if not self._graph.is_stream(stream):
            raise UnknownStreamError(f"no stream {stream!r}")
        return self._subscribers.add(stream, callback)

    def observe(self, observer: Callable[[CommitEvent], None]) -> None:
        """Call ``observer(event)`` after every commit of an ingest or a transaction execution
        (for metrics and benchmarks). It runs under the engine's lock: keep it quick. May be
        called before or after the engine starts."""
        self._observers.append(observer)

    # ------------------------------------------------------------------ observing
    def view(self) -> EngineView:
        """This engine, read-only, for ``sstore.observe`` (metrics, ``/status``, the
        dashboard: ``sstore.observe.serve(engine)``); the same object on every call."""
        return self._view

    def register_sink(self, sink: ObservableSink) -> None:
        """Show ``sink`` in this engine's backpressure, metrics and status (the protocol:
        ``sstore.execution.sink_view``).
        A sink with the same consumer name replaces the one registered before."""
        name = sink.metrics_snapshot().name
        with self._lock:
            self._sinks[name] = sink
            for listener in self._sink_listeners:
                listener(sink)

    def unregister_sink(self, sink: ObservableSink) -> None:
        with self._lock:
            for name, known in list(self._sinks.items()):
                if known is sink:
                    del self._sinks[name]

    def sinks(self) -> list[ObservableSink]:
        """The registered sinks, in registration order."""
        return list(self._sinks.values())

    @property
    def runtime(self) -> Runtime | None:
        """The started engine's shared state (None before the first ingest, run or query);
        for ``view()``, which reads it under ``lock``."""
        return self._rt

    def latest(self, stream: str) -> tuple[int, pa.Table] | None:
        """The newest committed batch of a stream: (batch_id, rows), or None (pull mode).
        Raises ``ChainedBatchError`` if that batch was chained away (``sstore.dataflow.fusion``)."""
        rt = self._runtime()
        with rt.lock:
            chained = rt.chaining.unmaterialized.get(stream)
            if chained is not None:
                raise ChainedBatchError(
                    f"batch {chained[0]} of stream {stream!r} was never materialized: the SQL "
                    f"procedure writing it ran chained into {chained[1]!r}'s statement; read "
                    f"the chain's last output, or start the engine with chain_sql=False")
            return rt.latest.get(stream)

    def hold(self, stream: str, consumer: str) -> bool:
        """Keep ``stream``'s batches until ``consumer`` acknowledges them (for sinks and
        migrations that were not declared with ``consumer`` before the engine started).

        The hold is recorded in the state file and lasts until ``drop_consumer``: a consumer
        that is not running still holds its batches. Returns True if the hold is new."""
        return self.port(stream, consumer).hold()

    def release(self, stream: str, consumer: str) -> bool:
        """Stop holding ``stream`` for ``consumer`` (same as ``drop_consumer``)."""
        return self.drop_consumer(stream, consumer)

    def drop_consumer(self, stream: str, consumer: str) -> bool:
        """End ``consumer``'s hold on ``stream``: its batches are collected as if it had never
        existed. True if there was such a consumer."""
        return self.port(stream, consumer).drop()

    def consumers(self) -> list[ConsumerStatus]:
        """Every consumer hold: its stream, acknowledged batch, pending batches, accepted gaps."""
        rt = self._runtime()
        with rt.lock:
            return consumers.list_consumers(rt.con, rt.ledger)

    def acknowledged(self, consumer: str) -> int:
        """The last batch-id ``consumer`` acknowledged (0 if none)."""
        rt = self._runtime()
        with rt.lock:
            return rt.ledger.progress.get(consumer, 0)

    def continue_from(self, stream: str, consumer: str, after: int, *,
                      accept_gap: bool = False) -> int:
        """The batch-id after which ``consumer`` continues reading ``stream`` when its target
        has everything up to ``after``: ``after`` itself, unless garbage collection already
        removed batches above it. Then ``GapError`` names them, or, with ``accept_gap``, the
        gap is recorded (``status`` shows it) and the answer is the last collected batch."""
        return self.port(stream, consumer).continue_from(after, accept_gap=accept_gap)

    def rewind(self, consumer: str, batch_id: int) -> None:
        """Move ``consumer``'s acknowledgement back to ``batch_id``: its target lost batches it
        had taken (the engine delivers them again if it still has them)."""
        rt = self._runtime()
        with rt.lock:
            consumer_port.rewind(rt, consumer, batch_id)

    def collected_through(self, stream: str) -> int:
        """The highest batch-id of ``stream`` that garbage collection has removed (0: none)."""
        rt = self._runtime()
        with rt.lock:
            return rt.ledger.collected.get(stream, 0)

    def batches(self, stream: str, after: int = 0) -> list[tuple[int, int]]:
        """Committed batches of ``stream`` after ``after`` that are still stored:
        (batch_id, rows), ascending. Only complete batches are listed."""
        rt = self._runtime()
        if stream not in rt.graph.streams:
            raise UnknownStreamError(f"no stream {stream!r}")
        # from the committed view, not the ledger: no wait for the engine's lock while a
        # group of TEs runs (the ledger has a group's batches before its COMMIT)
        return rt.committed_batches(stream, after)

    def read_batches(self, stream: str, first: int, last: int) -> pa.Table:
        """Rows of batches ``first``..``last`` of ``stream`` with their ``_batch_id``, in
        batch order: all of them, or an error (``GapError`` for batches garbage collection
        removed, ``ReadAheadError`` for batches not committed yet)."""
        rt = self._runtime()
        with rt.lock:
            return consumer_port.read(rt, stream, first, last)

    def load_table(self, table: str, rows: pa.Table, mode: str = "append",
                   key: Sequence[str] = ()) -> int:
        """Bulk-load Arrow rows into a state table, in one transaction (replicas, casts).

        ``mode``: "append", "replace" (the table's rows become ``rows``) or "merge" (rows
        replace those with the same ``key``). A missing table is created from the rows' types,
        with ``key`` as its primary key. In weak durability these loads are not logged: a
        replica is refreshed again after a restart.
        """
        if mode not in ("append", "replace", "merge"):
            raise DeclarationError(f"mode must be append, replace or merge, not {mode!r}")
        if mode == "merge" and not key:
            raise DeclarationError("merge needs key columns")
        rt = self._runtime()
        adhoc.load_rows(rt, table, rows, mode, key)
        return int(rows.num_rows)

    def schema(self, stream: str) -> pa.Schema | None:
        """The Arrow schema of a stream's rows (None for an output not produced yet)."""
        return self._runtime().store.schema(stream)

    def acknowledge(self, consumer: str, batch_id: int, *, wait: bool = True) -> bool:
        """Record that ``consumer`` has safely taken every held batch up to ``batch_id``: at
        once in memory (garbage collection, backpressure), in the state file with the next
        transaction that writes commit records anyway (no COMMIT of its own under the lock;
        ``sstore.storage.consumers``, step 3).

        ``wait=False``: only if the engine's lock is free now; False (nothing recorded) when
        a transaction execution holds it. A sink thread uses it so that telling the engine
        never makes its next delivery wait for a whole group commit."""
        rt = self._runtime()
        if not rt.lock.acquire(blocking=wait):
            return False
        try:
            if consumer_port.acknowledge(rt, consumer, batch_id):
                rt.wakeup.notify_all()  # an ingest waiting for this consumer re-checks now
        finally:
            rt.lock.release()
        return True

    def status(self) -> EngineStatus:
        rt = self._runtime()
        with rt.lock:
            consumers.write_acks(rt.con, rt.pending_acks)  # the file then says what we know
            status = read_status(rt.con, halted=dict(rt.scheduler.halted),
                                 durability=self.durability, path=self.path)
            status.backpressure = self.backpressure.report(rt).to_dict()
            return status

    def checkpoint(self) -> str | None:
        """Weak mode: write a snapshot and empty the input log. Full mode: DuckDB CHECKPOINT."""
        rt = self._runtime()
        with rt.lock:
            if rt.input_log is None:
                rt.con.execute("CHECKPOINT")
                return None
            return recovery.checkpoint(rt, rt.input_log)

    @property
    def graph(self) -> Graph:
        return self._graph

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection, for library code (migrators) that holds the engine's lock."""
        return self._con

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def holds_lock(self) -> bool:
        """Whether the calling thread holds the engine's lock: code about to wait for a thread
        that needs that lock (a sink's read-ahead, a coalescer) would then wait forever."""
        return bool(self._lock._is_owned())  # type: ignore[attr-defined]

    def close(self) -> None:
        if self._closed:
            return
        self._interrupts.close()
        hooks = list(self._close_hooks)
        self._close_hooks.clear()
        for hook in hooks:  # first: a server's readers take the lock this close needs
            hook()
        with self._lock:
            self._closed = True
            try:
                lifecycle.close_state(self._con, self._rt, self._input_log)
            finally:
                self._let_go()

    def _let_go(self) -> None:
        """Free the state file and the input log for another engine (``sstore.storage.owners``)."""
        owners.release_state(self._owner_key, self)
        if self._log_lock is not None:
            self._log_lock.close()
            self._log_lock = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

