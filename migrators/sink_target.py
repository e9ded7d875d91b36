"""A continuous sink's PostgreSQL target: made or checked, fenced, fingerprinted, and the rows
converted and written as it takes them.

``StreamToPostgres`` (``migrators.engine_to_postgres``) keeps the engine's side of a sink (its
hold, its acknowledgements, its plan); everything it knows of the table is here, in one
``SinkTarget`` it makes with itself:

- at each start (``claim``, one PostgreSQL transaction): the target's canonical name
  (``watermarks.canonical_target``), the table created or checked for the stream's rows
  (``prepare``: ``migrators.follow`` plans what an evolved stream needs, run later with the
  first rows), the drift check and its fingerprint (``fingerprint``, ``migrators.drift``)
  and the fence (``delivery.claim``: ``epoch``). A stream with no rows yet has nothing to
  create, check or fingerprint: the fence is taken all the same, ``prepared`` stays False and
  the sink's ``plan`` claims again (keeping the fence) once the stream has rows;
- for each delivery: the rows of the batches above a watermark converted for the target's
  column types (``rows_for_target``, ``convert``) and written (``write``: the follow's
  ``ALTER TABLE`` first, with the first rows, then COPY or merge).
"""

from __future__ import annotations

import logging
import os
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from migrators import delivery, drift, follow, watermarks
from migrators.delivery import SinkKey
from migrators.errors import IncompatibleSchemaError
from migrators.postgres import (
    TargetColumns,
    copy_arrow,
    encode_copy,
    last_per_key,
    merge_rows,
    target_columns,
)
from migrators.read_ahead import Converted
from migrators.typemap import (
    check_engine_table,
    check_sendable,
    checks_values,
    for_copy,
    for_target,
)
from sstore.engine import Engine
from sstore.storage.streams import BATCH_COLUMN

log = logging.getLogger("sstore.migrators")

#: one fence token per engine object (``delivery.claim``'s ``writer``): its sinks share the
#: fence; another engine on the same state (a copy of the file in another process) takes it
_WRITERS: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()


def writer_token(engine: Engine) -> str:
    """``engine``'s fence token (made on first use, kept as long as the engine lives)."""
    token = _WRITERS.get(engine)
    if token is None:
        token = _WRITERS[engine] = f"{os.getpid()}:{uuid.uuid4().hex}"
    return token


