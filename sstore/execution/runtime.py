"""The state an engine shares between its parts once it has started.

Everything here is guarded by ``lock`` (but ``reader`` and ``committed``, which have their own
locks so that queries and sinks do not wait for a running transaction): one transaction at a
time touches the DuckDB connection, which makes stream transactions and ad hoc transactions
serializable by construction (H-Store's single-threaded partition, without the partitioning).
``finish`` is the one place where a committed transaction's effects reach memory.
"""

from __future__ import annotations

import bisect
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from sstore.dataflow.fusion import Chaining
from sstore.dataflow.graph import Graph
from sstore.execution.interrupts import Interrupts
from sstore.execution.passing import Passing
from sstore.execution.scheduler import Scheduler
from sstore.storage.checkpoints import Checkpoints
from sstore.storage.inputlog import InputLog
from sstore.storage.ledger import Ledger, NodeBatches
from sstore.storage.streams import PendingCommit, StreamStore
from sstore.storage.subscriptions import Subscribers

CACHE_BATCHES = 256


@dataclass(frozen=True)
class CommitEvent:
    """One committed transaction: an ingest (``node`` = stream) or a transaction execution
    (``node`` = procedure). ``at`` is ``time.perf_counter()`` right after COMMIT; ``rows`` are
    the rows written (an ingest's batch, a TE's outputs), ``rows_in`` the rows read (a TE's
    input batches); ``seconds`` is how long the transaction took, BEGIN to COMMIT (for a TE,
    of its last attempt). A TE committed in a group (``sstore.execution.group``) has ``group`` > 0:
    ``seconds`` is then its own work only, and ``commit_seconds`` the group's closing steps
    (held-back rows, commit records, COMMIT), the same on each of the ``group`` members. An
    ingest that led a group (``Engine.ingest_and_run``) counts as one of them."""

    kind: str  # "ingest" or "te"
    node: str
    batch_id: int
    rows: int
    at: float
    rows_in: int = 0
    seconds: float = 0.0
    group: int = 0
    commit_seconds: float = 0.0


