"""PostgreSQL change data capture: a table's snapshot, then its changes, exactly once, through a
logical replication slot (``pgoutput``, built into every server with ``wal_level = logical``).

Positions are LSNs (as integers). The stream has the table's columns plus ``_op`` ('snapshot',
'insert', 'update', 'delete', 'truncate') and ``_lsn``.

1. **Snapshot -> changes handoff, no gap, no duplicate.** A new source creates its slot on a
   replication connection with an exported snapshot (``CREATE_REPLICATION_SLOT ... (SNAPSHOT
   'export')``) and reads the table in a REPEATABLE READ transaction set to that snapshot
   while the replication connection stays open: the snapshot holds exactly the transactions
   that committed before the slot's consistent point, and the slot exactly those after. The
   snapshot is one batch, ``_op = 'snapshot'``, position and batch-id the consistent point. A
   crash before it committed leaves a slot and position 0: the next start drops the slot and
   begins again.
2. **Changes.** ``pg_logical_slot_peek_binary_changes`` reads whole transactions without
   consuming them; a batch is the transactions of one peek (about ``batch`` changes), its
   position and batch-id the end LSN of its last transaction. Transactions at or below the
   committed position (the slot was not advanced yet when the process died) are skipped.
3. **The slot is advanced only after the engine committed** (``pg_replication_slot_advance``
   in ``acknowledge``): until then PostgreSQL keeps the WAL, so a SIGKILL anywhere loses and
   doubles nothing.

Defined outcomes: UPDATE rows carry the new values; DELETE rows the replica identity's columns
(all of them with REPLICA IDENTITY FULL, the key's otherwise, the rest NULL); a table without a
primary key and without REPLICA IDENTITY FULL is refused at start with the command that fixes
it; TRUNCATE is one row with ``_op = 'truncate'`` and NULL columns; a table whose columns change
stops the source (``SourceError``) before the first change with the new shape, to evolve the
stream first; an unchanged TOASTed value without REPLICA IDENTITY FULL stops it too.
A user must not drop the slot by hand (a start then refuses: the changes since are gone) nor
advance it; ``sstore source drop`` (or ``drop_slot``) removes the slot and its publication.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from migrators.postgres import connect, split_name
from migrators.urls import shown, with_connect_timeout
from sstore.base.errors import DeclarationError, SStoreError
from sstore.base.rows import to_arrow
from sstore.engine import Engine
from sstore.sources.base import Chunk, SourceError
from sstore.sources.pgoutput import UNCHANGED, Decoder, Relation, Txn, lsn_int, lsn_text, value_of

log = logging.getLogger("sstore.sources")

#: changes per peek (whole transactions: a batch may hold more)
BATCH = 10_000
EXTRA = ("_op", "_lsn")
#: the column that names a row's table (``SCHEMA.TABLE``): required with several tables
TABLE_COLUMN = "_table"


def slot_name(stream: str) -> str:
    """The slot and publication of ``stream``'s source: ``sstore_<stream>``, lower case."""
    return "sstore_" + "".join(c if c.isalnum() else "_" for c in stream.lower())