@dataclass
class SinkTarget:
    """One sink's target (module docstring); the fields up to ``drained_target`` are the
    sink's settings (``StreamToPostgres`` documents them), ``batch_column`` as detected."""

    engine: Engine
    stream: str
    table: str
    mode: str
    key: tuple[str, ...]
    batch_column: str | None
    detect_batch_column: bool
    shared_target: bool
    drained_target: bool
    #: the target's canonical name (``watermarks.canonical_target``), learnt at each claim:
    #: the watermark's key and the name every statement of the sink uses
    name: str | None = None
    #: the target's column types the rows are converted to, learnt at each claim
    types: TargetColumns = field(default_factory=dict)
    #: what the target must gain before the rows of an evolved stream (``migrators.follow``),
    #: run in the transaction of the first delivery with rows (``write``)
    follow: follow.Follow = field(default_factory=follow.Follow)
    #: the fence the last claim took (``delivery.claim``): a writer started later on the
    #: same stream and target makes this sink's next delivery fail, writing nothing
    epoch: int | None = None
    #: whether the last claim had the stream's schema (target made or checked, fingerprint
    #: recorded); False: the sink's ``plan`` claims again at the stream's first rows
    prepared: bool = False
    # (rows' schema, the types dict itself) for which for_copy and for_target change nothing
    # and check no value (``checks_values``); the dict, not its id(): a new dict may get a
    # freed one's id
    _unchanged: tuple[pa.Schema, TargetColumns] | None = field(default=None, repr=False)

    @property
    def target(self) -> str:
        """The canonical name once claimed; the spelling given before."""
        return self.name if self.name is not None else self.table

    @property
    def sink_key(self) -> SinkKey:
        return SinkKey(self.engine.engine_id, self.stream, self.target,
                       ",".join(self.key) if self.mode == "merge" else None, self.epoch)

    # ------------------------------------------------------------------ at a start
    def claim(self, con: psycopg.Connection, schema: pa.Schema | None, keep_fence: bool
              ) -> delivery.Watermark:
        """The target created or checked, and the checked watermark with the fence (one
        transaction). The canonical name is resolved first: the table is created under it.
        ``keep_fence``: check the fence taken before (``FencedError`` when another writer
        took it since) instead of taking it anew."""
        watermarks.ensure_watermarks(con)
        with con.cursor() as cur:
            self.name = watermarks.canonical_target(cur, self.table).name
        key = self.sink_key if keep_fence else replace(self.sink_key, epoch=None)
        self.prepared = schema is not None
        if schema is None:
            return delivery.claim(con, key, None, self.shared_target, self.drained_target,
                                  writer=writer_token(self.engine), missing_ok=True)
        with con.cursor() as cur:
            self.prepare(cur)
        return delivery.claim(con, key, self.prepare, self.shared_target, self.drained_target,
                              self.fingerprint, writer_token(self.engine))

    def fingerprint(self, cur: psycopg.Cursor, stored: str | None,
                    watermark: delivery.Watermark) -> str:
        """The drift check at a claim (``migrators.drift``): what this sink delivers now,
        compared with what it recorded at its last start; recorded by ``delivery.claim``."""
        versions = self.engine.stream_versions(self.stream)
        columns = [[str(r["column_name"]), str(r["data_type"])] for r in self.engine.query(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE schema_name = 'main' "
            "AND table_name = ? AND column_name <> ? ORDER BY column_index", self.stream,
            BATCH_COLUMN).to_pylist()]
        now = drift.Fingerprint(
            len(versions) or 1, columns,
            {"mode": self.mode, "key": list(self.key) if self.mode == "merge" else [],
             "batch_column": self.batch_column}, drift.layout(cur, self.target))
        if stored is not None:
            drift.check(drift.Fingerprint.loads(stored), now, versions,
                        f"sink {self.stream} -> {self.target}",
                        compare_layout=not watermark.reset and watermark.batch_id > 0)
        return now.dumps()

    def prepare(self, cur: psycopg.Cursor) -> None:
        """Create the target if it is missing, or check that it can take the rows; remember
        its column types (rows are converted to them before COPY)."""
        schema = self.engine.schema(self.stream)
        assert schema is not None
        check_engine_table(self.engine, self.stream, f"stream {self.stream!r}")
        existing = target_columns(cur.connection, self.target)
        self.settle_batch_column(existing)
        if self.batch_column:
            schema = schema.insert(0, pa.field(self.batch_column, pa.int64()))
        versions = self.engine.stream_versions(self.stream) if existing else []
        prepared = follow.prepare(
            cur.connection, self.target, schema, tuple(self.key), existing,
            f"stream {self.stream!r}", follow.older_types(versions, self.arrow_type),
            follow.gained(versions))
        self.types, self.follow = prepared.types, prepared.follow

    def arrow_type(self, duckdb_type: str) -> pa.DataType:
        """The Arrow type of a DuckDB type an older version of the stream had (as the
        catalog spelt it), asked of the engine (``follow.older_types``)."""
        return self.engine.query(f"SELECT CAST(NULL AS {duckdb_type}) AS c").schema.field(0).type

    def settle_batch_column(self, existing: TargetColumns) -> None:
        """A target with a ``_batch_id`` column (a sink with ``batch_column`` made it) and a
        sink without a batch column: COPY would leave the column NULL in every row it writes,
        silently, since a nullable column the rows lack is accepted. Take it as the batch
        column when told to detect it, else refuse by its name, before any row is written
        or the watermark touched."""
        if self.batch_column is not None or BATCH_COLUMN not in existing:
            return
        if self.detect_batch_column:
            log.info("%s: the target has a %s column; each row's batch id goes there",
                     self.sink_key, BATCH_COLUMN)
            self.batch_column = BATCH_COLUMN
            return
        raise IncompatibleSchemaError(
            f"target {self.table} has a {BATCH_COLUMN} column (a sink with batch_column="
            f"{BATCH_COLUMN!r} made it), and this sink has no batch column: every row it "
            f"writes would have {BATCH_COLUMN} NULL, which a split object, a cached copy's "
            f"top-up or a backfill replacing by batch id would miss. Nothing was written. "
            f"Pass batch_column={BATCH_COLUMN!r} (`sstore migrate` takes the table's own, or "
            f"--batch-column COL)")

    def skip_gap(self, con: psycopg.Connection, watermark: int, after: int) -> None:
        """An accepted gap: the target's watermark moves from ``watermark`` past it."""
        with con.cursor() as cur:
            delivery.lock(cur, self.sink_key, self.prepare, self.shared_target,
                          self.drained_target)
            delivery.skip_to(cur, self.sink_key, watermark, after)
        con.commit()

    # ------------------------------------------------------------------ for each delivery
    def convert(self, rows: pa.Table, after: int) -> Converted:
        """``rows`` ready for a delivery after watermark ``after`` (``Converted``; the
        runner's read-ahead calls it in its helper thread)."""
        types = self.types
        data = self.rows_for_target(rows, after, types)
        payload = encode_copy(data) if self.mode == "append" and data.num_rows else None
        return Converted(after, types, data, payload)

    def rows_for_target(self, rows: pa.Table, watermark: int,
                        types: TargetColumns | None = None) -> pa.Table:
        """The rows of batches above ``watermark``, converted for the target (for ``types``,
        by default the target's now: the reader thread passes the types it records, so that
        what it converted and what it says it converted for cannot differ)."""
        if types is None:
            types = self.types
        if watermark and rows.num_rows and rows["_batch_id"][0].as_py() <= watermark:
            rows = rows.filter(pc.greater(rows["_batch_id"], watermark))
        data = rows if self.batch_column else rows.drop_columns(["_batch_id"])
        if self.batch_column:
            data = data.rename_columns([self.batch_column, *data.column_names[1:]])
        if self.mode == "merge":
            data = last_per_key(data, self.key)
        check_sendable(data)
        unchanged = self._unchanged
        if unchanged is not None and unchanged[1] is types and unchanged[0].equals(data.schema):
            return data  # the conversions would rebuild the same table (checked once)
        converted = for_target(for_copy(data), types)
        if converted.schema.equals(data.schema) and not checks_values(types):
            self._unchanged = (data.schema, types)
        return converted

    def write(self, cur: psycopg.Cursor, data: pa.Table, payload: bytes | None = None,
              sent: Callable[[], None] | None = None) -> int:
        """Step 4 of ``migrators.delivery``: converted rows into the target (``payload``:
        their COPY encoding; ``sent``: called as PostgreSQL starts on them, ``copy_arrow``)."""
        if self.follow and data.num_rows:  # the columns come with their first rows
            self.follow.apply(cur)
        if self.mode == "append":
            copy_arrow(cur, self.target, data, payload, sent)
        else:
            if sent is not None:
                sent()
            merge_rows(cur, self.target, data, self.key)
        return int(data.num_rows)

    def followed(self) -> tuple[str, ...]:
        """After a COMMIT with rows: what the target gained with them (logged by the sink),
        forgotten (it is done)."""
        changes, self.follow = self.follow.changes, follow.Follow()
        return changes
