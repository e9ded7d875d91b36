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
queries, ad hoc transactions; ``halts``; ``consumers``). Declaring (``engine_declarations``)
and reading (``engine_reads``) are mixed in from modules of their own.
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

from sstore.base.errors import DeclarationError, SStoreError, UnknownStreamError
from sstore.base.rows import RowsLike
from sstore.base.sql import bind
from sstore.dataflow.graph import (
    Graph,
)
from sstore.engine_declarations import Declarations
from sstore.engine_reads import Reads
from sstore.engine_view import EngineView
from sstore.execution import adhoc, gc, halts, lifecycle, recovery, running
from sstore.execution.backpressure import DEFAULT_TIMEOUT, Backpressure, Bound, runner
from sstore.execution.ingest import Ingested, ingest_batch, replay_ingest
from sstore.execution.interrupts import Interrupts, Stopped
from sstore.execution.runtime import CommitEvent, Runtime
from sstore.execution.sink_view import ObservableSink
from sstore.execution.transaction import Transaction
from sstore.storage import consumers, owners
from sstore.storage.checkpoints import WAL_LIMIT_BYTES
from sstore.storage.evolution import Explicit
from sstore.storage.status import EngineStatus, read_status
from sstore.storage.subscriptions import Callback, Subscribers, Subscription
from sstore.storage.upgrades import Upgrade

log = logging.getLogger("sstore")
T = TypeVar("T")

GC_EVERY = 64

class Engine(Declarations, Reads):
    """A transactional streaming engine over one DuckDB database.

    Its API in three modules: here opening, starting, ingesting, running, ad hoc
    transactions and closing; ``sstore.engine_declarations`` what a program declares before
    the start; ``sstore.engine_reads`` queries and what consumers ask."""

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

    # ------------------------------------------------------------------ state
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