class PostgresSource:
    """The snapshot and then the changes of ``table`` (the module docstring)."""

    kind = "postgres"

    def __init__(self, url: str, table: str | list[str], *, batch: int = BATCH) -> None:
        self.url = url
        #: (schema, table) of each captured table, in the order given
        self.tables = [split_name(t) for t in ([table] if isinstance(table, str) else table)]
        if not self.tables or len(set(self.tables)) != len(self.tables):
            raise DeclarationError(f"a PostgreSQL source captures one or more distinct "
                                   f"tables, not {table!r}")
        self.origin = ",".join(f"{s}.{t}" for s, t in self.tables)
        self.batch = batch
        self.slot = ""
        self._con: psycopg.Connection | None = None
        self._stream = ""
        self._schema: pa.Schema | None = None
        self._columns: list[str] = []
        self._position = 0
        self._decoder = Decoder()
        self._snapshot: Chunk | None = None
        self._caught_up = False

    # ------------------------------------------------------------------ start
    def start(self, engine: Engine, stream: str, position: int) -> None:
        self._stream = stream
        self._schema = engine.schema(stream)
        self._position = position
        self.slot = slot_name(stream)
        self._con = connect(self.url)
        self._con.autocommit = True
        self._check_server()
        self._columns = [n for n in self._schema.names if n not in (*EXTRA, TABLE_COLUMN)] \
            if self._schema is not None else []
        self._check_tables()
        slot = self._con.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                 "WHERE slot_name = %s", (self.slot,)).fetchone()
        if position == 0:
            if slot is not None:  # a snapshot that never committed: begin again
                self._con.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
            self._ensure_publication()
            self._snapshot = self._take_snapshot()
            return
        if slot is None:
            raise SourceError(
                f"replication slot {self.slot!r} of stream {self._stream!r} is gone (dropped by "
                f"hand?): the changes of {self.origin} after LSN {lsn_text(position)} are lost "
                f"to this source. Run `sstore source drop STATE --stream {stream}` and feed "
                f"the stream anew from a snapshot (into a new stream)")
        if slot[0] is not None and lsn_int(slot[0]) > position:
            raise SourceError(
                f"replication slot {self.slot!r} was advanced to {slot[0]}, past what stream "
                f"{stream!r} committed ({lsn_text(position)}): changes in between are lost. "
                f"Never advance a source's slot by hand")
        if slot[0] is None or lsn_int(slot[0]) < position:  # died between commit and advance
            self._advance(position)

    def _check_server(self) -> None:
        assert self._con is not None
        level = self._con.execute("SHOW wal_level").fetchone()
        if level is None or level[0] != "logical":
            raise SourceError(
                f"PostgreSQL at {shown(self.url)} has wal_level = {level[0] if level else '?'}; "
                f"change data capture needs logical: ALTER SYSTEM SET wal_level = logical; "
                f"then restart the server")

    def _check_tables(self) -> None:
        """Each table exists and says which row a change is about; the stream has ``_op``,
        ``_lsn`` (and ``_table`` with several tables) and, for a snapshot, exactly the
        tables' columns (their union). Later, each change is checked against the columns it
        came with (``_check_relation``): a change of a table's shape stops the source at the
        first change with the new shape, not at a start before it."""
        assert self._schema is not None
        union: list[str] = []
        for schema, table in self.tables:
            union += [c for c in self._check_table(schema, table) if c not in union]
        extras = [*EXTRA, *([TABLE_COLUMN] if len(self.tables) > 1 else [])]
        wanted = [*union, *extras]
        names = [n for n in self._schema.names if n != TABLE_COLUMN or len(self.tables) > 1]
        if any(extra not in self._schema.names for extra in extras) or (
                self._position == 0 and sorted(names) != sorted(wanted)):
            raise DeclarationError(
                f"stream {self._stream!r} has columns {self._schema.names}; a source of "
                f"{self.origin} feeds {wanted}: declare the tables' columns plus _op VARCHAR "
                f"and _lsn BIGINT" + (" and _table VARCHAR" if len(self.tables) > 1 else ""))

    def _check_table(self, schema: str, table: str) -> list[str]:
        assert self._con is not None
        found = self._con.execute(
            "SELECT a.attname, c.relreplident, EXISTS (SELECT 1 FROM pg_index i WHERE "
            "i.indrelid = c.oid AND i.indisprimary) FROM pg_attribute a JOIN pg_class c ON "
            "c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE "
            "n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attnum", (schema, table)).fetchall()
        if not found:
            raise DeclarationError(f"no table {schema}.{table} at {shown(self.url)}")
        if found[0][1] != "f" and not found[0][2]:
            raise SourceError(
                f"{schema}.{table} has no primary key, so a DELETE or UPDATE would not say "
                f"which row it was: run ALTER TABLE {schema}.{table} REPLICA IDENTITY FULL "
                f"(or add a primary key), then start again")
        return [row[0] for row in found]

    def _ensure_publication(self) -> None:
        assert self._con is not None
        exists = self._con.execute("SELECT 1 FROM pg_publication WHERE pubname = %s",
                                   (self.slot,)).fetchone()
        tables = sql.SQL(", ").join(sql.Identifier(schema, table)
                                    for schema, table in self.tables)
        self._con.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}" if exists is None else
                                  "ALTER PUBLICATION {} SET TABLE {}").format(
            sql.Identifier(self.slot), tables))  # a new source: exactly its tables

    def _take_snapshot(self) -> Chunk:
        """Step 1 of the module docstring: the slot and the table as of its consistent point."""
        assert self._schema is not None
        with psycopg.connect(with_connect_timeout(self.url), replication="database",
                             autocommit=True) as repl:
            answer = repl.execute(sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput "
                                          "(SNAPSHOT 'export')").format(
                sql.Identifier(self.slot))).fetchone()
            assert answer is not None
            consistent, snapshot = lsn_int(answer[1]), answer[2]
            rows = []
            with connect(self.url) as reader:
                reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                reader.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(
                    sql.Literal(snapshot)))
                for schema, table in self.tables:  # every table as of the same instant
                    cur = reader.execute(sql.SQL("SELECT * FROM {}").format(
                        sql.Identifier(schema, table)))
                    names = [d.name for d in cur.description or ()]
                    rows += [self._row(f"{schema}.{table}", dict(zip(names, row, strict=True)),
                                       "snapshot", consistent) for row in cur.fetchall()]
                reader.rollback()
        log.info("%s: snapshot of %s rows at %s", self.origin, len(rows), lsn_text(consistent))
        return Chunk(consistent, consistent, self._table(rows), token=consistent)

    def _row(self, table: str, values: dict[str, Any], op: str, lsn: int) -> dict[str, Any]:
        """A stream row: the stream's columns (NULL where the table has none), ``_op``,
        ``_lsn`` and, with several tables, ``_table``."""
        row: dict[str, Any] = dict.fromkeys(self._columns)
        row.update(values)
        row["_op"], row["_lsn"] = op, lsn
        if len(self.tables) > 1 or (self._schema is not None
                                    and TABLE_COLUMN in self._schema.names):
            row[TABLE_COLUMN] = table
        return row

    def _table(self, rows: list[dict[str, Any]]) -> pa.Table:
        assert self._schema is not None
        try:
            return to_arrow(rows, self._schema, f"stream {self._stream!r}")
        except SStoreError as exc:
            raise SourceError(f"{self.origin}: {exc}; nothing was taken") from None

    # ------------------------------------------------------------------ read
    def read(self, timeout: float) -> Chunk | None:
        if self._snapshot is not None:
            chunk, self._snapshot = self._snapshot, None
            return chunk
        assert self._con is not None
        peeked = self._con.execute(
            "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s, "
            "'proto_version', '1', 'publication_names', %s)",
            (self.slot, self.batch, self.slot)).fetchall()
        txns: list[Txn] = []
        for lsn, data in peeked:
            txn = self._decoder.feed(lsn_int(lsn), bytes(data))
            if txn is not None and txn.end_lsn > self._position:
                txns.append(txn)
        if not txns:
            self._caught_up = True
            if not peeked:
                time.sleep(timeout)
            return None
        self._caught_up = False
        rows = [row for txn in txns for row in self._rows(txn)]
        last = txns[-1].end_lsn
        return Chunk(min(t.end_lsn for t in txns), last, self._table(rows), token=last)

    def _rows(self, txn: Txn) -> list[dict[str, Any]]:
        out = []
        for change in txn.changes:
            relation = self._decoder.relations[change.relation]
            self._check_relation(relation)
            table = f"{relation.schema}.{relation.name}"
            if change.op == "truncate":
                out.append(self._row(table, {}, "truncate", change.lsn))
                continue
            values = change.new if change.new is not None else change.old
            assert values is not None
            row: dict[str, Any] = {}
            for i, (name, type_oid) in enumerate(relation.columns):
                value = value_of(values[i], type_oid)
                if value is UNCHANGED:
                    old = change.old[i] if change.old is not None else UNCHANGED
                    if old is UNCHANGED:
                        raise SourceError(
                            f"{table}: the {change.op} at {lsn_text(change.lsn)} did not send "
                            f"column {name!r} (an unchanged TOASTed value): run ALTER TABLE "
                            f"{table} REPLICA IDENTITY FULL")
                    value = value_of(old, type_oid)
                row[name] = value
            out.append(self._row(table, row, change.op, change.lsn))
        return out

    def _check_relation(self, relation: Relation) -> None:
        """Every column a change carries must be one of the stream's (a column the change
        lacks, dropped or not added yet, is NULL)."""
        new = [name for name, _ in relation.columns if name not in self._columns]
        if new:
            raise SourceError(
                f"{relation.schema}.{relation.name} has new column(s) {new} that stream "
                f"{self._stream!r} lacks: "
                f"evolve the stream (a redeclaration with the new columns appended, or "
                f"Engine.evolve) in its program and start the source again; nothing after "
                f"{lsn_text(self._position)} was taken")

    def caught_up(self) -> bool:
        return self._caught_up

    # ------------------------------------------------------------------ acknowledge
    def acknowledge(self, chunk: Chunk) -> None:
        """Step 3: the slot lets go of the WAL up to the committed batch."""
        self._position = chunk.last
        self._advance(chunk.last)

    def _advance(self, lsn: int) -> None:
        assert self._con is not None
        self._con.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                          (self.slot, lsn_text(lsn)))

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None


