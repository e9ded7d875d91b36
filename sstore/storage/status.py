"""What an engine is doing, read from its system tables (so it works on a bare state file too).

Procedures and streams are listed in dataflow order: a procedure after every procedure whose
output it reads, a stream or window just before its first reader (``dataflow_nodes``), so a
status reads from sources to sinks whatever order the program declared things in.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import duckdb

from sstore.base.duck import connect
from sstore.base.redact import mask_secrets
from sstore.base.sql import ident
from sstore.storage import evolution, systables, upgrades
from sstore.storage.consumers import ConsumerStatus, describe
from sstore.storage.systables import halt_text, load_graph, load_halts


@dataclass
class ProcedureStatus:
    name: str
    inputs: list[str]
    outputs: list[str]
    last_batch: int
    pending: int
    halted: str | None
    on_error: str
    last_commit_at: str | None = None  # ISO time of ``last_batch``'s commit (None: unknown)
    #: the procedure's recorded versions, oldest first (``sstore.storage.upgrades.load``; empty: it
    #: never changed): version, from_batch, change, code, recorded_at
    versions: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class StreamStatus:
    name: str
    kind: str  # "border", "derived", "window"
    last_batch: int
    retained_rows: int | None
    last_commit_at: str | None = None  # ISO time of ``last_batch``'s commit (None: unknown)
    source: str | None = None  # a window's stream
    #: the stream's recorded versions, oldest first (``sstore.storage.evolution.load``; empty: it
    #: never evolved): version, first_batch, columns, change, evolved_at
    versions: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class EngineStatus:
    path: str
    durability: str
    procedures: list[ProcedureStatus] = field(default_factory=list)
    streams: list[StreamStatus] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    engine_id: str | None = None
    consumers: list[ConsumerStatus] = field(default_factory=list)
    live: dict[str, Any] | None = None  # what a serving engine adds (``sstore.observe``)
    #: a running engine's readers, their lag and bound, and ingests waiting on them
    #: (``sstore.execution.backpressure.PressureReport``); None for a bare state file (bounds are
    #: the program's, not the file's)
    backpressure: dict[str, Any] | None = None
    #: each event-time window's watermark and counts (``sstore_sys.event_windows``): name,
    #: source, watermark (the column's unit; for a timestamp also ``watermark_at``, ISO),
    #: rows_in, rows_late
    event_windows: list[dict[str, Any]] = field(default_factory=list)

    def halted(self) -> dict[str, str]:
        """procedure -> why it is halted, for every halted procedure."""
        return {p.name: p.halted for p in self.procedures if p.halted}

    def halt_report(self) -> str:
        """One line for an error message: which procedures halted where, and what to do."""
        detail = "; ".join(f"{name} at {why}" for name, why in sorted(self.halted().items()))
        names = " ".join(sorted(self.halted()))
        where = self.path or "STATE"
        return (f"{detail} (halted until resumed: fix the cause, then "
                f"`sstore resume {where} {names}`)")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path, "durability": self.durability, "engine_id": self.engine_id,
            "procedures": [vars(p) for p in self.procedures],
            "streams": [vars(s) for s in self.streams],
            "consumers": [vars(c) for c in self.consumers], "errors": self.errors}
        if self.backpressure is not None:
            out["backpressure"] = self.backpressure
        if self.event_windows:
            out["event_windows"] = self.event_windows
        if self.live is not None:
            out["live"] = self.live
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineStatus:
        """The inverse of ``to_dict`` (a status read from a serving engine's ``/status``;
        keys this version does not know, from a newer server, are left out)."""
        return cls(data["path"], data["durability"],
                   [_known(ProcedureStatus, p) for p in data.get("procedures", [])],
                   [_known(StreamStatus, s) for s in data.get("streams", [])],
                   list(data.get("errors", [])), data.get("engine_id"),
                   [_known(ConsumerStatus, c) for c in data.get("consumers", [])],
                   data.get("live"), data.get("backpressure"),
                   list(data.get("event_windows", [])))


def _known(kind: type[Any], values: Mapping[str, Any]) -> Any:
    names = {f.name for f in fields(kind)}
    return kind(**{k: v for k, v in values.items() if k in names})


def procedure_order(procedures: Sequence[tuple[str, Sequence[str], Sequence[str]]],
                    window_source: Mapping[str, str]) -> list[str]:
    """Names of ``(name, inputs, outputs)`` in topological order: each procedure after every
    procedure whose output it reads (directly or through a window); ties keep the given order.
    A cycle cannot be declared (``Graph.validate``); should a file hold one, its procedures
    follow the others in the given order rather than vanish."""
    producer = {out: name for name, _, outputs in procedures for out in outputs}
    needs = {name: {producer[window_source.get(i, i)] for i in inputs
                    if window_source.get(i, i) in producer} - {name}
             for name, inputs, _ in procedures}
    order: list[str] = []
    while len(order) < len(procedures):
        ready = [n for n, _, _ in procedures if n not in order and needs[n] <= set(order)]
        if not ready:
            return order + [n for n, _, _ in procedures if n not in order]
        order.append(ready[0])
    return order


def dataflow_nodes(status: EngineStatus) -> list[tuple[str, str]]:
    """(kind, name) of every procedure and stream in dataflow order: procedures as ``status``
    lists them (topological), each preceded by the inputs not listed yet (a window by its
    source) and followed by its outputs; streams that no procedure touches come last."""
    kinds = {s.name: s.kind for s in status.streams}
    window_source = {s.name: s.source for s in status.streams if s.source is not None}
    out: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(stream: str) -> None:
        if stream in seen:
            return
        if stream in window_source:
            add(window_source[stream])
        seen.add(stream)
        out.append((kinds.get(stream, "derived"), stream))

    for p in status.procedures:
        for name in p.inputs:
            add(name)
        out.append(("procedure", p.name))
        for name in p.outputs:
            add(name)
    for s in status.streams:
        add(s.name)
    return out


def read_status(con: duckdb.DuckDBPyConnection, *, halted: dict[str, str] | None = None,
                durability: str = "full", path: str = "") -> EngineStatus:
    """Everything from the system tables, so a state file alone is enough.

    ``halted`` (procedure -> why) adds what a running engine knows beyond the halts the state
    file keeps (``sstore_sys.halts``, which win: they are what a restart will see).

    A derived stream is complete through its producer's last batch and a window through its
    source's (their own commit records are garbage-collected once read); pending work of a
    procedure is the retained input batches above its last one. ``last_commit_at`` is when
    that last batch committed (``sstore_sys.commits.committed_at``; None in a file made
    before commits had times).
    """
    status = EngineStatus(path, durability)
    # the running engine's view, then what the state file keeps; passwords masked (a file
    # written before sstore masked them may hold one)
    halted = {name: mask_secrets(text) for name, text in {
        **(halted or {}), **{name: halt_text(b, e) for name, (b, e) in load_halts(con).items()}
    }.items()}
    # aggregates in SQL, never the records themselves: a border stream keeps one record per
    # batch until GC compacts collected ones into runs (sstore_sys.ingested_runs), so a state
    # file can hold millions of them (1.1 million took 1.5 s to list here, under the engine's
    # lock, for every /status)
    when = "epoch(committed_at)" if systables.has_commit_times(con) else "NULL"
    latest = con.execute(f"SELECT node, max(batch_id), arg_max({when}, batch_id) "
                         f"FROM sstore_sys.commits GROUP BY node").fetchall()
    last = {str(node): int(batch) for node, batch, _ in latest}
    at: dict[str, float | None] = {str(node): epoch for node, _, epoch in latest}
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                        "WHERE table_schema = 'main'").fetchall()}
    graph = load_graph(con)
    producer = {out: name for name, kind, spec in graph if kind == "procedure"
                for out in spec["outputs"]}
    source = {name: spec["source"] for name, kind, spec in graph if kind == "window"}
    for _, kind, spec in graph:  # an event window's two streams commit with its source
        if kind == "event_window":
            source[spec["name"]] = source[spec["name"] + "__late"] = spec["source"]

    def completed_by(node: str) -> str:
        """The node whose commit records say how far ``node`` is complete."""
        stream = source.get(node, node)
        return str(producer.get(stream, stream))

    procedures: dict[str, ProcedureStatus] = {}
    for name, kind, spec in graph:
        if kind == "procedure":
            done = last.get(name, 0)
            waiting = con.execute("SELECT count(DISTINCT batch_id) FROM sstore_sys.commits "
                                  "WHERE list_contains(?, node) AND batch_id > ?",
                                  [spec["inputs"], done]).fetchall()[0][0]
            procedures[name] = ProcedureStatus(
                name, spec["inputs"], spec["outputs"], done, int(waiting),
                halted.get(name), spec["on_error"], _iso(at.get(name)))
        elif kind in ("stream", "window"):
            table = name if kind == "stream" else name + "__rows"
            rows = None
            if table in tables:
                rows = con.execute(f"SELECT count(*) FROM {ident(table)}").fetchall()[0][0]
            sub = kind if kind == "window" else ("border" if spec.get("border") else "derived")
            status.streams.append(StreamStatus(
                name, sub, last.get(completed_by(name), 0), rows,
                _iso(at.get(completed_by(name))), source.get(name)))
    order = procedure_order([(p.name, p.inputs, p.outputs) for p in procedures.values()],
                            source)
    status.procedures = [procedures[name] for name in order]
    position = {name: i for i, (_, name) in enumerate(dataflow_nodes(status))}
    status.streams.sort(key=lambda s: position[s.name])
    for switch in upgrades.load(con):
        if switch["procedure"] in procedures:
            procedures[switch["procedure"]].versions.append(
                {k: v for k, v in switch.items() if k != "procedure"})
    for found in evolution.load(con):
        for stream in status.streams:
            if stream.name == found["stream"]:
                stream.versions.append({k: v for k, v in found.items() if k != "stream"})
    _consumers(con, status, last)
    status.event_windows = _event_windows(con)
    errors = con.execute("SELECT logged_at::VARCHAR, procedure, batch_id, action, error "
                         "FROM sstore_sys.errors ORDER BY logged_at DESC LIMIT 20").fetchall()
    status.errors = [{"at": a, "procedure": p, "batch_id": b, "action": act,
                      "error": mask_secrets(e) if e else e} for a, p, b, act, e in errors]
    return status


def _event_windows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Watermark and counts of each event-time window (none in a file made before them)."""
    present = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema "
                          "= 'sstore_sys' AND table_name = 'event_windows'").fetchall()[0][0]
    if not present:
        return []
    out = []
    for name, spec, watermark, rows_in, rows_late in con.execute(
            "SELECT name, spec, watermark, rows_in, rows_late FROM sstore_sys.event_windows "
            "ORDER BY name").fetchall():
        decl = json.loads(spec)
        row: dict[str, Any] = {"name": name, "source": decl.get("source"),
                               "watermark": watermark, "rows_in": rows_in,
                               "rows_late": rows_late}
        if watermark is not None and str(decl.get("time_type", "")).startswith("TIMESTAMP"):
            row["watermark_at"] = _iso(watermark / 1e6)  # the window keeps epoch microseconds
        out.append(row)
    return out


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat()


