"""Upgrading a procedure at a batch boundary: batches before it stay as the old version made
them, batches from it on run the new one.

Two ways to say it, both checked at start against ``sstore_sys.procedure_versions``
(procedure, version, from_batch, change, code, recorded_at):

- **a new version in the declaration**: ``@engine.procedure(..., version=2)`` (or
  ``sql_procedure(..., version=2)``). The procedure's last recorded version is older: version 2
  is recorded from the batch after the last one the procedure committed, and runs every batch
  from there. A program declaring an older version than the file recorded is refused (its
  code is older than what ran).
- **an explicit switch**: ``Engine.upgrade(name, new_fn, from_batch=B)`` with the procedure
  declared as before (its version's code). Pending batches below ``B`` still run the old code,
  batches from ``B`` on run ``new_fn`` (one comparison per execution, in Python: no SQL on
  the hot path). ``B`` must come after every batch the procedure committed; without it, the
  next batch. The program may keep the call: once recorded it is a no-op (the same boundary),
  and a later start still runs each batch with the version that owns it.

``Engine.retire`` is the special case "no successor": a retired procedure that has progress
gets a version record ``retired`` from the batch after its last (a procedure declared again
later carries on its progress: that record is deleted).

All the records of one start are written in ONE DuckDB transaction, the start's own
(``versioned.start_transaction``; crash point ``upgrade.before_commit`` after them), before any
transaction execution runs, so every batch is run by exactly one version: a crash or a failed
start before the commit leaves the old version for every batch, after it the boundary is
fixed. Version 1 (from batch 1) is recorded with the first switch; a
procedure that never changed has no rows here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import duckdb

from sstore.base.errors import DeclarationError
from sstore.dataflow.graph import Graph, ProcedureDecl
from sstore.storage import systables, versioned

VERSIONS = "sstore_sys.procedure_versions"
VERSIONS_DDL = f"""
CREATE TABLE IF NOT EXISTS {VERSIONS} (
    procedure VARCHAR NOT NULL, version INTEGER NOT NULL, from_batch BIGINT NOT NULL,
    change VARCHAR NOT NULL, code VARCHAR,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp,
    PRIMARY KEY (procedure, version))
"""


@dataclass(frozen=True)
class Upgrade:
    """``Engine.upgrade``'s request: ``fn`` runs batches from ``from_batch`` (None: next)."""

    fn: Callable[..., Any]
    from_batch: int | None = None


def load(con: duckdb.DuckDBPyConnection, procedure: str | None = None) -> list[dict[str, Any]]:
    """The recorded versions (of ``procedure``, or all), oldest first; none in a file where no
    procedure ever changed (the table is made on first use)."""
    if not versioned.has_table(con, "procedure_versions"):
        return []
    rows = con.execute(f"SELECT procedure, version, from_batch, change, code, "
                       f"recorded_at::VARCHAR FROM {VERSIONS} WHERE ? IS NULL OR procedure = ? "
                       f"ORDER BY procedure, version", [procedure, procedure]).fetchall()
    return [{"procedure": p, "version": int(v), "from_batch": int(b), "change": ch,
             "code": code, "recorded_at": at} for p, v, b, ch, code, at in rows]


@dataclass
class Switches:
    """A start's version records, checked and not yet written (``record``)."""

    rows: list[tuple[str, int, int, str, str | None]]
    revived: list[tuple[str, int]]

    def record(self, con: duckdb.DuckDBPyConnection,
               blocked: Callable[[], str | None] | None = None) -> list[str]:
        """Write them in the start's transaction (module docstring); the procedures
        switched."""
        rows, revived = self.rows, self.revived
        if not rows and not revived:
            return []
        what = (f"procedure {rows[-1][0]!r} cannot switch to version {rows[-1][1]}" if rows
                else f"procedure {revived[0][0]!r} cannot be declared again")
        with versioned.one_change(con, VERSIONS_DDL, what, blocked, "upgrade.before_commit"):
            for name, version in revived:  # a retire at version 2 leaves "created": drop it
                con.execute(f"DELETE FROM {VERSIONS} WHERE procedure = ? AND "
                            f"(version = ? OR ? = 2)", [name, version, version])
            if rows:
                con.executemany(f"INSERT INTO {VERSIONS} (procedure, version, from_batch, "
                                f"change, code) VALUES (?, ?, ?, ?, ?)", rows)
        return sorted({r[0] for r in rows} | {n for n, _v in revived})