def drop_slot(url: str, stream: str) -> bool:
    """Remove ``stream``'s slot and publication (``sstore source drop``); True if a slot was
    there. A slot left behind keeps its WAL on the server for ever."""
    name = slot_name(stream)
    with connect(url) as con:
        con.autocommit = True
        found = con.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                            (name,)).fetchone()
        if found is not None:
            con.execute("SELECT pg_drop_replication_slot(%s)", (name,))
        con.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))
    return found is not None


#: retained WAL above which `sstore source status` raises an alert for a slot (1 GiB)
MAX_RETAINED = 1 << 30


def slot_status(url: str, stream: str, max_retained: int = MAX_RETAINED) -> dict[str, Any]:
    """Slot hygiene of ``stream``'s source: whether its slot exists, the WAL it makes the
    server keep (``retained_bytes``: from its restart LSN), how far its committed position
    is behind the server (``lag_bytes``), and ``alert`` when the retained WAL passes
    ``max_retained`` (a source that stopped following keeps WAL until the disk fills)."""
    name = slot_name(stream)
    with connect(url) as con:
        row = con.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, active "
            "FROM pg_replication_slots WHERE slot_name = %s", (name,)).fetchone()
    if row is None:
        return {"slot": name, "exists": False, "retained_bytes": None, "lag_bytes": None,
                "active": False, "alert": True}
    retained, lag, active = int(row[0] or 0), int(row[1] or 0), bool(row[2])
    return {"slot": name, "exists": True, "retained_bytes": retained, "lag_bytes": lag,
            "active": active, "alert": retained > max_retained}
