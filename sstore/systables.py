"""The engine's own tables, in schema ``sstore_sys`` of the state database.

- ``commits(node, batch_id, n_rows)``: one row per committed batch of a stream or window and per
  transaction execution of a procedure (and per acknowledgement of an external consumer such as
  a migrator). Written in the same transaction as the data; the source of truth for recovery.
- ``windows(name, next_seq, promoted, size)``: where each window stands.
- ``errors(logged_at, procedure, batch_id, action, error)``: every failed transaction execution.
- ``graph(name, kind, spec)``: the declarations of the last start, so that ``sstore status``
  can show the graph of a state file without the program that declared it.
- ``meta(key, value)``: counters (the weak-mode log position of a snapshot).
- ``holders(stream, consumer)``: external consumers (migrators) that a stream's batches wait for
  before garbage collection; kept so that a holder declared once keeps holding across restarts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import duckdb

from sstore.graph import Graph

DDL = """
CREATE SCHEMA IF NOT EXISTS sstore_sys;
CREATE TABLE IF NOT EXISTS sstore_sys.commits (
    node VARCHAR NOT NULL, batch_id BIGINT NOT NULL, n_rows BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS sstore_sys.windows (
    name VARCHAR PRIMARY KEY, next_seq BIGINT NOT NULL, promoted BIGINT NOT NULL,
    size BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS sstore_sys.errors (
    logged_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp, procedure VARCHAR NOT NULL,
    batch_id BIGINT NOT NULL, action VARCHAR NOT NULL, error VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS sstore_sys.graph (
    name VARCHAR PRIMARY KEY, kind VARCHAR NOT NULL, spec VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS sstore_sys.meta (key VARCHAR PRIMARY KEY, value BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS sstore_sys.holders (
    stream VARCHAR NOT NULL, consumer VARCHAR NOT NULL, PRIMARY KEY (stream, consumer));
"""


def create(con: duckdb.DuckDBPyConnection) -> None:
    for statement in DDL.split(";"):
        if statement.strip():
            con.execute(statement)


def load_commits(con: duckdb.DuckDBPyConnection) -> list[tuple[str, int, int]]:
    return con.execute("SELECT node, batch_id, n_rows FROM sstore_sys.commits").fetchall()


def insert_commits(con: duckdb.DuckDBPyConnection, records: Iterable[tuple[str, int, int]]) -> None:
    """One statement for all of a transaction's commit records."""
    rows = list(records)
    if not rows:
        return
    placeholders = ", ".join(["(?, ?, ?)"] * len(rows))
    con.execute(f"INSERT INTO sstore_sys.commits VALUES {placeholders}",
                [value for row in rows for value in row])


def record_error(con: duckdb.DuckDBPyConnection, procedure: str, batch_id: int, action: str,
                 error: str) -> None:
    con.execute("INSERT INTO sstore_sys.errors (procedure, batch_id, action, error) "
                "VALUES (?, ?, ?, ?)", [procedure, batch_id, action, error])


def save_graph(con: duckdb.DuckDBPyConnection, graph: Graph) -> None:
    rows: list[tuple[str, str, str]] = []
    for s in graph.streams.values():
        rows.append((s.name, "stream", json.dumps({"columns": s.columns,
                                                    "border": graph.is_border(s.name)})))
    for w in graph.windows.values():
        rows.append((w.name, "window", json.dumps({"source": w.source, "size": w.size,
                                                    "slide": w.slide, "unit": w.unit})))
    for p in graph.procedures.values():
        rows.append((p.name, "procedure", json.dumps({
            "inputs": list(p.inputs), "outputs": list(p.outputs), "on_error": p.on_error.value,
            "retries": p.retries, "doc": p.doc})))
    for i, t in enumerate(graph.triggers):
        rows.append((f"trigger:{t.target}:{i}", "trigger", json.dumps({"target": t.target,
                                                                        "sql": t.sql})))
    con.execute("DELETE FROM sstore_sys.graph")
    if rows:
        con.executemany("INSERT INTO sstore_sys.graph VALUES (?, ?, ?)", rows)


def load_holders(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    return con.execute("SELECT stream, consumer FROM sstore_sys.holders").fetchall()


def add_holder(con: duckdb.DuckDBPyConnection, stream: str, consumer: str) -> None:
    con.execute("INSERT INTO sstore_sys.holders VALUES (?, ?) ON CONFLICT DO NOTHING",
                [stream, consumer])


def remove_holder(con: duckdb.DuckDBPyConnection, stream: str, consumer: str) -> None:
    con.execute("DELETE FROM sstore_sys.holders WHERE stream = ? AND consumer = ?",
                [stream, consumer])


def load_graph(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, dict[str, Any]]]:
    """The declarations saved by the last start: (name, kind, spec)."""
    return [(name, kind, json.loads(spec)) for name, kind, spec in con.execute(
        "SELECT name, kind, spec FROM sstore_sys.graph ORDER BY kind, name").fetchall()]


def get_meta(con: duckdb.DuckDBPyConnection, key: str, default: int = 0) -> int:
    rows = con.execute("SELECT value FROM sstore_sys.meta WHERE key = ?", [key]).fetchall()
    return default if not rows else int(rows[0][0])


def set_meta(con: duckdb.DuckDBPyConnection, key: str, value: int) -> None:
    con.execute("INSERT INTO sstore_sys.meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                "SET value = excluded.value", [key, value])
