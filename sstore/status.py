"""What an engine is doing, read from its system tables (so it works on a bare state file too)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from sstore import systables
from sstore.consumers import ConsumerStatus, describe
from sstore.duck import connect
from sstore.sql import ident
from sstore.systables import halt_text, load_graph, load_halts


@dataclass
class ProcedureStatus:
    name: str
    inputs: list[str]
    outputs: list[str]
    last_batch: int
    pending: int
    halted: str | None
    on_error: str


@dataclass
class StreamStatus:
    name: str
    kind: str  # "border", "derived", "window"
    last_batch: int
    retained_rows: int | None


@dataclass
class EngineStatus:
    path: str
    durability: str
    procedures: list[ProcedureStatus] = field(default_factory=list)
    streams: list[StreamStatus] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    engine_id: str | None = None
    consumers: list[ConsumerStatus] = field(default_factory=list)

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
        return {"path": self.path, "durability": self.durability, "engine_id": self.engine_id,
                "procedures": [vars(p) for p in self.procedures],
                "streams": [vars(s) for s in self.streams],
                "consumers": [vars(c) for c in self.consumers], "errors": self.errors}


def read_status(con: duckdb.DuckDBPyConnection, *, halted: dict[str, str] | None = None,
                durability: str = "full", path: str = "") -> EngineStatus:
    """Everything from the system tables, so a state file alone is enough.

    ``halted`` (procedure -> why) adds what a running engine knows beyond the halts the state
    file keeps (``sstore_sys.halts``, which win: they are what a restart will see).

    A derived stream is complete through its producer's last batch and a window through its
    source's (their own commit records are garbage-collected once read); pending work of a
    procedure is the retained input batches above its last one.
    """
    status = EngineStatus(path, durability)
    halted = {**(halted or {}),  # the running engine's view, then what the state file keeps
              **{name: halt_text(b, e) for name, (b, e) in load_halts(con).items()}}
    commits: dict[str, list[int]] = {}
    for node, batch_id in con.execute("SELECT node, batch_id FROM sstore_sys.commits "
                                      "ORDER BY batch_id").fetchall():
        commits.setdefault(node, []).append(int(batch_id))
    last = {node: ids[-1] for node, ids in commits.items()}
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                        "WHERE table_schema = 'main'").fetchall()}
    graph = load_graph(con)
    producer = {out: name for name, kind, spec in graph if kind == "procedure"
                for out in spec["outputs"]}
    source = {name: spec["source"] for name, kind, spec in graph if kind == "window"}

    def complete_through(node: str) -> int:
        stream = source.get(node, node)
        return last.get(producer[stream], 0) if stream in producer else last.get(stream, 0)

    for name, kind, spec in graph:
        if kind == "procedure":
            done = last.get(name, 0)
            waiting = {b for node in spec["inputs"] for b in commits.get(node, ()) if b > done}
            status.procedures.append(ProcedureStatus(
                name, spec["inputs"], spec["outputs"], done, len(waiting),
                halted.get(name), spec["on_error"]))
        elif kind in ("stream", "window"):
            table = name if kind == "stream" else name + "__rows"
            rows = None
            if table in tables:
                rows = con.execute(f"SELECT count(*) FROM {ident(table)}").fetchall()[0][0]
            sub = kind if kind == "window" else ("border" if spec.get("border") else "derived")
            status.streams.append(StreamStatus(name, sub, complete_through(name), rows))
    _consumers(con, status, commits, last)
    errors = con.execute("SELECT logged_at::VARCHAR, procedure, batch_id, action, error "
                         "FROM sstore_sys.errors ORDER BY logged_at DESC LIMIT 20").fetchall()
    status.errors = [{"at": a, "procedure": p, "batch_id": b, "action": act, "error": e}
                     for a, p, b, act, e in errors]
    return status


def _consumers(con: duckdb.DuckDBPyConnection, status: EngineStatus,
               commits: dict[str, list[int]], last: dict[str, int]) -> None:
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
    status.consumers = describe(holders, lambda c: last.get(c, 0),
                                lambda s: commits.get(s, []), gaps, load_halts(con))


def status_of_file(path: str) -> EngineStatus:
    """Status of a state file that no engine has open (read-only)."""
    con = connect(path, read_only=True)
    try:
        return read_status(con, path=path)
    finally:
        con.close()