@dataclass
class Runtime:
    con: duckdb.DuckDBPyConnection
    graph: Graph
    ledger: Ledger
    store: StreamStore
    scheduler: Scheduler
    subscribers: Subscribers
    lock: threading.RLock
    wakeup: threading.Condition
    input_log: InputLog | None = None
    te_seq: int = 0  # transaction executions committed by this process (weak-mode replay order)
    replaying: bool = False
    since_gc: int = 0
    #: time.monotonic() of the last GC, or of the start: the first GC waits too (``gc.due``)
    gc_at: float = field(default_factory=time.monotonic)
    cache: collections.OrderedDict[tuple[str, int], pa.Table] = field(
        default_factory=collections.OrderedDict)
    latest: dict[str, tuple[int, pa.Table]] = field(default_factory=dict)
    outbox: list[tuple[str, int, pa.Table]] = field(default_factory=list)
    observers: list[Callable[[CommitEvent], None]] = field(default_factory=list)
    interrupts: Interrupts = field(default_factory=Interrupts)  # stops and timeouts of TEs
    checkpoints: Checkpoints | None = None  # a file-backed engine's (sstore.storage.checkpoints)
    #: procedures this program retires on purpose (``Engine.retire``): weak-durability replay
    #: names a program change, not non-determinism, when the log disagrees
    #: (``sstore.execution.recovery``)
    retired: frozenset[str] = frozenset()
    chaining: Chaining = field(default_factory=Chaining)  # SQL procedures (sstore.dataflow.fusion)
    #: which batches a group may pass in memory (``sstore.execution.passing``)
    passing: Passing = field(default_factory=Passing)
    #: a cursor for ``Engine.query`` (read-only snapshots, concurrent with the engine's
    #: transactions), used by one query at a time
    reader: duckdb.DuckDBPyConnection | None = None
    reader_lock: threading.Lock = field(default_factory=threading.Lock)
    #: the committed batches of every stream, (batch-id, rows), guarded by ``committed_lock``
    #: instead of ``lock``: a sink planning its next chunk reads them without waiting behind
    #: the next batch's TEs. Only ``finish`` adds to it (after COMMIT: a group commit records
    #: its members in the ledger before it) and only GC takes from it.
    committed: dict[str, NodeBatches] = field(default_factory=dict)
    committed_lock: threading.Lock = field(default_factory=threading.Lock)
    #: acknowledgements taken in memory and not yet written (``sstore.storage.consumers``): consumer
    #: -> batch-id; the next group commit, GC, status or close writes them
    pending_acks: dict[str, int] = field(default_factory=dict)
    #: lower-case names of the dataflow's stream and window tables, which procedures must
    #: not write with SQL (``sstore.dataflow.stream_writes``); set at start
    stream_tables: frozenset[str] = frozenset()

    def load_committed(self) -> None:
        """At start: the ledger's stream batches, which are all committed then."""
        with self.committed_lock:
            for stream in self.graph.streams:
                nb = self.ledger.node_batches(stream)
                self.committed[stream] = NodeBatches(list(nb.ids), list(nb.numbers))

    def committed_batches(self, stream: str, after: int) -> list[tuple[int, int]]:
        """Committed batches of ``stream`` after ``after``, still stored: (batch-id, rows)."""
        with self.committed_lock:
            nb = self.committed.get(stream)
            if nb is None:
                return []
            i = bisect.bisect_right(nb.ids, after)
            return list(zip(nb.ids[i:], nb.numbers[i:]))

    def drop_committed(self, stream: str, through: int) -> None:
        """GC removed the batches of ``stream`` up to ``through``."""
        with self.committed_lock:
            nb = self.committed.get(stream)
            if nb is not None:
                nb.drop_through(through)

    def observe(self, event: CommitEvent) -> None:
        """Tell observers (metrics, benchmarks) about a commit; called under the lock, so an
        observer must be quick and must not call back into the engine."""
        for observer in self.observers:
            observer(event)

    def finish(self, pending: PendingCommit, *, recorded: bool = False,
               consumed: frozenset[str] = frozenset()) -> None:
        """Apply a committed transaction to memory: ledger, windows, cache, subscribers.

        ``recorded``: the ledger has the records already (a group commit records them before
        its COMMIT, ``sstore.execution.group``); ``consumed``: streams whose batch every reader has
        read already (in the same group), so it is not cached."""
        pending.apply()
        if not recorded:
            for node, batch_id, number in pending.records:
                self.ledger.record(node, batch_id, number)
        with self.committed_lock:
            for node, batch_id, number in pending.records:
                if node in self.graph.streams:
                    self.committed.setdefault(node, NodeBatches()).add(batch_id, number)
        for stream, batch_id, table in pending.published:
            if self.graph.consumers_of(stream) and stream not in consumed:
                self.cache[(stream, batch_id)] = table
                while len(self.cache) > CACHE_BATCHES:
                    self.cache.popitem(last=False)
            self.latest[stream] = (batch_id, table)
            if self.chaining.unmaterialized:
                self.chaining.unmaterialized.pop(stream, None)
            if not self.replaying and self.subscribers.wants(stream):
                self.outbox.append((stream, batch_id, table))
        self.wakeup.notify_all()

    def take_outbox(self) -> list[tuple[str, int, pa.Table]]:
        with self.lock:
            items, self.outbox = self.outbox, []
        return items

    def input_batch(self, node: str, batch_id: int) -> pa.Table:
        """Batch ``batch_id`` of a stream (from the cache when it is there) or a window."""
        if node in self.graph.windows:
            promoted = self.ledger.node_batches(node).number(batch_id)
            if promoted is None:
                return self.store.schemas[self.graph.windows[node].source].empty_table()
            return self.store.read_window(node, promoted)
        cached = self.cache.pop((node, batch_id), None)
        if cached is not None:
            if len(self.graph.consumers_of(node)) > 1:
                self.cache[(node, batch_id)] = cached  # other consumers still want it
            return cached
        schema = self.store.schema(node)
        rows = self.ledger.node_batches(node).number(batch_id)
        if rows in (None, 0) and schema is not None:
            return schema.empty_table()
        return self.store.read(node, batch_id, rows or 0)
