"""The public face of sstore: declare a dataflow, ingest batches, run it, query the state.

An ``Engine`` is opened on a state file (full durability), on ``":memory:"`` with an
``input_log`` (weak durability: state in memory, border inputs logged and replayed), or on
``":memory:"`` alone (nothing survives the process; for tests and experiments).

The program declares its streams, windows, triggers, tables and procedures every time it starts.
The engine starts on first use (``ingest``, ``run_until_idle``, ``query``, ``transaction``...):
it checks the graph, creates what is missing, rebuilds its ledger from the commit records and,
in weak mode, replays the input log. From then on the graph is fixed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from sstore import consumers, event_windows, fusion, gc, group, recovery, systables
from sstore.backpressure import DEFAULT_TIMEOUT, Backpressure, Bound, runner
from sstore.checkpoints import WAL_LIMIT_BYTES, Checkpoints
from sstore.consumers import ConsumerStatus
from sstore.duck import arrow, connect, registered
from sstore.errors import (
    BatchIdTakenError,
    ChainedBatchError,
    DeclarationError,
    OutOfOrderBatchError,
    ResendMismatchError,
    SStoreError,
    TransactionStateError,
    UnknownStreamError,
)
from sstore.executor import run_te
from sstore.faults import crash_point
from sstore.fingerprint import fingerprint
from sstore.graph import (
    ErrorPolicy,
    EventWindowDecl,
    Graph,
    ProcedureDecl,
    StreamDecl,
    TriggerDecl,
    WindowDecl,
)
from sstore.inputlog import InputLog, LogRecord
from sstore.interrupts import Interrupts, Stopped
from sstore.ledger import Ledger
from sstore.readonly import check_query
from sstore.rows import RowsLike
from sstore.runtime import CommitEvent, Runtime
from sstore.scheduler import Scheduler
from sstore.sql import bind, ident, qualified
from sstore.status import EngineStatus, read_status
from sstore.streams import PendingCommit, StreamStore
from sstore.subscriptions import Callback, Subscribers, Subscription
from sstore.table_declarations import is_same_redeclaration, split_statements
from sstore.transaction import Transaction

if TYPE_CHECKING:
    from sstore.observe.metrics import EngineMetrics
    from sstore.observe.server import Server
    from sstore.observe.sinks import ObservableSink

log = logging.getLogger("sstore")

GC_EVERY = 64


class Ingested(int):
    """The batch-id an ``ingest`` call used; ``duplicate`` is True when it was a no-op re-send.
    ``executions``: the transaction executions ``ingest_and_run`` ran (as ``run_until_idle``
    counts them; 0 for ``ingest``)."""

    duplicate: bool
    rows: int
    executions: int

    def __new__(cls, batch_id: int, duplicate: bool, rows: int,
                executions: int = 0) -> Ingested:
        obj = super().__new__(cls, batch_id)
        obj.duplicate = duplicate
        obj.rows = rows
        obj.executions = executions
        return obj


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
        #: run the TEs of one batch as one DuckDB transaction (``sstore.group``); False: one
        #: transaction per TE (same results, slower; for comparing and for debugging)
        self.group_commit = group_commit
        #: run consecutive SQL procedures of a batch as one statement inside a group commit
        #: (``sstore.fusion``); False: each runs its own statement (same rows out downstream)
        self.chain_sql = chain_sql
        #: a file-backed engine checkpoints after a commit once the WAL is this big, and when
        #: idle; never inside a transaction (``sstore.checkpoints``)
        self.checkpoint_wal_bytes = checkpoint_wal_bytes
        if path != ":memory:":
            parent = os.path.dirname(os.path.abspath(path))
            os.makedirs(parent, exist_ok=True)
        self._con = connect(path)
        self._input_log = InputLog(input_log, fsync=fsync) if input_log else None
        if self._input_log is not None:
            recovery.load_snapshot(self._con, self._input_log.path)
        systables.create(self._con)
        self.engine_id = self._identity()
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
        #: (``sstore.backpressure``): ``max_lag`` is the default bound, ``ingest_timeout``
        #: how long an ingest waits for a running reader before ``IngestTimeoutError``
        self.backpressure = Backpressure(max_lag, ingest_timeout, self.sinks)
        self._metrics: EngineMetrics | None = None
        #: per border stream, the batch-ids dead-letter replays took (-> the dead-lettered
        #: batch), read on the first re-send; an ``along`` ingest (a replay) forgets it
        self._replayed: dict[str, dict[int, int]] = {}
        self._server: Server | None = None

    def _identity(self) -> str:
        """This state's UUID (``sstore_sys.identity``), made when the state is first created.

        Full durability keeps it in the state file. Weak durability keeps it in the snapshot and
        in the input log (an identity record), so a replayed state keeps its identity and a
        fresh log gets a new one. Without durability every process is a new engine."""
        found = systables.engine_id(self._con)
        if found is None and self._input_log is not None:
            found = self._input_log.identity()
            if found is not None:
                systables.set_engine_id(self._con, found)
        if found is None:
            found = str(uuid.uuid4())
            systables.set_engine_id(self._con, found)
            if self._input_log is not None:
                self._input_log.append_identity(found)
        return found

    @classmethod
    def open_existing(cls, path: str) -> Engine:
        """Open a state file with the graph its program declared last time, to read its
        streams, migrate them or inspect them. Its procedures are known (for ordering and
        garbage collection) but never run here: their code lives in that program."""
        if not os.path.exists(path):
            raise DeclarationError(f"no state file at {path}")
        engine = cls(path)
        engine._foreign = True
        saved = systables.load_graph(engine._con)
        events = [EventWindowDecl.from_spec(spec["name"], spec)
                  for _, kind, spec in saved if kind == "event_window"]
        outputs = {name for e in events for name in (e.name, e.late)}  # declared with e
        for name, kind, spec in saved:
            if kind == "stream" and name in outputs:
                continue
            if kind == "stream":
                engine._graph.add_stream(StreamDecl(name, spec["columns"],
                                                    spec.get("retain", "latest")))
            elif kind == "window":
                engine._graph.add_window(WindowDecl(name, spec["source"], spec["size"],
                                                    spec["slide"], spec["unit"]))
            elif kind == "procedure":
                engine._graph.procedures[name] = ProcedureDecl(
                    name, _foreign_procedure, tuple(spec["inputs"]), tuple(spec["outputs"]),
                    ErrorPolicy(spec["on_error"]), spec["retries"],
                    timeout=spec.get("timeout"))
            elif kind == "trigger":
                engine._graph.add_trigger(TriggerDecl(spec["target"], spec["sql"]))
        for event in events:
            engine._graph.add_event_window(event)
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
        """Declare an event-time window over ``source`` (``sstore.event_windows`` has the
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

    def procedure(self, input: str | Sequence[str], output: str | Sequence[str] = (), *,
                  name: str | None = None, on_error: str | ErrorPolicy = ErrorPolicy.HALT,
                  retries: int = 2, timeout: float | None = None
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
        """
        self._declaring()
        inputs = (input,) if isinstance(input, str) else tuple(input)
        outputs = (output,) if isinstance(output, str) else tuple(output)

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._graph.add_procedure(ProcedureDecl(
                name or fn.__name__, fn, inputs, outputs, ErrorPolicy(on_error), retries,
                doc=(fn.__doc__ or "").strip().split("\n")[0], timeout=timeout))
            return fn

        return register

    def sql_procedure(self, name: str, sql: str, *, input: str, output: str,
                      on_error: str | ErrorPolicy = ErrorPolicy.HALT, retries: int = 2,
                      timeout: float | None = None, doc: str = "") -> None:
        """Declare a stored procedure that is one SELECT over its input batch ``batch``: its
        rows become batch b of ``output``. The same as a function procedure returning
        ``tx.sql(sql)``, but the engine may chain it with the SQL procedure that reads its
        output, running both (and the rest of such a chain) as one statement in the batch's
        group commit (``sstore.fusion``: an intermediate batch is then never materialized).
        The SELECT must not depend on the order of its input rows."""
        sql = fusion.check_select(name, sql)
        self._declaring()

        def run(tx: Transaction, batch: pa.Table) -> pa.Table:
            return tx.sql(sql)

        self._graph.add_procedure(ProcedureDecl(
            name, run, (input,), (output,), ErrorPolicy(on_error), retries,
            doc=doc or sql.strip().split("\n")[0], timeout=timeout, sql=sql))

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
        con, graph = self._con, self._graph
        order = graph.validate()
        store = StreamStore(con, graph)
        store.create_all()
        ledger = Ledger(graph, functools.partial(systables.was_ingested, con))
        collected = systables.load_collected(con)
        ledger.load(systables.load_commits(con, collected))
        ledger.collected = collected
        ledger.compacted = systables.compacted_through(con)
        borders = sorted(s for s in graph.streams if graph.is_border(s))
        for stream, ranges in systables.load_ingested(con, borders, ledger.ranges).items():
            ledger.load_ingested(stream, ranges)
        for name, gone in ledger.start_after_collected().items():
            log.warning("procedure %s is new: it starts after batch %d (earlier batches of "
                        "%s were collected before it was declared)", name, gone,
                        ", ".join(graph.procedures[name].inputs))
        for stream, consumer in systables.load_holders(con):
            if stream in graph.streams:
                ledger.holders.setdefault(stream, set()).add(consumer)
        for stream, consumer in self._declared_consumers:
            consumers.hold(con, ledger, stream, consumer)
        if not self._foreign:
            systables.save_graph(con, graph)
        rt = Runtime(con, graph, ledger, store, Scheduler(ledger, order), self._subscribers,
                     self._lock, threading.Condition(self._lock), self._input_log)
        rt.observers = self._observers  # shared: observers added later are seen too
        rt.reader = con.cursor()
        rt.load_committed()
        if self.path != ":memory:":
            rt.checkpoints = Checkpoints(con, self.path, self.checkpoint_wal_bytes)
        rt.interrupts = self._interrupts
        rt.chaining.enabled = self.chain_sql
        systables.create_halts(con)
        for name, (batch_id, error) in systables.load_halts(con).items():
            if name in graph.procedures:  # halted until resumed, across restarts
                rt.scheduler.halted[name] = systables.halt_text(batch_id, error)
        for node, batch_id, table in _latest_rows(store, ledger, graph):
            rt.latest[node] = (batch_id, table)
        if self._foreign:
            for name in graph.procedures:
                rt.scheduler.halted[name] = FOREIGN
        self._rt = rt
        if self._input_log is not None:
            count = recovery.replay(rt, self._input_log, lambda most: self._run_one(rt, most),
                                    self._replay_ingest, self._replay_oltp)
            log.info("replayed %d input-log records", count)

    # ------------------------------------------------------------------ input
    def ingest(self, stream: str, rows: RowsLike, batch_id: int | None = None, *,
               along: Callable[[Transaction], None] | None = None) -> Ingested:
        """Append one atomic batch to a border stream; return its batch-id.

        Without ``batch_id`` the next id is used. Re-sending an id that was already ingested with
        the same rows is a no-op (the result's ``duplicate`` is True); with other rows (another
        count, or another fingerprint, ``sstore.fingerprint``) it is refused with
        ``ResendMismatchError``, nothing ingested; a new id lower than the last one is rejected
        with ``OutOfOrderBatchError``, and so is an id a dead-letter replay took for its rows
        (``BatchIdTakenError``: the batch sent is not a re-send of it). Bad rows raise
        ``SchemaError`` and change nothing. A reader downstream past its backpressure bound
        makes it wait, then raise ``IngestTimeoutError``, or refuse at once
        (``ConsumerStalledError``), the batch not ingested (``sstore.backpressure``).

        ``along(tx)``: more statements that must commit with this batch or not at all; they
        run in the ingest's transaction after its rows (``sstore.dead_letters.replay`` deletes
        the dead letters it sends again there). Not with weak durability: its input log keeps
        the batch, not what ``along`` did, so a replay would lose it.
        """
        rt = self._runtime()
        if along is not None and rt.input_log is not None:
            raise DeclarationError("ingest(along=...) needs full durability: the input log of "
                                   "weak durability records the batch, not along's statements")
        return self._ingest(rt, stream, rows, batch_id, along=along)

    def ingest_and_run(self, stream: str, rows: RowsLike,
                       batch_id: int | None = None) -> Ingested:
        """``ingest`` followed by ``run_until_idle``, faster: the batch and the transaction
        executions of that batch that it makes runnable commit as one DuckDB transaction (a
        group commit led by the ingest, ``sstore.group.ingest_and_run``), and its rows are not
        stored when only those procedures read them. Same outcome, same guarantees, same
        errors as the two calls: a refused batch raises and changes nothing; if a procedure
        fails, the batch is committed on its own and the procedures run as they would after
        ``ingest``. A caller that feeds and runs in one thread (a loader, a benchmark) saves a
        COMMIT, a stored copy and a read of every batch.

        With weak durability (``input_log``) and with ``group_commit=False`` it is exactly
        the two calls."""
        rt = self._runtime()
        before = rt.te_seq
        if rt.input_log is not None or not self.group_commit:
            ingested = self._ingest(rt, stream, rows, batch_id)
        else:
            try:
                ingested = self._ingest(rt, stream, rows, batch_id, run=True)
            except Stopped:  # the batch is in (committed alone); one request, one Stopped,
                self._interrupts.stop_requested.clear()  # as from run_until_idle
                rt.subscribers.publish(rt.take_outbox())
                raise
        self.run_until_idle()
        return Ingested(ingested, ingested.duplicate, ingested.rows, rt.te_seq - before)

    def _ingest(self, rt: Runtime, stream: str, rows: RowsLike, batch_id: int | None, *,
                along: Callable[[Transaction], None] | None = None,
                run: bool = False) -> Ingested:
        """``ingest``'s checks and commit; ``run``: as the lead of a group (``ingest_and_run``)."""
        if stream not in rt.graph.streams:
            raise UnknownStreamError(f"no stream {stream!r}; streams: {sorted(rt.graph.streams)}")
        if not rt.graph.is_border(stream):
            raise DeclarationError(f"stream {stream!r} is written by "
                                   f"{rt.graph.writer_of(stream)}; only border streams "
                                   f"take ingest")
        if batch_id is not None:
            _check_batch_id(batch_id)
        table = rt.store.conform(stream, rows, f"stream {stream!r}")
        sent = fingerprint(table)  # outside the lock; recorded with the batch, or compared
        with rt.lock:
            self.backpressure.admit(rt, stream, batch_id)  # may wait, releasing the lock
            last = rt.ledger.last_ingested.get(stream, 0)
            if batch_id is None:
                batch_id = last + 1
                _check_batch_id(batch_id)
            elif rt.ledger.was_ingested(stream, batch_id):
                if stream not in self._replayed:
                    self._replayed[stream] = systables.replayed(rt.con, stream)
                replayed = self._replayed[stream].get(batch_id)
                if replayed is not None:
                    raise BatchIdTakenError(
                        f"stream {stream!r}: batch-id {batch_id} was taken by a dead-letter "
                        f"replay (the dead letters of batch {replayed}, sstore dead-letters "
                        f"replay), so this batch is not a re-send and was NOT ingested; send "
                        f"it under a batch-id above {last} (or without one)")
                _check_resend(rt, stream, batch_id, table, sent, last)
                log.info("stream %s batch %s was already ingested: no-op", stream, batch_id)
                return Ingested(batch_id, True, 0)
            elif batch_id < last:
                raise OutOfOrderBatchError(
                    f"stream {stream!r}: batch-id {batch_id} is lower than the last ingested "
                    f"({last}) and was never ingested; batches must arrive in increasing order")
            if run and not rt.interrupts.stopping():
                group.ingest_and_run(rt, stream, batch_id, table, sent, functools.partial(
                    self._apply_ingest, rt, stream, batch_id, table, False, sent))
            else:
                if along is not None:  # maybe a dead-letter replay: it records its batch-id
                    self._replayed.pop(stream, None)
                self._apply_ingest(rt, stream, batch_id, table, log_it=rt.input_log is not None,
                                   sent=sent, along=along)
            if rt.checkpoints is not None:
                rt.checkpoints.after_commit()
        rt.subscribers.publish(rt.take_outbox())
        return Ingested(batch_id, False, table.num_rows)

    def _apply_ingest(self, rt: Runtime, stream: str, batch_id: int, table: pa.Table,
                      log_it: bool, sent: int,
                      along: Callable[[Transaction], None] | None = None) -> None:
        """Commit protocol of an ingest (``sent``: the batch's fingerprint):

        1. BEGIN.
        2. Append the rows (EE triggers, windows): DuckDB checks NOT NULL, CHECK, keys here;
           then ``along``'s statements, if any.
        3. Insert the commit records, the batch's with its row count and fingerprint (what a
           re-send of its id is checked against, ``_check_resend``).
        4. Weak durability (``log_it``): append the batch to the input log, fsync. Only now,
           when the engine has accepted every row, so the log never holds a batch that
           cannot be replayed.
        5. COMMIT (on failure: ROLLBACK and cut the log record off again).
        6. Apply to memory.

        A crash before step 4 leaves nothing (the client re-sends); between 4 and 5 the batch
        is in the log, valid, and replayed at restart; after 5 it is committed and logged.
        """
        pending = PendingCommit()
        logged: int | None = None
        began = time.perf_counter()
        rt.con.begin()
        try:
            rt.store.append(stream, batch_id, table, pending, fingerprint=sent)
            if along is not None:
                tx = Transaction(rt.con, batch_id)
                along(tx)
                if tx.failure is not None:  # caught inside along: DuckDB aborted the transaction
                    raise TransactionStateError(f"a statement of ingest's along failed "
                                                f"({tx.failure})") from tx.failure
            systables.insert_commits(rt.con, pending.records, pending.fingerprints)
            if log_it and rt.input_log is not None:
                crash_point("ingest.before_log")
                logged = rt.input_log.append_ingest(stream, batch_id, table, rt.te_seq)
            crash_point("ingest.before_commit")
            rt.con.commit()
        except BaseException:
            _rollback(rt.con)
            rt.store.forget(pending)
            if logged is not None and rt.input_log is not None:
                rt.input_log.undo(logged)
            raise
        crash_point("ingest.after_commit")
        rt.finish(pending)
        if rt.observers:
            now = time.perf_counter()
            rt.observe(CommitEvent("ingest", stream, batch_id, table.num_rows, now,
                                   table.num_rows, now - began))

    def _replay_ingest(self, record: LogRecord) -> None:
        assert self._rt is not None and record.stream and record.batch_id and record.table is not None
        self._apply_ingest(self._rt, record.stream, record.batch_id, record.table, log_it=False,
                           sent=fingerprint(record.table))

    def _replay_oltp(self, record: LogRecord) -> None:
        assert self._rt is not None
        with self._transaction(self._rt, log_it=False) as tx:
            for sql, params in record.statements or []:
                tx.execute(sql, params=params)

    # ------------------------------------------------------------------ running
    def _run_one(self, rt: Runtime, most: int | None = None) -> bool:
        """Run the next transaction execution, if any, with the ones of the same batch that
        follow it as one group commit (at most ``most`` in all). Caller holds the lock. Raises
        ``Stopped`` instead when a stop was requested (``interrupt``)."""
        if rt.interrupts.stopping():
            raise Stopped("stopped between transaction executions")
        nxt = rt.scheduler.next()
        if nxt is None:
            return False
        if self.group_commit:
            group.run_batch(rt, *nxt, limit=most)
        else:
            run_te(rt, *nxt)
        if not rt.replaying and gc.due(rt, self.gc_every, self.gc_min_seconds):
            following = rt.scheduler.next()
            if following is None or following[1] != nxt[1]:  # between batches, not inside one
                gc.collect(rt)
        if rt.checkpoints is not None:
            rt.checkpoints.after_commit()
        return True

    @runner
    def run_until_idle(self, max_executions: int | None = None) -> int:
        """Run pending transaction executions in order until none is runnable; return how many
        ran (committed or dead-lettered). A halted procedure stops only itself and downstream.

        Raises ``Stopped`` when ``interrupt()`` (or ``sstore.stopping`` on a signal) asked the
        engine to stop: the execution in flight rolled back, nothing was recorded as an error.
        One request, one ``Stopped``: a later call runs again (unless the whole process is
        stopping)."""
        rt = self._runtime()
        done = 0
        try:
            while max_executions is None or done < max_executions:
                with rt.lock:
                    before = rt.te_seq
                    most = None if max_executions is None else max_executions - done
                    if not self._run_one(rt, most):
                        break
                    done += rt.te_seq - before
                rt.subscribers.publish(rt.take_outbox())
        except Stopped:
            self._interrupts.stop_requested.clear()
            rt.subscribers.publish(rt.take_outbox())  # what committed before the stop
            raise
        with rt.lock:
            if gc.due(rt, self.gc_every, self.gc_min_seconds):
                gc.collect(rt)
        return done

    @runner
    def run(self, stop: threading.Event, poll_seconds: float = 0.2) -> None:
        """Serve: run transaction executions as batches arrive until ``stop`` is set.

        Setting ``stop`` interrupts the execution in flight (it rolls back and runs again next
        time; no error, no halt) and ``run`` returns. ``interrupt()`` and ``sstore.stopping``
        end it the same way."""
        rt = self._runtime()
        served = threading.Event()
        relay = threading.Thread(target=self._relay_stop, args=(stop, served, poll_seconds),
                                 daemon=True, name="sstore-stop-relay")
        relay.start()
        try:
            while not stop.is_set():
                self.run_until_idle()
                with rt.lock:
                    if rt.scheduler.next() is None and not rt.interrupts.stopping():
                        if rt.since_gc:
                            gc.collect(rt)  # idle: a good moment to tidy up
                        if rt.checkpoints is not None:
                            rt.checkpoints.when_idle()
                        rt.wakeup.wait(poll_seconds)
        except Stopped:
            pass  # asked to stop (``stop``, ``interrupt()``, a signal): serving ends
        finally:
            served.set()
            relay.join()
            self._interrupts.stop_requested.clear()

    def _relay_stop(self, stop: threading.Event, served: threading.Event,
                    poll_seconds: float) -> None:
        """``run``'s helper: turn ``stop`` being set into ``interrupt()``."""
        while not served.is_set():
            if stop.wait(poll_seconds):
                if not served.is_set():
                    self.interrupt()
                return

    def interrupt(self) -> None:
        """Ask the engine to stop, from any thread (a signal handler should call it from a
        helper thread, as ``sstore.stopping`` does).

        The transaction execution in flight is interrupted (its DuckDB statement and its
        Python code) and rolls back, unless it is already committing; ``run_until_idle``
        raises ``Stopped`` and ``run`` returns. Nothing is recorded: no error, no halt. Ingests,
        queries and ad hoc transactions in flight are not interrupted (they are short)."""
        self._interrupts.request_stop()
        rt = self._rt
        if rt is not None and rt.wakeup.acquire(blocking=False):  # never wait for the lock
            try:
                rt.wakeup.notify_all()  # an idle ``run`` returns now, not after its poll
            finally:
                rt.wakeup.release()

    def resume(self, procedure: str) -> bool:
        """Let a halted procedure, or a halted consumer (a sink), try its failing batch again:
        its halt is deleted from the state file (a halt lasts across restarts until resumed).
        False if it was not halted; ``DeclarationError`` if there is no such procedure or
        consumer."""
        rt = self._runtime()
        consumers_known = {c for holders in rt.ledger.holders.values() for c in holders}
        if procedure not in rt.graph.procedures and procedure not in consumers_known:
            raise DeclarationError(
                f"no procedure or consumer {procedure!r}; procedures: "
                f"{', '.join(sorted(rt.graph.procedures)) or 'none'}; consumers: "
                f"{', '.join(sorted(consumers_known)) or 'none'}")
        with rt.lock:
            cleared = systables.clear_halt(rt.con, procedure)
            was = rt.scheduler.halted.pop(procedure, None)
            if self._foreign and procedure in rt.graph.procedures:
                rt.scheduler.halted[procedure] = FOREIGN  # its program runs it, not this one
                was = None
        return cleared or was is not None

    def halt_consumer(self, consumer: str, batch_id: int, message: str) -> None:
        """Record that ``consumer`` (a sink) stopped on a terminal error after ``batch_id``:
        the error and a halt, in one transaction. The halt lasts across restarts until
        ``resume`` (``sstore resume STATE CONSUMER``); ``status`` shows it."""
        rt = self._runtime()
        with rt.lock:
            rt.con.begin()
            try:
                systables.record_error(rt.con, consumer, batch_id, "halt", message)
                systables.record_halt(rt.con, consumer, batch_id, message)
                rt.con.commit()
            except BaseException:
                rt.con.rollback()
                raise

    def consumer_halt(self, consumer: str) -> str | None:
        """Why ``consumer`` is halted ("batch N: error"), or None."""
        rt = self._runtime()
        with rt.lock:
            halt = systables.load_halts(rt.con).get(consumer)
        return None if halt is None else systables.halt_text(*halt)

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
        """
        bound = bind(args, params)
        with self._lock:
            parts = [statement] if bound is not None else split_statements(self._con, statement)
            for part in parts:
                if is_same_redeclaration(self._con, part):
                    log.debug("table declaration already in the state file: %s", part)
                    continue
                try:
                    self._con.execute(part, bound)
                except duckdb.CatalogException as exc:
                    if not (part.lstrip()[:6].upper() == "CREATE" and "already exists" in str(exc)):
                        raise
                    log.debug("declaration already in the state file: %s", exc)

    def query(self, sql: str, *args: Any,
              params: Sequence[Any] | Mapping[str, Any] | None = None) -> pa.Table:
        """Run a read query over the current committed state; return an Arrow table.

        Read-only by construction, in two layers (statements that change state go through
        ``execute`` or ``transaction``):

        1. ``sstore.readonly.check_query``: one plain query (SELECT, WITH, set operations,
           VALUES) that calls nothing reaching outside the database, else
           ``ReadOnlyQueryError`` naming what was refused.
        2. It runs on a cursor of its own in a READ ONLY transaction: even SQL the check let
           through cannot change the state, and the query sees committed state only (not an
           open transaction of the engine's connection, nor Arrow tables registered there).

        The engine's connection keeps external access (weak durability ATTACHes snapshot
        files; DuckDB cannot switch it off for one cursor), so step 1 is what keeps files out.
        """
        return self._read(sql, bind(args, params),
                          lambda cursor, bound: arrow(cursor, sql, bound, large=True))

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
              run: Callable[[duckdb.DuckDBPyConnection, Any], Any]) -> Any:
        """``run`` on the reader cursor in a READ ONLY transaction, ``sql`` checked first."""
        check_query(sql, "duckdb")
        rt = self._runtime()
        # the engine's reader cursor, a connection of its own: DuckDB's MVCC gives it a
        # snapshot of what has committed while the engine's transactions go on, so a sink
        # reading its batches does not wait for the next batch's TEs, nor they for it
        with rt.reader_lock:
            cursor = rt.reader
            assert cursor is not None, "set when the engine starts"
            cursor.execute("BEGIN TRANSACTION READ ONLY")
            try:
                found = run(cursor, bound)  # an Arrow table's size unknown: streamed
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
            cursor.execute("COMMIT")
            return found

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """An ad hoc ACID transaction, serializable with the stream's transaction executions."""
        rt = self._runtime()
        with self._transaction(rt, log_it=rt.input_log is not None) as tx:
            yield tx

    @contextlib.contextmanager
    def _transaction(self, rt: Runtime, log_it: bool) -> Iterator[Transaction]:
        """Commit protocol of an ad hoc transaction:

        1. BEGIN.
        2. The block's statements (recorded, in weak durability).
        3. If any statement failed, even one whose error the block caught, ROLLBACK and raise
           ``TransactionStateError``: DuckDB aborted the transaction at that statement and its
           COMMIT would roll back without a word.
        4. Weak durability: append the statements to the input log, fsync.
        5. COMMIT (on failure: ROLLBACK and cut the log record off again).
        """
        statements: list[tuple[str, Any]] = []
        recorder = (lambda sql, params: statements.append((sql, params))) if log_it else None
        with rt.lock:
            tx = Transaction(rt.con, recorder=recorder)
            logged: int | None = None
            rt.con.begin()
            try:
                yield tx
                if tx.failure is not None:
                    raise TransactionStateError(
                        f"a statement of this transaction failed ({tx.failure}) and the error "
                        f"was caught inside the block; DuckDB aborted the transaction, so "
                        f"nothing was committed") from tx.failure
                if log_it and statements and rt.input_log is not None:
                    logged = rt.input_log.append_oltp(statements, rt.te_seq)
                rt.con.commit()
                tx._mark_committed()
            except BaseException:
                _rollback(rt.con)
                if logged is not None and rt.input_log is not None:
                    rt.input_log.undo(logged)
                tx._mark_rolled_back()
                raise

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
    def metrics(self) -> EngineMetrics:
        """This engine's live metrics (``sstore.observe.metrics``), made on the first call:
        from then on every commit updates a few counters and a latency histogram (no SQL).
        Nothing is counted until something asks; ``serve`` does."""
        with self._lock:
            if self._metrics is None:
                from sstore.observe.metrics import EngineMetrics
                self._metrics = EngineMetrics(self)
            return self._metrics

    def serve(self, port: int = 0, host: str = "127.0.0.1") -> str:
        """Serve live status, Prometheus metrics and a dashboard over HTTP from this process,
        until ``close``; return the URL (``/`` the dashboard, ``/status`` JSON, ``/metrics``).

        ``port`` 0 takes any free port. ``host`` 127.0.0.1 (the default) answers this machine
        only; there is no authentication, so bind wider only on a network you trust. A state
        file gets ``STATE.live.json`` beside it, so that ``sstore status STATE`` reaches this
        process while it holds the file. Serving again returns the same URL."""
        if self._closed:
            raise SStoreError("the engine is closed")
        with self._lock:
            if self._server is not None:
                if port not in (0, self._server.port) or host != self._server.host:
                    raise DeclarationError(f"this engine already serves at "
                                           f"{self._server.url}")
                return self._server.url
            from sstore.observe.server import Server
            server = Server(self, self.metrics(), host, port)
            self._server = server
        return server.start()

    @property
    def serving_url(self) -> str | None:
        """The URL ``serve`` answers on, or None when not serving."""
        return self._server.url if self._server is not None else None

    def register_sink(self, sink: ObservableSink) -> None:
        """Show ``sink`` in this engine's metrics and status (see ``sstore.observe.sinks``).
        A sink with the same consumer name replaces the one registered before."""
        name = sink.metrics_snapshot().name
        with self._lock:
            self._sinks[name] = sink
            if self._metrics is not None:
                self._metrics.track_sink(sink)

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
        for ``sstore.observe``, which reads it under ``lock``."""
        return self._rt

    def latest(self, stream: str) -> tuple[int, pa.Table] | None:
        """The newest committed batch of a stream: (batch_id, rows), or None (pull mode).
        Raises ``ChainedBatchError`` if that batch was chained away (``sstore.fusion``)."""
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
        rt = self._runtime()
        with rt.lock:
            return consumers.hold(rt.con, rt.ledger, stream, consumer)

    def release(self, stream: str, consumer: str) -> bool:
        """Stop holding ``stream`` for ``consumer`` (same as ``drop_consumer``)."""
        return self.drop_consumer(stream, consumer)

    def drop_consumer(self, stream: str, consumer: str) -> bool:
        """End ``consumer``'s hold on ``stream``: its batches are collected as if it had never
        existed. True if there was such a consumer."""
        rt = self._runtime()
        with rt.lock:
            rt.wakeup.notify_all()  # an ingest waiting for this consumer re-checks
            return consumers.drop(rt.con, rt.ledger, stream, consumer, rt.pending_acks)

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
        rt = self._runtime()
        with rt.lock:
            return consumers.continue_from(rt.con, rt.ledger, stream, consumer, after,
                                           accept_gap)

    def rewind(self, consumer: str, batch_id: int) -> None:
        """Move ``consumer``'s acknowledgement back to ``batch_id``: its target lost batches it
        had taken (the engine delivers them again if it still has them)."""
        rt = self._runtime()
        with rt.lock:
            consumers.rewind(rt.con, rt.ledger, consumer, batch_id, rt.pending_acks)

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
        batch order."""
        rt = self._runtime()
        with rt.lock:
            if rt.store.schema(stream) is None:
                return pa.table({"_batch_id": pa.array([], pa.int64())})
            return arrow(rt.con, f"SELECT * FROM {ident(stream)} WHERE _batch_id BETWEEN ? AND ? "
                                 f"ORDER BY _batch_id", [first, last], large=True)

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
        with rt.lock, registered(rt.con, "sstore_load", rows):
            rt.con.begin()
            try:
                _create_like(rt.con, table, "sstore_load", key)
                if mode == "replace":
                    rt.con.execute(f"DELETE FROM {qualified(table)}")
                verb = "INSERT OR REPLACE" if mode == "merge" else "INSERT"
                names = ", ".join(ident(c) for c in rows.column_names)
                rt.con.execute(f"{verb} INTO {qualified(table)} ({names}) "
                               f"SELECT {names} FROM sstore_load")
                rt.con.commit()
            except BaseException:
                rt.con.rollback()
                raise
        return rows.num_rows

    def schema(self, stream: str) -> pa.Schema | None:
        """The Arrow schema of a stream's rows (None for an output not produced yet)."""
        return self._runtime().store.schema(stream)

    def acknowledge(self, consumer: str, batch_id: int) -> None:
        """Record that ``consumer`` has safely taken every held batch up to ``batch_id``: at
        once in memory (garbage collection, backpressure), in the state file with the next
        transaction that writes commit records anyway (no COMMIT of its own under the lock;
        ``sstore.consumers``, step 3)."""
        rt = self._runtime()
        with rt.lock:
            if consumers.acknowledge(rt.ledger, rt.pending_acks, consumer, batch_id):
                rt.wakeup.notify_all()  # an ingest waiting for this consumer re-checks now

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

    def close(self) -> None:
        if self._closed:
            return
        self._interrupts.close()
        if self._server is not None:  # first: its readers take the lock this close needs
            self._server.stop()
            self._server = None
        with self._lock:
            self._closed = True
            if self._rt is not None and self._rt.pending_acks:
                try:
                    consumers.write_acks(self._con, self._rt.pending_acks)
                except duckdb.Error as exc:  # harmless: the targets' watermarks decide
                    log.warning("acknowledgements not written at close: %s", exc)
            if self._input_log is not None:
                self._input_log.close()
            if self._rt is not None and self._rt.reader is not None:
                with self._rt.reader_lock:
                    self._rt.reader.close()
            self._con.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    """ROLLBACK after a failure; a failed COMMIT has already ended the transaction, and that
    second error must not hide the first."""
    try:
        con.rollback()
    except duckdb.TransactionException:
        pass


MAX_BATCH_ID = 2 ** 63 - 1  # batch-ids are stored as BIGINT


def _check_resend(rt: Runtime, stream: str, batch_id: int, table: pa.Table, sent: int,
                  last: int) -> None:
    """A re-send of ingested batch ``batch_id`` is a no-op only if it carries the same rows:
    compare the row count and the fingerprint (``sent``) with the batch's commit record and
    raise ``ResendMismatchError`` if either differs, before anything is written.

    Checked against what the record still holds: a record written before fingerprints
    existed has the row count only, and one that GC compacted into a run of ids
    (``systables.compact_statements``, once 4,096 collected batches pile up) has neither, so
    such a re-send stays an unchecked no-op. A point query, paid by re-sends only."""
    recorded = systables.ingested_record(rt.con, stream, batch_id)
    if recorded is None:
        return
    rows, recorded_print = recorded
    if rows != table.num_rows or (recorded_print is not None and recorded_print != sent):
        raise ResendMismatchError(stream, batch_id, rows, table.num_rows, last)


def _check_batch_id(batch_id: object) -> None:
    """Refuse a batch-id DuckDB cannot store, before any transaction (a raw ConversionException
    from inside the ingest's transaction would say nothing about the cause)."""
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 1:
        raise OutOfOrderBatchError(f"batch-id must be a positive integer, got {batch_id!r}")
    if batch_id > MAX_BATCH_ID:
        raise OutOfOrderBatchError(f"batch-id {batch_id} does not fit in a BIGINT (at most "
                                   f"{MAX_BATCH_ID})")


FOREIGN = "declared by the program that owns this state file; only that program runs it"


def _foreign_procedure(tx: Transaction, batch: Any) -> None:
    raise DeclarationError(FOREIGN)


def _create_like(con: duckdb.DuckDBPyConnection, table: str, relation: str,
                 key: Sequence[str]) -> None:
    """CREATE TABLE IF NOT EXISTS with the relation's column types and ``key`` as primary key."""
    columns = con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()
    cols = ", ".join(f"{ident(name)} {ctype}" for name, ctype, *_ in columns)
    if key:
        cols += f", PRIMARY KEY ({', '.join(ident(k) for k in key)})"
    con.execute(f"CREATE TABLE IF NOT EXISTS {qualified(table)} ({cols})")


def _latest_rows(store: StreamStore, ledger: Ledger, graph: Graph
                 ) -> Iterator[tuple[str, int, pa.Table]]:
    """After a restart, the newest retained batch of each stream (for ``Engine.latest``)."""
    for name in graph.streams:
        ids = ledger.node_batches(name).ids
        if ids and store.schema(name) is not None:
            yield name, ids[-1], store.read(name, ids[-1])
