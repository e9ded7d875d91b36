"""The engine's own tables, in schema ``sstore_sys`` of the state database.

- ``commits(node, batch_id, n_rows, committed_at, fingerprint)``: one row per committed batch of a
  stream or window and per transaction execution of a procedure (and per acknowledgement of an
  external consumer such as a migrator). Written in the same transaction as the data; the
  source of truth for recovery. ``committed_at`` is DuckDB's ``current_timestamp`` of that
  transaction (its start, milliseconds before its COMMIT), filled by the column's default so
  the insert stays one statement; rows written before the column existed have NULL (unknown).
  ``fingerprint``: for a border batch, the fingerprint of its rows (``sstore.base.fingerprint``),
  written in the same statement, so that a re-send of its batch-id with other rows is refused
  instead of taken for a no-op (``ingested_record``); NULL for every other record and for
  border batches ingested before the column existed (their re-sends are checked by row count
  only).
- ``windows(name, next_seq, promoted, size)``: where each window stands.
- ``errors(logged_at, procedure, batch_id, action, error)``: every failed transaction execution.
- ``graph(name, kind, spec)``: the declarations of the last start, so that ``sstore status``
  can show the graph of a state file without the program that declared it.
- ``meta(key, value)``: counters (the weak-mode log position of a snapshot).
- ``holders(stream, consumer)``: external consumers (migrators) that a stream's batches wait for
  before garbage collection; kept so that a holder declared once keeps holding across restarts.
- ``halts(procedure, batch_id, error, halted_at)``: procedures halted by their error policy
  (see "Halts" below).

Consumers and identity (see ``sstore.storage.consumers``):

- ``identity(engine_id, created_at)``: one row, a UUID made when the state is first created.
  Sinks key their watermarks by it, so a rebuilt or second state file is never taken for this
  one.
- ``collected(stream, through)``: the highest batch-id of each stream that garbage collection
  has removed, written in the GC transaction. A consumer that would need a batch at or below it
  would start after a gap: that is refused unless the gap is accepted.
- ``gaps(consumer, stream, first_batch, last_batch, accepted_at)``: gaps a consumer accepted on
  purpose, kept so that ``status`` can show them for good.
- ``replays(stream, batch_id, from_batch, procedure, replayed_at)``: border batches that a
  dead-letter replay ingested (``sstore.dead_letters``), written in the replay's transaction:
  a client sending a batch of its own under such an id is refused, not taken for a re-send.

Border batch-ids (``sstore.storage.ingested``): a border stream's commit records are what makes a
re-sent batch-id a no-op, so they are never simply deleted. Garbage collection compacts the
ones of collected batches (``compact_statements``) into
``ingested_runs(stream, first_batch, last_batch)``, one row per run of consecutive batch-ids,
in its transaction: a batch-id is ingested iff a commit record or a run holds it. The newest
record of each stream always stays (its last batch-id and commit time, for ``status``). What a
re-send of a compacted id is checked against moves, in the same statements, to
``ingested_prints(stream, batch_id, n_rows, fingerprint)``: without it such a re-send with
other rows would be an unchecked no-op, its rows lost without a word. Four narrow columns that
DuckDB compresses (the stream a dictionary, the ids a delta): about 10 bytes per border batch
for good (``tests/seams/test_resend_seams.py`` measures it).
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Mapping, Sequence
from typing import Any

import duckdb

from sstore.base.duck import execute
from sstore.dataflow.graph import Graph

DDL = """
CREATE SCHEMA IF NOT EXISTS sstore_sys;
CREATE TABLE IF NOT EXISTS sstore_sys.commits (
    node VARCHAR NOT NULL, batch_id BIGINT NOT NULL, n_rows BIGINT NOT NULL,
    committed_at TIMESTAMPTZ DEFAULT current_timestamp, fingerprint BIGINT);
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
CREATE TABLE IF NOT EXISTS sstore_sys.identity (
    engine_id VARCHAR NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS sstore_sys.collected (
    stream VARCHAR PRIMARY KEY, through BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS sstore_sys.ingested_runs (
    stream VARCHAR NOT NULL, first_batch BIGINT NOT NULL, last_batch BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS sstore_sys.ingested_prints (
    stream VARCHAR NOT NULL, batch_id BIGINT NOT NULL, n_rows BIGINT NOT NULL,
    fingerprint BIGINT);
CREATE TABLE IF NOT EXISTS sstore_sys.replays (
    stream VARCHAR NOT NULL, batch_id BIGINT NOT NULL, from_batch BIGINT NOT NULL,
    procedure VARCHAR NOT NULL,
    replayed_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS sstore_sys.gaps (
    consumer VARCHAR NOT NULL, stream VARCHAR NOT NULL, first_batch BIGINT NOT NULL,
    last_batch BIGINT NOT NULL, accepted_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp);
"""


def create(con: duckdb.DuckDBPyConnection) -> None:
    for statement in DDL.split(";"):
        if statement.strip():
            con.execute(statement)
    _add_commit_times(con)
    _add_digests(con)


def _add_commit_times(con: duckdb.DuckDBPyConnection) -> None:
    """A state file made before commits had times gets the column: NULL for its old rows
    (when they committed is unknown; a default would stamp them all with today), the default
    for new ones. Checked first, so an up-to-date file is not altered at every open."""
    if has_commit_times(con):
        return
    con.execute("ALTER TABLE sstore_sys.commits ADD COLUMN IF NOT EXISTS "
                "committed_at TIMESTAMPTZ")
    con.execute("ALTER TABLE sstore_sys.commits ALTER COLUMN committed_at "
                "SET DEFAULT current_timestamp")


def _add_digests(con: duckdb.DuckDBPyConnection) -> None:
    """A state file (or weak-mode snapshot) made before border batches had fingerprints gets
    the column, NULL for its old rows (unknown: their re-sends are checked by row count).
    Checked first, so an up-to-date file is not altered at every open."""
    if not _has_column(con, "commits", "fingerprint"):
        con.execute("ALTER TABLE sstore_sys.commits ADD COLUMN IF NOT EXISTS fingerprint BIGINT")


def _has_column(con: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    return bool(con.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() "
        "AND schema_name = 'sstore_sys' AND table_name = ? AND column_name = ?",
        [table, column]).fetchall()[0][0])


def has_commit_times(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``sstore_sys.commits`` has its ``committed_at`` column (a state file made by
    an older sstore and only read since has not)."""
    return _has_column(con, "commits", "committed_at")


def load_commits(con: duckdb.DuckDBPyConnection,
                 collected: dict[str, int] | None = None) -> list[tuple[str, int, int]]:
    """The commit records, but none of a stream at or below its ``collected`` batch-id: those
    batches are gone (a border stream keeps their records for good, ``load_ingested`` reads
    them as ranges), and listing millions of them at every start costs seconds and memory."""
    collected = collected or {}
    if not collected:
        return con.execute("SELECT node, batch_id, n_rows FROM sstore_sys.commits").fetchall()
    return con.execute(
        "SELECT node, batch_id, n_rows FROM sstore_sys.commits "
        "WHERE batch_id > coalesce(map_extract_value(?::MAP(VARCHAR, BIGINT), node), 0)",
        [collected]).fetchall()


_RUNS_OF_RECORDS = ("SELECT node AS stream, min(batch_id) AS first_batch, "
                    "max(batch_id) AS last_batch FROM (SELECT node, batch_id, batch_id - "
                    "row_number() OVER (PARTITION BY node ORDER BY batch_id) AS run "
                    "FROM sstore_sys.commits WHERE {where}) GROUP BY node, run")


def load_ingested(con: duckdb.DuckDBPyConnection, streams: list[str],
                  most: int) -> dict[str, list[tuple[int, int]]]:
    """Per border stream, the newest ``most`` runs of consecutive batch-ids that it took,
    ascending (first, last), from its commit records and its compacted runs (adjacent ones
    joined): computed in SQL, so a start never lists every record."""
    if not streams:
        return {}
    records = _RUNS_OF_RECORDS.format(where="list_contains(?, node)")
    rows = con.execute(
        f"WITH runs AS (SELECT stream, first_batch, last_batch FROM sstore_sys.ingested_runs "
        f"  WHERE list_contains(?, stream) UNION ALL {records}), "
        f"starts AS (SELECT *, coalesce(lag(last_batch) OVER (PARTITION BY stream "
        f"  ORDER BY first_batch) + 1 <> first_batch, true) AS fresh FROM runs), "
        f"joined AS (SELECT *, sum(fresh::INTEGER) OVER (PARTITION BY stream "
        f"  ORDER BY first_batch) AS k FROM starts) "
        f"SELECT stream, min(first_batch) AS first, max(last_batch) AS last FROM joined "
        f"GROUP BY stream, k "
        f"QUALIFY row_number() OVER (PARTITION BY stream ORDER BY max(last_batch) DESC) <= ? "
        f"ORDER BY stream, first", [streams, streams, most]).fetchall()
    out: dict[str, list[tuple[int, int]]] = {}
    for node, first, last in rows:
        out.setdefault(str(node), []).append((int(first), int(last)))
    return out


def compacted_through(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Per border stream, the highest batch-id whose commit record was compacted into a run."""
    return {str(s): int(t) for s, t in con.execute(
        "SELECT stream, max(last_batch) FROM sstore_sys.ingested_runs GROUP BY stream"
    ).fetchall()}


def compact_statements(stream: str, after: int, through: int) -> list[tuple[str, list[object]]]:
    """The statements (for the GC transaction) that replace the commit records of border
    ``stream`` in (``after``, ``through``] by runs of consecutive batch-ids (``after``: where the
    last compaction ended, the newest run's last batch-id): the new runs; the newest old run
    extended when the first new run continues it (only that pair can touch: runs of one pass
    never touch, and older runs end at or before ``after``), that new run then dropped (the
    old run now spans ``after``); the records deleted. Point statements: the runs table is
    never joined with itself. The records' row counts and fingerprints are kept first
    (``ingested_prints``), so that a re-send of a compacted id is still checked."""
    runs = _RUNS_OF_RECORDS.format(where="node = ? AND batch_id > ? AND batch_id <= ?")
    return [
        (("INSERT INTO sstore_sys.ingested_prints SELECT node, batch_id, n_rows, fingerprint "
          "FROM sstore_sys.commits WHERE node = ? AND batch_id > ? AND batch_id <= ? "
          "ORDER BY batch_id"), [stream, after, through]),
        (f"INSERT INTO sstore_sys.ingested_runs {runs}", [stream, after, through]),
        (("UPDATE sstore_sys.ingested_runs SET last_batch = (SELECT max(last_batch) FROM "
          "sstore_sys.ingested_runs WHERE stream = ? AND first_batch = ?) "
          "WHERE stream = ? AND last_batch = ? AND EXISTS (SELECT 1 FROM "
          "sstore_sys.ingested_runs WHERE stream = ? AND first_batch = ?)"),
         [stream, after + 1, stream, after, stream, after + 1]),
        (("DELETE FROM sstore_sys.ingested_runs WHERE stream = ? AND first_batch = ? AND "
          "EXISTS (SELECT 1 FROM sstore_sys.ingested_runs WHERE stream = ? AND first_batch "
          "<= ? AND last_batch > ?)"), [stream, after + 1, stream, after, after]),
        ("DELETE FROM sstore_sys.commits WHERE node = ? AND batch_id <= ?", [stream, through]),
    ]


def was_ingested(con: duckdb.DuckDBPyConnection, stream: str, batch_id: int) -> bool:
    """Whether the records or the compacted runs hold batch ``batch_id`` of border ``stream``
    (point queries, for ids older than what memory keeps, ``sstore.storage.ingested``)."""
    return bool(con.execute(
        "SELECT EXISTS (SELECT 1 FROM sstore_sys.commits WHERE node = ? AND batch_id = ?) "
        "OR EXISTS (SELECT 1 FROM sstore_sys.ingested_runs WHERE stream = ? AND ? BETWEEN "
        "first_batch AND last_batch)", [stream, batch_id, stream, batch_id]).fetchall()[0][0])


def replayed(con: duckdb.DuckDBPyConnection, stream: str) -> dict[int, int]:
    """The batch-ids of border ``stream`` that dead-letter replays took, each with the
    dead-lettered batch it holds (a row per replay: few; read once, when a re-send of the
    stream first comes, never on the normal path)."""
    return {int(b): int(f) for b, f in con.execute(
        "SELECT batch_id, from_batch FROM sstore_sys.replays WHERE stream = ?",
        [stream]).fetchall()}


def ingested_record(con: duckdb.DuckDBPyConnection, stream: str,
                    batch_id: int) -> tuple[int, int | None] | None:
    """``(n_rows, fingerprint)`` of border batch ``batch_id`` of ``stream``: from its commit
    record, or, once GC compacted that into a run, from what compaction kept of it
    (``ingested_prints``). None only for a record compacted by an sstore older than that table
    (only the id is left). Point queries, run only for a re-sent id, never on the normal path;
    both tables are written in batch-id order, so DuckDB's zone maps skip all but a row group."""
    rows = con.execute(
        "SELECT n_rows, fingerprint FROM sstore_sys.commits WHERE node = ? AND batch_id = ? "
        "UNION ALL SELECT n_rows, fingerprint FROM sstore_sys.ingested_prints "
        "WHERE stream = ? AND batch_id = ? LIMIT 1", [stream, batch_id, stream, batch_id]
    ).fetchall()
    if not rows:
        return None
    n_rows, fingerprint = rows[0]
    return int(n_rows), None if fingerprint is None else int(fingerprint)


def insert_commits(con: duckdb.DuckDBPyConnection, records: Iterable[tuple[str, int, int]],
                   fingerprints: Mapping[tuple[str, int], int] | None = None) -> None:
    """One statement for all of a transaction's commit records; ``fingerprints``: the
    fingerprints of the border batches among them, by (stream, batch-id)."""
    rows = list(records)
    if rows:
        execute(con, *insert_commits_statement(rows, fingerprints))


def insert_commits_statement(rows: Sequence[tuple[str, int, int]],
                             fingerprints: Mapping[tuple[str, int], int] | None = None
                             ) -> tuple[str, list[object]]:
    """``insert_commits``'s statement and parameters, for a plan of statements (GC). Without
    ``fingerprints`` the statement leaves ``fingerprint`` out (NULL): a transaction that
    ingested nothing binds no more parameters than before the column existed (the column
    costs the statement about 0.03 ms when it is bound)."""
    if not fingerprints:
        placeholders = ", ".join(["(?, ?, ?)"] * len(rows))
        return (f"INSERT INTO sstore_sys.commits (node, batch_id, n_rows) VALUES {placeholders}",
                [value for row in rows for value in row])
    placeholders = ", ".join(["(?, ?, ?, ?)"] * len(rows))
    return (f"INSERT INTO sstore_sys.commits (node, batch_id, n_rows, fingerprint) "
            f"VALUES {placeholders}",
            [value for node, batch_id, n_rows in rows
             for value in (node, batch_id, n_rows, fingerprints.get((node, batch_id)))])


def record_error(con: duckdb.DuckDBPyConnection, procedure: str, batch_id: int, action: str,
                 error: str) -> None:
    con.execute("INSERT INTO sstore_sys.errors (procedure, batch_id, action, error) "
                "VALUES (?, ?, ?, ?)", [procedure, batch_id, action, error])


def save_graph(con: duckdb.DuckDBPyConnection, graph: Graph) -> None:
    rows: list[tuple[str, str, str]] = []
    for s in graph.streams.values():
        rows.append((s.name, "stream", json.dumps({"columns": s.columns, "retain": s.retain,
                                                    "border": graph.is_border(s.name)})))
    for w in graph.windows.values():
        rows.append((w.name, "window", json.dumps({"source": w.source, "size": w.size,
                                                    "slide": w.slide, "unit": w.unit})))
    for e in graph.event_windows.values():
        rows.append((f"event_window:{e.name}", "event_window",  # its name is its stream's
                     json.dumps({"name": e.name, **e.spec()})))
    for p in graph.procedures.values():
        rows.append((p.name, "procedure", json.dumps({
            "inputs": list(p.inputs), "outputs": list(p.outputs), "on_error": p.on_error.value,
            "retries": p.retries, "timeout": p.timeout, "doc": p.doc})))
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


def engine_id(con: duckdb.DuckDBPyConnection) -> str | None:
    """The state's identity, or None if it has none yet."""
    rows = con.execute("SELECT engine_id FROM sstore_sys.identity LIMIT 1").fetchall()
    return str(rows[0][0]) if rows else None


def set_engine_id(con: duckdb.DuckDBPyConnection, engine_id: str) -> None:
    con.execute("INSERT INTO sstore_sys.identity (engine_id) VALUES (?)", [engine_id])


def load_collected(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    return {str(s): int(t) for s, t in con.execute(
        "SELECT stream, through FROM sstore_sys.collected").fetchall()}


def collected_statement(stream: str, through: int) -> tuple[str, list[object]]:
    """The statement (for the GC transaction) that records ``through`` as collected."""
    return ("INSERT INTO sstore_sys.collected VALUES (?, ?) ON CONFLICT (stream) DO UPDATE "
            "SET through = greatest(sstore_sys.collected.through, excluded.through)",
            [stream, through])


def record_collected(con: duckdb.DuckDBPyConnection, streams: list[str], through: int,
                     known: Container[str] = ()) -> None:
    """``streams`` are collected through ``through`` (a group commit's batches that were never
    stored, ``sstore.execution.group``). ``known``: streams that have a row already, updated with a
    plain UPDATE (a third of the upsert's cost, and this runs once per group)."""
    old = [s for s in streams if s in known]
    new = [s for s in streams if s not in known]
    if old:
        execute(con, f"UPDATE sstore_sys.collected SET through = greatest(through, ?) "
                     f"WHERE stream IN ({', '.join('?' * len(old))})", [through, *old])
    if new:
        values = ", ".join(["(?, ?)"] * len(new))
        con.execute(f"INSERT INTO sstore_sys.collected VALUES {values} ON CONFLICT (stream) DO "
                    f"UPDATE SET through = greatest(sstore_sys.collected.through, "
                    f"excluded.through)", [v for stream in new for v in (stream, through)])


def insert_gap(con: duckdb.DuckDBPyConnection, consumer: str, stream: str, first: int,
               last: int) -> None:
    con.execute("INSERT INTO sstore_sys.gaps (consumer, stream, first_batch, last_batch) "
                "VALUES (?, ?, ?, ?)", [consumer, stream, first, last])


def load_gaps(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, int, int, str]]:
    """(consumer, stream, first_batch, last_batch, accepted_at) of every accepted gap."""
    return [(str(c), str(s), int(f), int(la), str(a)) for c, s, f, la, a in con.execute(
        "SELECT consumer, stream, first_batch, last_batch, accepted_at::VARCHAR "
        "FROM sstore_sys.gaps ORDER BY accepted_at").fetchall()]


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


# -- Halts -----------------------------------------------------------------------------------
# A halted procedure stays halted across restarts until someone resumes it: the halt is a row
# of ``sstore_sys.halts``, written in the transaction that records the error, loaded into the
# scheduler when an engine starts, deleted by ``Engine.resume`` / ``sstore resume``. It is
# created on first use, so a state file opened read-only before this table existed reads as
# "nothing halted".

HALTS_DDL = """
CREATE TABLE IF NOT EXISTS sstore_sys.halts (
    procedure VARCHAR PRIMARY KEY, batch_id BIGINT NOT NULL, error VARCHAR NOT NULL,
    halted_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp)
"""


def create_halts(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(HALTS_DDL)


def halt_text(batch_id: int, error: str) -> str:
    """How a halt reads in status: "batch 7: ValueError: ..."."""
    return f"batch {batch_id}: {error}"


def record_halt(con: duckdb.DuckDBPyConnection, procedure: str, batch_id: int,
                error: str) -> None:
    con.execute("INSERT OR REPLACE INTO sstore_sys.halts (procedure, batch_id, error) "
                "VALUES (?, ?, ?)", [procedure, batch_id, error])


def clear_halt(con: duckdb.DuckDBPyConnection, procedure: str) -> bool:
    """Forget ``procedure``'s halt; False if it had none."""
    gone = con.execute("DELETE FROM sstore_sys.halts WHERE procedure = ? RETURNING procedure",
                       [procedure]).fetchall()
    return bool(gone)


def load_halts(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[int, str]]:
    """procedure -> (batch_id, error) of every recorded halt ({} if the table is missing)."""
    exists = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = "
                         "'sstore_sys' AND table_name = 'halts'").fetchall()[0][0]
    if not exists:
        return {}
    return {p: (int(b), e) for p, b, e in con.execute(
        "SELECT procedure, batch_id, error FROM sstore_sys.halts ORDER BY procedure").fetchall()}
