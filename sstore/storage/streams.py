"""Stream and window tables: creating them, appending a batch, reading a batch back.

Appending is where EE triggers and windows run: inside the caller's transaction, right after the
rows are inserted, so that they commit or roll back with the rows that fired them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from sstore.base.duck import LARGE_ROWS, arrow, execute, registered
from sstore.base.errors import DeclarationError
from sstore.base.rows import RowsLike, to_arrow
from sstore.base.sql import ident
from sstore.dataflow import event_windows
from sstore.dataflow.graph import Graph
from sstore.dataflow.windows import (
    WindowState,
    WindowUpdate,
    create_window,
    feed_window,
    load_window,
    read_window,
)
from sstore.storage import evolution

NEW_ROWS = "new_rows"
#: The column every stream table leads with: the batch-id of each row. Sinks give their
#: targets one of the same name (``migrators.engine_to_postgres``), and the polystore
#: reads it there to tell which batches a table holds.
BATCH_COLUMN = "_batch_id"


@dataclass
class PendingCommit:
    """What one transaction will have committed, applied to memory only after COMMIT."""

    records: list[tuple[str, int, int]] = field(default_factory=list)
    #: fingerprints of the border batches among ``records`` (``sstore.base.fingerprint``), written
    #: with them: what a re-send of the batch-id is checked against
    fingerprints: dict[tuple[str, int], int] = field(default_factory=dict)
    window_updates: list[WindowUpdate] = field(default_factory=list)
    published: list[tuple[str, int, pa.Table]] = field(default_factory=list)
    created: list[str] = field(default_factory=list)

    def apply(self) -> None:
        for update in self.window_updates:
            update.apply()


class StreamStore:
    """Arrow schemas of the streams and the state of the windows, over one DuckDB connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection, graph: Graph) -> None:
        self.con = con
        self.graph = graph
        self.schemas: dict[str, pa.Schema] = {}
        self.windows: dict[str, WindowState] = {}
        #: streams whose table checks its rows (NOT NULL, CHECK, UNIQUE, ... on a column of
        #: theirs): their rows must be inserted to be checked, so they are never held back
        self.constrained: set[str] = set()
        #: per stream, the lowest batch-id that may still have rows in its table (None: no
        #: rows) and the highest one that has been given rows, read from the table at start;
        #: GC skips the DELETE of a stream whose batches were all passed in memory. A
        #: rolled-back insert leaves the range wider than needed, never narrower.
        self.stored_from: dict[str, int | None] = {}
        self.stored_through: dict[str, int] = {}
        #: streams this start evolved (``sstore.storage.evolution``) and procedures it switched to
        #: another version (``sstore.storage.upgrades``, "procedure NAME"): weak durability then
        #: writes a snapshot at once, the log's later records being made by the new ones
        self.evolved: list[str] = []

    # -- setup ---------------------------------------------------------------------------------
    def plan_evolutions(self, evolutions: Mapping[str, evolution.Explicit] | None = None, *,
                        foreign: bool = False) -> list[evolution.Plan]:
        """What redeclaring the streams does to their tables (``evolution.plan``), every
        change checked before anything is changed; run outside a transaction (a declared
        type is spelt as the catalog spells it by a scratch table in a rolled-back one).
        ``foreign`` (``Engine.open_existing``): the graph is the one saved at the last
        start; the tables are taken as they are, never checked against it nor changed."""
        plans = []
        for decl in self.graph.streams.values():
            if decl.columns is not None and not foreign and self._table_exists(decl.name):
                found = evolution.plan(self.con, decl.name, decl.columns,
                                       (evolutions or {}).get(decl.name))
                if found is not None:
                    plans.append(found)
        return plans

    def create_all(self, plans: Sequence[evolution.Plan] = (), *,
                   blocked: Callable[[], str | None] | None = None) -> None:
        """Evolve the streams ``plans`` change (with their version records) and create the
        declared streams that are missing, in the start's transaction
        (``versioned.start_transaction``). ``blocked``: why no stream may evolve now
        (``evolution.apply``)."""
        con = self.con
        evolution.apply(con, self.graph, list(plans), blocked)
        self.evolved = [p.stream for p in plans]
        for decl in self.graph.streams.values():
            if decl.columns is not None:
                cols = ", ".join(f"{ident(c)} {t}" for c, t in decl.columns.items())
                con.execute(f"CREATE TABLE IF NOT EXISTS {ident(decl.name)} "
                            f"(_batch_id BIGINT NOT NULL, {cols})")
            if self._table_exists(decl.name):
                self.schemas[decl.name] = self._read_schema(decl.name)
                low, high = con.execute(f"SELECT min(_batch_id), max(_batch_id) "
                                        f"FROM {ident(decl.name)}").fetchall()[0]
                self.stored_from[decl.name] = None if low is None else int(low)
                self.stored_through[decl.name] = 0 if high is None else int(high)
        self.constrained = {str(name) for (name,) in con.execute(
            "SELECT DISTINCT table_name FROM duckdb_constraints() WHERE database_name = "
            "current_database() AND schema_name = 'main' AND constraint_column_names <> "
            "['_batch_id']").fetchall()} & set(self.graph.streams)
        for win in self.graph.windows.values():
            source = self.graph.streams[win.source]
            if source.columns is None:
                raise DeclarationError(f"window {win.name!r} needs its source {win.source!r} to "
                                       f"declare its columns")
            state = WindowState(win)
            create_window(con, state, source.columns)
            load_window(con, state)
            self.windows[win.name] = state
        for ewin in self.graph.event_windows.values():
            event_windows.create(con, ewin)

    def _table_exists(self, name: str) -> bool:
        return bool(self.con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'main' AND "
            "table_name = ?", [name]).fetchall()[0][0])

    def _read_schema(self, name: str) -> pa.Schema:
        return self.con.sql(f"SELECT * EXCLUDE (_batch_id) FROM {ident(name)} LIMIT 0"
                            ).to_arrow_table().schema

    def schema(self, stream: str) -> pa.Schema | None:
        return self.schemas.get(stream)

    # -- writing -------------------------------------------------------------------------------
    def conform(self, stream: str, rows: RowsLike, what: str) -> pa.Table:
        schema = self.schemas.get(stream)
        if schema is None:
            table = to_arrow(rows, pa.schema([]), what) if rows is None else _any_arrow(rows, what)
            return table
        return to_arrow(rows, schema, what)

    def append(self, stream: str, batch_id: int, table: pa.Table, pending: PendingCommit, *,
               store_rows: bool = True, fingerprint: int | None = None) -> None:
        """Insert batch ``batch_id`` of ``stream``; run its triggers and feed its windows and
        event windows (``sstore.dataflow.event_windows``: they append batch ``batch_id`` of their
        own output streams here, in the same transaction).

        ``store_rows=False`` (group commit, ``sstore.execution.group``): record the batch but leave
        its rows out of the stream table; only for a stream that exists and has no triggers and no
        windows. The caller inserts them later (``insert``) unless every reader of the batch
        commits in the same transaction, in which case nobody will ever read them there.

        ``fingerprint``: the fingerprint of a border batch, recorded with its commit record."""
        con = self.con
        create = stream not in self.schemas and table.num_columns > 0
        triggers = self.graph.triggers_on(stream)
        if not store_rows:
            if create or triggers or self.graph.windows_on(stream):
                raise AssertionError(f"stream {stream!r}: its rows must be stored")
        elif table.num_rows or create:
            with registered(con, NEW_ROWS, table, keep=True):
                if create:
                    self._create_inferred(stream, batch_id, pending)
                else:
                    execute(con, f"INSERT INTO {ident(stream)} SELECT ?, * FROM {NEW_ROWS}",
                            [batch_id])
                self._stored(stream, batch_id)
                if table.num_rows:
                    for trig in triggers:
                        _run_trigger(con, trig.sql, batch_id)
        pending.records.append((stream, batch_id, table.num_rows))
        if fingerprint is not None:
            pending.fingerprints[(stream, batch_id)] = fingerprint
        pending.published.append((stream, batch_id, table))
        for win in self.graph.windows_on(stream):
            state = self.windows[win.name]
            update = feed_window(con, state, table)
            pending.window_updates.append(update)
            if update.slid:
                pending.records.append((win.name, batch_id, update.promoted))
                wtriggers = self.graph.triggers_on(win.name)
                if wtriggers:
                    contents = self.read_window(win.name, update.promoted)
                    with registered(con, NEW_ROWS, contents, keep=True):
                        for trig in wtriggers:
                            _run_trigger(con, trig.sql, batch_id)
        for ewin in self.graph.event_windows_on(stream):  # from ``table``: stored or not
            fed = event_windows.feed(con, ewin, batch_id, table)
            for out, rows in ((ewin.name, fed.fired), (ewin.late, fed.late)):
                schema = self.schemas[out]
                self.append(out, batch_id, schema.empty_table() if rows is None
                            else rows.cast(schema), pending)

    def insert(self, stream: str, batch_id: int, table: pa.Table) -> None:
        """Store the rows of a batch that ``append(store_rows=False)`` recorded."""
        if table.num_rows:
            with registered(self.con, NEW_ROWS, table, keep=True):
                execute(self.con, f"INSERT INTO {ident(stream)} SELECT ?, * FROM {NEW_ROWS}",
                        [batch_id])
            self._stored(stream, batch_id)

    def _stored(self, stream: str, batch_id: int) -> None:
        if self.stored_from.get(stream) is None:
            self.stored_from[stream] = batch_id
        self.stored_through[stream] = max(self.stored_through.get(stream, 0), batch_id)

    def may_hold_rows_before(self, stream: str, batch_id: int) -> bool:
        """Whether the table of ``stream`` may hold rows of batches below ``batch_id``."""
        first = self.stored_from.get(stream, 0)  # a stream not seen yet: assume it may
        return first is not None and first < batch_id

    def deleted_before(self, stream: str, batch_id: int) -> None:
        """GC deleted the rows of ``stream`` below ``batch_id`` (committed)."""
        if self.stored_through.get(stream, 0) < batch_id:
            self.stored_from[stream] = None  # every stored row was below it: none left
        elif self.may_hold_rows_before(stream, batch_id):
            self.stored_from[stream] = batch_id

    def _create_inferred(self, stream: str, batch_id: int, pending: PendingCommit) -> None:
        """Create an undeclared stream's table from its first batch (the relation
        ``new_rows``), with the rows in it.

        Made FROM the rows, never empty-then-filled: DuckDB 2.0.0 reads a table created empty
        and filled in one transaction as empty in this process once it holds more than one
        row group (~122,880 rows), for that batch and every later one (see
        tests/engine/test_large_batches.py). No ``IF NOT EXISTS``: a table the engine did not know
        about must fail loudly rather than silently keep its rows instead of these."""
        self.con.execute(f"CREATE TABLE {ident(stream)} AS "
                         f"SELECT ?::BIGINT AS _batch_id, * FROM {NEW_ROWS}", [batch_id])
        self.schemas[stream] = self._read_schema(stream)
        pending.created.append(stream)

    def forget(self, pending: PendingCommit) -> None:
        """Undo what ``append`` remembered for a transaction that rolled back."""
        for stream in pending.created:
            self.schemas.pop(stream, None)

    # -- reading -------------------------------------------------------------------------------
    def read(self, stream: str, batch_id: int, rows: int = 0) -> pa.Table:
        """Batch ``batch_id`` of ``stream`` (``rows``: how many it has, if known)."""
        schema = self.schemas.get(stream)
        if schema is None:
            return pa.table({})
        return arrow(self.con, f"SELECT * EXCLUDE (_batch_id) FROM {ident(stream)} "
                               f"WHERE _batch_id = ?", [batch_id], large=rows >= LARGE_ROWS)

    def read_window(self, window: str, promoted: int) -> pa.Table:
        state = self.windows[window]
        columns = list(self.graph.streams[state.decl.source].columns or {})
        return read_window(self.con, state, promoted, columns)


