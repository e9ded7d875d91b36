"""Opening, starting and closing an engine's state: the connection, input log and identity of
a state (``open_state``), the graph a state file's own program declared (for
``Engine.open_existing``), the runtime rebuilt from the state file on first use
(``Engine._start``: streams created, ledger, holds, halts, newest batches), and what a close
writes and releases.

The input log's replay, the last step of a start in weak durability, stays with the engine: it
runs the engine's own ingest, ad hoc and TE paths.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import duckdb
import pyarrow as pa

from sstore.base.duck import connect
from sstore.base.errors import DeclarationError
from sstore.base.faults import crash_point
from sstore.dataflow import stream_writes
from sstore.dataflow.graph import (
    ErrorPolicy,
    EventWindowDecl,
    Graph,
    ProcedureDecl,
    StreamDecl,
    TriggerDecl,
    WindowDecl,
)
from sstore.execution import recovery
from sstore.execution.halts import FOREIGN
from sstore.execution.interrupts import Interrupts
from sstore.execution.runtime import CommitEvent, Runtime
from sstore.execution.scheduler import Scheduler
from sstore.execution.transaction import Transaction
from sstore.storage import consumers, redeclared, systables, versioned
from sstore.storage import upgrades as upgrades_
from sstore.storage.checkpoints import Checkpoints
from sstore.storage.evolution import Explicit
from sstore.storage.inputlog import InputLog
from sstore.storage.ledger import Ledger
from sstore.storage.streams import StreamStore
from sstore.storage.subscriptions import Subscribers
from sstore.storage.upgrades import Upgrade

log = logging.getLogger("sstore")


def open_state(path: str, input_log: str | None, fsync: bool
               ) -> tuple[duckdb.DuckDBPyConnection, InputLog | None, str]:
    """The engine's connection to the state at ``path`` (its folder made if missing), its
    input log (weak durability: ``input_log`` given, its snapshot loaded) and its identity,
    once the system tables exist."""
    if path != ":memory:":
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
    con = connect(path)
    log_file = InputLog(input_log, fsync=fsync) if input_log else None
    if log_file is not None:
        recovery.load_snapshot(con, log_file.path)
    systables.create(con)
    return con, log_file, identity(con, log_file)


def identity(con: duckdb.DuckDBPyConnection, input_log: InputLog | None) -> str:
    """This state's UUID (``sstore_sys.identity``), made when the state is first created.

    Full durability keeps it in the state file. Weak durability keeps it in the snapshot and
    in the input log (an identity record), so a replayed state keeps its identity and a
    fresh log gets a new one. Without durability every process is a new engine."""
    found = systables.engine_id(con)
    if found is None and input_log is not None:
        found = input_log.identity()
        if found is not None:
            systables.set_engine_id(con, found)
    if found is None:
        found = str(uuid.uuid4())
        systables.set_engine_id(con, found)
        if input_log is not None:
            input_log.append_identity(found)
    return found


def declare_saved_graph(con: duckdb.DuckDBPyConnection, graph: Graph) -> None:
    """Declare in ``graph`` what the state file's program declared last time
    (``sstore_sys``'s saved graph); its procedures raise if run (``FOREIGN``)."""
    saved = systables.load_graph(con)
    events = [EventWindowDecl.from_spec(spec["name"], spec)
              for _, kind, spec in saved if kind == "event_window"]
    outputs = {name for e in events for name in (e.name, e.late)}  # declared with e
    for name, kind, spec in saved:
        if kind == "stream" and name in outputs:
            continue
        if kind == "stream":
            graph.add_stream(StreamDecl(name, spec["columns"], spec.get("retain", "latest")))
        elif kind == "window":
            graph.add_window(WindowDecl(name, spec["source"], spec["size"],
                                        spec["slide"], spec["unit"]))
        elif kind == "procedure":
            graph.procedures[name] = ProcedureDecl(
                name, _foreign_procedure, tuple(spec["inputs"]), tuple(spec["outputs"]),
                ErrorPolicy(spec["on_error"]), spec["retries"],
                timeout=spec.get("timeout"))
        elif kind == "trigger":
            graph.add_trigger(TriggerDecl(spec["target"], spec["sql"]))
    for event in events:
        graph.add_event_window(event)


def build_runtime(con: duckdb.DuckDBPyConnection, graph: Graph, *,
                  declared_consumers: list[tuple[str, str]], foreign: bool,
                  subscribers: Subscribers, lock: threading.RLock,
                  input_log: InputLog | None, observers: list[Callable[[CommitEvent], None]],
                  path: str, checkpoint_wal_bytes: int, interrupts: Interrupts,
                  chain_sql: bool, retired: Collection[str] = (),
                  evolutions: Mapping[str, Explicit] | None = None,
                  versions: Mapping[str, int] | None = None,
                  upgrades: Mapping[str, Upgrade] | None = None) -> Runtime:
    """Start on the declared ``graph``: check it, create what is missing, rebuild the ledger
    from the commit records, take the consumers' holds and the halts, find each stream's
    newest batch. The arguments are the engine's own (its connection, lock, subscribers,
    observers, input log, interrupts and settings); ``foreign``: opened by ``open_existing``,
    so the graph is not saved and every procedure is halted (``FOREIGN``); ``retired``:
    procedures of the last program retired on purpose (``sstore.storage.redeclared``);
    ``evolutions``: ``Engine.evolve``'s explicit changes per stream (``sstore.storage.evolution``);
    ``versions``, ``upgrades``: declared procedure versions and ``Engine.upgrade``'s switches
    (``sstore.storage.upgrades``)."""
    order = graph.validate()
    blocked = None if input_log is None else functools.partial(
        recovery.unreplayed_batches, con, input_log)
    switches = upgrades_.Switches([], [])
    if not foreign:
        redeclared.check(con, graph, retired)
        switches = upgrades_.check(con, graph, versions or {}, upgrades or {}, retired)
    store = StreamStore(con, graph)
    plans = store.plan_evolutions(evolutions, foreign=foreign)
    with versioned.start_transaction(con):  # evolutions, switches, holds, graph: or none
        store.create_all(plans, blocked=blocked)
        evolved = bool(store.evolved)
        store.evolved += [f"procedure {name}" for name in switches.record(con, blocked)]
        ledger = _load_ledger(con, graph, declared_consumers)
        if not foreign:
            systables.save_graph(con, graph)
    if evolved:
        crash_point("evolve.after_commit")
    rt = Runtime(con, graph, ledger, store, Scheduler(ledger, order), subscribers,
                 lock, threading.Condition(lock), input_log)
    rt.observers = observers  # shared: observers added later are seen too
    rt.stream_tables = stream_writes.stream_tables(graph)
    rt.reader = con.cursor()
    rt.load_committed()
    if path != ":memory:":
        rt.checkpoints = Checkpoints(con, path, checkpoint_wal_bytes)
    rt.interrupts = interrupts
    rt.retired = frozenset(retired)
    # weak durability checks each TE's outputs at replay (``sstore.base.digest``): a chained-away
    # batch has none, and whether a batch is chained depends on what this process learned
    rt.chaining.enabled = chain_sql and input_log is None
    systables.create_halts(con)
    for name, (batch_id, error) in systables.load_halts(con).items():
        if name in graph.procedures:  # halted until resumed, across restarts
            rt.scheduler.halted[name] = systables.halt_text(batch_id, error)
    for node, batch_id, table in _latest_rows(store, ledger, graph):
        rt.latest[node] = (batch_id, table)
    if foreign:
        for name in graph.procedures:
            rt.scheduler.halted[name] = FOREIGN
    return rt


def _load_ledger(con: duckdb.DuckDBPyConnection, graph: Graph,
                 declared_consumers: list[tuple[str, str]]) -> Ledger:
    """The ledger rebuilt from the commit records, with the consumers' holds (the declared
    ones taken now, in the start's transaction)."""
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
    for stream, consumer in declared_consumers:
        consumers.hold(con, ledger, stream, consumer)
    return ledger


def close_state(con: duckdb.DuckDBPyConnection, rt: Runtime | None,
                input_log: InputLog | None) -> None:
    """``Engine.close``, under the engine's lock: write the acknowledgements still pending,
    close the input log, the reader cursor and the connection."""
    if rt is not None and rt.pending_acks:
        try:
            consumers.write_acks(con, rt.pending_acks)
        except duckdb.Error as exc:  # harmless: the targets' watermarks decide
            log.warning("acknowledgements not written at close: %s", exc)
    if input_log is not None:
        input_log.close()
    if rt is not None and rt.reader is not None:
        with rt.reader_lock:
            rt.reader.close()
    con.close()


def _foreign_procedure(tx: Transaction, batch: Any) -> None:
    raise DeclarationError(FOREIGN)


def _latest_rows(store: StreamStore, ledger: Ledger, graph: Graph
                 ) -> Iterator[tuple[str, int, pa.Table]]:
    """After a restart, the newest retained batch of each stream (for ``Engine.latest``)."""
    for name in graph.streams:
        ids = ledger.node_batches(name).ids
        if ids and store.schema(name) is not None:
            yield name, ids[-1], store.read(name, ids[-1])