def _consumers(con: duckdb.DuckDBPyConnection, status: EngineStatus,
               last: dict[str, int]) -> None:
    """Identity and consumer holds, from the tables (a state file made by an older sstore may
    lack some of them: it is read as it is, never changed here)."""
    present = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                         "WHERE table_schema = 'sstore_sys'").fetchall()}
    if "identity" in present:
        status.engine_id = systables.engine_id(con)
    holders: dict[str, set[str]] = {}
    for stream, consumer in systables.load_holders(con):
        holders.setdefault(stream, set()).add(consumer)
    gaps = systables.load_gaps(con) if "gaps" in present else []

    def batch_ids(stream: str) -> list[int]:
        """The stream's batch-ids above what its slowest holder acknowledged (all ``describe``
        looks at)."""
        floor = min((last.get(c, 0) for c in holders.get(stream, ())), default=0)
        return [int(b) for (b,) in con.execute(
            "SELECT batch_id FROM sstore_sys.commits WHERE node = ? AND batch_id > ? "
            "ORDER BY batch_id", [stream, floor]).fetchall()]

    status.consumers = describe(holders, lambda c: last.get(c, 0), batch_ids, gaps,
                                load_halts(con))


def status_of_file(path: str) -> EngineStatus:
    """Status of a state file that no engine has open (read-only)."""
    con = connect(path, read_only=True)
    try:
        return read_status(con, path=path)
    finally:
        con.close()