def _any_arrow(rows: RowsLike, what: str) -> pa.Table:
    """Rows of a stream with no schema yet: take the types they come with."""
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pa.RecordBatch):
        return pa.Table.from_batches([rows])
    if hasattr(rows, "to_arrow_table"):
        return rows.to_arrow_table()
    if type(rows).__name__ == "DataFrame":
        return pa.Table.from_pandas(rows, preserve_index=False)
    if isinstance(rows, list) and rows and isinstance(rows[0], dict):
        return pa.Table.from_pylist(rows)
    if isinstance(rows, list) and not rows:
        return pa.table({})
    raise DeclarationError(f"{what}: the stream has no declared columns, so its first rows must "
                           f"be an Arrow table, a DataFrame or dicts (tuples carry no names)")


def append_or_create(con: duckdb.DuckDBPyConnection, table: str, select: str,
                     params: list[object]) -> None:
    """Append the rows of ``select`` to the main-schema table ``table``; create the table FROM
    those rows when it does not exist yet (never empty-then-filled: see ``_create_inferred``)."""
    exists = con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'main' AND "
                         "table_name = ?", [table]).fetchall()[0][0]
    if exists:
        con.execute(f"INSERT INTO {ident(table)} {select}", params)
    else:
        con.execute(f"CREATE TABLE {ident(table)} AS {select}", params)


def _run_trigger(con: duckdb.DuckDBPyConnection, sql: str, batch_id: int) -> None:
    if "$batch_id" in sql:
        execute(con, sql, {"batch_id": batch_id})
    else:
        execute(con, sql)