def check(con: duckdb.DuckDBPyConnection, graph: Graph, versions: Mapping[str, int],
          upgrades: Mapping[str, Upgrade], retired: Collection[str]) -> Switches:
    """Check this start's versions (module docstring) and make each upgraded procedure run
    the version that owns each batch; what to record is returned, written by the caller
    once the rest of the start was checked too (``Switches.record``)."""
    recorded: dict[str, list[dict[str, Any]]] = {}
    for row in load(con):
        recorded.setdefault(row["procedure"], []).append(row)
    if not (recorded or upgrades or retired or any(v != 1 for v in versions.values())):
        return Switches([], [])  # the common start: nothing changed, nothing to read
    progress = {str(n): int(b) for n, b in con.execute(
        "SELECT node, max(batch_id) FROM sstore_sys.commits GROUP BY node").fetchall()}
    collected = systables.load_collected(con)
    for name, decl in graph.procedures.items():  # one that never ran starts after what was
        if not progress.get(name):  # collected of its inputs (``Ledger.start_after_collected``)
            progress[name] = max((collected.get(i, 0) for i in decl.inputs), default=0)
    rows: list[tuple[str, int, int, str, str | None]] = []
    revived: list[tuple[str, int]] = []
    for name, decl in graph.procedures.items():
        past = recorded.get(name, [])
        if past and past[-1]["change"] == "retired":  # declared again: the retire is undone
            revived.append((name, past[-1]["version"]))
            past = past[:-1] if len(past) > 2 else []  # [created, retired]: as never changed
        rows += _switch(name, decl, versions.get(name, 1), upgrades.get(name), past,
                        progress.get(name, 0))
    for name in retired:
        past = recorded.get(name, [])
        if progress.get(name) and not (past and past[-1]["change"] == "retired"):
            latest = past[-1]["version"] if past else 1
            rows += _first(name, past) + [(name, latest + 1, progress[name] + 1, "retired",
                                           None)]
    return Switches(rows, revived)


def _switch(name: str, decl: ProcedureDecl, version: int, upgrade: Upgrade | None,
            past: list[dict[str, Any]], done: int) -> list[tuple[str, int, int, str, str | None]]:
    """The records procedure ``name`` needs now; ``decl`` made to run the right version."""
    latest = past[-1]["version"] if past else 1
    if (version + 1 if upgrade is not None else version) < latest:
        raise DeclarationError(
            f"procedure {name!r} runs version {latest} since batch {past[-1]['from_batch']} "
            f"in this state file; this program declares version {version}"
            f"{' with an upgrade to ' + str(version + 1) if upgrade else ''}: its code is older "
            f"than what ran. Declare the version the file has (version={latest})")
    if upgrade is None:
        if version == latest:
            return []
        return _first(name, past) + [(name, version, done + 1, f"version={version} declared",
                                      _code(decl.fn, decl.sql))]
    new = version + 1
    known = next((p for p in past if p["version"] == new), None)
    boundary = known["from_batch"] if known else (upgrade.from_batch or done + 1)
    if upgrade.from_batch is not None and upgrade.from_batch != boundary:
        raise DeclarationError(
            f"Engine.upgrade({name!r}, from_batch={upgrade.from_batch}): version {new} is "
            f"recorded from batch {boundary} in this state file; the boundary cannot move")
    if known is None and boundary <= done:
        raise DeclarationError(
            f"Engine.upgrade({name!r}, from_batch={boundary}): procedure {name!r} has "
            f"committed batches through {done} with version {version}; they stay as it made "
            f"them. Give a boundary after {done} (or none: the next batch)")
    old, fn = decl.fn, upgrade.fn

    def run(tx: Any, batch: Any) -> Any:
        return (fn if tx.batch_id >= boundary else old)(tx, batch)

    decl.fn = run if boundary > done + 1 else fn
    decl.sql = None  # the new code is a function: never chained (``sstore.dataflow.fusion``)
    if known is not None:
        return []
    return _first(name, past) + [(name, new, boundary, f"Engine.upgrade from batch {boundary}",
                                  _code(upgrade.fn, None))]


def _first(name: str, past: list[dict[str, Any]]) -> list[tuple[str, int, int, str, None]]:
    """Version 1's record, written with the first switch."""
    return [] if past else [(name, 1, 1, "created", None)]


def _code(fn: Callable[..., Any], sql: str | None) -> str:
    """What a version runs, for status: its SQL, or its function's qualified name."""
    if sql is not None:
        return sql
    module = inspect.getmodule(fn)
    return f"{module.__name__ if module else '?'}.{getattr(fn, '__qualname__', repr(fn))}"
