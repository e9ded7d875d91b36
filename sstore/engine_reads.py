"""What readers ask of an ``Engine``: read-only queries over committed state, a stream's
batches and schema, and everything a consumer (a sink, a migration) holds, acknowledges,
rewinds or halts, each through the consumer port (``sstore.execution.consumer_port``).

A part of ``Engine`` (``sstore.engine`` mixes it in), kept apart because reading is one job:
nothing here writes a stream or runs a procedure; every call starts the engine first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import duckdb
import pyarrow as pa

from sstore.base.duck import arrow
from sstore.base.errors import ChainedBatchError, UnknownStreamError
from sstore.base.readonly import check_query
from sstore.base.sql import bind, literal
from sstore.dataflow.graph import Graph
from sstore.execution import adhoc, consumer_port, halts
from sstore.execution.consumer_port import ConsumerPort
from sstore.execution.runtime import Runtime
from sstore.storage import consumers, evolution, upgrades
from sstore.storage.consumers import ConsumerStatus
from sstore.storage.subscriptions import Callback, Subscription

T = TypeVar("T")


class Reads:
    """The reading half of ``Engine``'s API (the attributes are the engine's own)."""

    _rt: Runtime | None
    _graph: Graph
    _declared_consumers: list[tuple[str, str]]

    if TYPE_CHECKING:  # the engine's own (``Engine._runtime`` starts it on first use)
        def _runtime(self) -> Runtime: ...

        def subscribe(self, stream: str, callback: Callback | None = None
                      ) -> Subscription: ...

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
