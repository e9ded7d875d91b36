"""What an engine is doing, read from its system tables (so it works on a bare state file too)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import duckdb


@dataclass
class ProcedureStatus:
    name: str
    inputs: list[str]
    outputs: list[str]
    last_batch: int
    pending: int | None
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

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "durability": self.durability,
                "procedures": [vars(p) for p in self.procedures],
                "streams": [vars(s) for s in self.streams], "errors": self.errors}


def read_status(con: duckdb.DuckDBPyConnection, *, halted: dict[str, str] | None = None,
                pending: dict[str, int] | None = None, durability: str = "full",
                path: str = "") -> EngineStatus:
    status = EngineStatus(path, durability)
    last = dict(con.execute("SELECT node, max(batch_id) FROM sstore_sys.commits GROUP BY node"
                            ).fetchall())
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                        "WHERE table_schema = 'main'").fetchall()}
    graph = con.execute("SELECT name, kind, spec FROM sstore_sys.graph ORDER BY kind, name"
                        ).fetchall()
    for name, kind, spec_text in graph:
        spec = json.loads(spec_text)
        if kind == "procedure":
            status.procedures.append(ProcedureStatus(
                name, spec["inputs"], spec["outputs"], int(last.get(name) or 0),
                (pending or {}).get(name), (halted or {}).get(name), spec["on_error"]))
        elif kind in ("stream", "window"):
            table = name if kind == "stream" else name + "__rows"
            rows = None
            if table in tables:
                rows = con.execute(f'SELECT count(*) FROM "{table.replace(chr(34), chr(34) * 2)}"'
                                   ).fetchall()[0][0]
            sub = kind if kind == "window" else ("border" if spec.get("border") else "derived")
            status.streams.append(StreamStatus(name, sub, int(last.get(name) or 0), rows))
    errors = con.execute("SELECT logged_at::VARCHAR, procedure, batch_id, action, error FROM sstore_sys.errors "
                         "ORDER BY logged_at DESC LIMIT 20").fetchall()
    status.errors = [{"at": str(a), "procedure": p, "batch_id": b, "action": act, "error": e}
                     for a, p, b, act, e in errors]
    return status


def status_of_file(path: str) -> EngineStatus:
    """Status of a state file that no engine has open (read-only)."""
    con = duckdb.connect(path, read_only=True)
    try:
        return read_status(con, path=path)
    finally:
        con.close()
