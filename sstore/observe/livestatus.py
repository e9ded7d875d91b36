"""The ``/status`` document: ``Engine.status().to_dict()`` plus ``live`` numbers.

``Engine.status()`` reads DuckDB (errors, row counts, consumer gaps) under the engine's lock.
A reader must not wait behind a long transaction forever, so the lock is tried for
``STATUS_LOCK_TIMEOUT`` seconds; if it stays busy, the procedures and streams come from memory
(the live snapshot), consumers and errors are left out, and ``live.skipped`` says so.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from sstore.storage.status import EngineStatus, ProcedureStatus, StreamStatus, dataflow_nodes

if TYPE_CHECKING:
    from sstore.engine_view import EngineView
    from sstore.observe.metrics import EngineMetrics, Live

STATUS_LOCK_TIMEOUT = 0.5


def live_status(engine: EngineView, metrics: EngineMetrics, url: str) -> dict[str, Any]:
    """The JSON document of ``/status`` (also what ``sstore status`` prints when live)."""
    live = metrics.snapshot()
    status, skipped = _engine_status(engine)
    if status is None:
        status = _from_memory(engine, live)
    doc = status.to_dict()
    doc["live"] = {"pid": os.getpid(), "url": url, "skipped": skipped,
                   "dataflow": _dataflow(status, live), **asdict(live)}
    return doc


def _engine_status(engine: EngineView) -> tuple[EngineStatus | None, str | None]:
    """``Engine.status()`` (before the engine starts: the state file's) if the engine's lock
    comes free in time; else why not."""
    if not engine.lock.acquire(timeout=STATUS_LOCK_TIMEOUT):
        return None, (f"the engine held its lock for more than {STATUS_LOCK_TIMEOUT:g} s (a "
                      f"long transaction): procedures and streams are from memory, consumers "
                      f"and errors (read from DuckDB) were skipped")
    try:
        return engine.status(), None
    finally:
        engine.lock.release()


def _from_memory(engine: EngineView, live: Live) -> EngineStatus:
    graph = engine.graph
    status = EngineStatus(engine.path, engine.durability, engine_id=engine.engine_id)
    for p in live.procedures:
        decl = graph.procedures[p.name]
        status.procedures.append(ProcedureStatus(
            p.name, list(decl.inputs), list(decl.outputs), p.last_batch, p.pending, p.halted,
            decl.on_error.value, p.last_commit_at))
    for s in live.streams:
        source = graph.windows[s.name].source if s.name in graph.windows else (
            graph.event_windows[graph.event_outputs[s.name]].source
            if s.name in graph.event_outputs else None)
        status.streams.append(StreamStatus(s.name, s.kind, s.last_batch, s.retained_rows,
                                           None, source))
    position = {name: i for i, (_, name) in enumerate(dataflow_nodes(status))}
    status.streams.sort(key=lambda s: position[s.name])
    return status


def _dataflow(status: EngineStatus, live: Live) -> list[dict[str, Any]]:
    """Every node in dataflow order with the nodes it reads from (for drawing the graph);
    a sink comes right after its stream."""
    producer = {out: p.name for p in status.procedures for out in p.outputs}
    inputs = {p.name: list(p.inputs) for p in status.procedures}
    for s in status.streams:
        inputs[s.name] = [s.source] if s.source else [producer[s.name]] \
            if s.name in producer else []
    nodes: list[dict[str, Any]] = []
    for kind, name in dataflow_nodes(status):
        nodes.append({"kind": kind, "name": name, "inputs": inputs.get(name, [])})
        for sink in live.sinks:
            if sink.stream == name:
                nodes.append({"kind": "sink", "name": sink.name, "inputs": [name]})
    listed = {n["name"] for n in nodes}
    for sink in live.sinks:  # a sink of a stream the graph does not list (not yet started)
        if sink.name not in listed:
            nodes.append({"kind": "sink", "name": sink.name, "inputs": []})
    return nodes
