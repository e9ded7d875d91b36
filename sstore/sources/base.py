"""What a source is, and the one loop that feeds an engine from it exactly once.

A source (landing files, a NATS JetStream stream, a Kafka topic partition, a PostgreSQL slot)
is a log of items with increasing integer *positions*. The engine's state file, not the
source, is the truth about how far it was taken: ``sstore_sources.positions`` holds, per
stream, the last position whose batch committed, and it is written **in the same DuckDB
transaction as the batch** (``Engine.ingest(along=...)``). So there is no window in which a
batch is committed but its position is not, or the other way round.

Protocol of one batch (``feed``):

1. ``source.read`` returns the next contiguous range of positions after the committed one
   (a ``Chunk``), its rows, and the statements that record what the source needs to remember
   (a file's name, size and digest; dead letters).
2. ``Engine.ingest(stream, rows, batch_id=chunk.batch_id, along=...)``: BEGIN; the rows; the
   position; the source's records; COMMIT. The batch-id is derived from the position, so a
   re-send after a crash between 2 and 3 would be recognised by the engine as well.
3. The program's procedures run (when the engine is the program's own, not ``open_existing``).
4. ``source.acknowledge(chunk)``: only now is the source told (a JetStream ack, a Kafka offset
   commit, a replication slot advanced). A crash before it loses nothing: the next start reads
   from the position in the state file and skips (and acknowledges) what it was given again.

A crash before step 2's COMMIT leaves neither the batch nor its position: the range is read
again. Hence each item is in exactly one committed batch, whatever is killed when.

A stream fed by a source has that source as its only feeder: batch-ids are positions, and an
ingest from elsewhere would take ids the source needs (refused loudly, ``SourceError``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from sstore.base.errors import (
    DeclarationError,
    OutOfOrderBatchError,
    ResendMismatchError,
    TerminalError,
    TransientError,
)
from sstore.base.faults import crash_point
from sstore.engine import Engine
from sstore.execution.transaction import Transaction

log = logging.getLogger("sstore.sources")

SCHEMA = "sstore_sources"
TABLES = (
    f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
    # one row per fed stream: which source feeds it and the last position committed
    f"CREATE TABLE IF NOT EXISTS {SCHEMA}.positions (stream VARCHAR NOT NULL, "
    "kind VARCHAR NOT NULL, origin VARCHAR NOT NULL, position BIGINT NOT NULL, "
    "batches BIGINT NOT NULL, updated TIMESTAMP)",
    # items no batch could hold (undecodable, refused by the input value rule): kept here,
    # committed with the batch that skipped them, so a poison item never blocks the stream
    f"CREATE TABLE IF NOT EXISTS {SCHEMA}.dead_letters (stream VARCHAR NOT NULL, "
    "position BIGINT NOT NULL, batch_id BIGINT NOT NULL, subject VARCHAR, payload BLOB, "
    "error VARCHAR NOT NULL, dead_at TIMESTAMP NOT NULL)",
    # landing files taken (sstore.sources.files): one row each, with the batch that holds it
    f"CREATE TABLE IF NOT EXISTS {SCHEMA}.files (stream VARCHAR NOT NULL, name VARCHAR NOT "
    "NULL, size BIGINT NOT NULL, mtime_ns BIGINT NOT NULL, digest VARCHAR NOT NULL, "
    "batch_id BIGINT NOT NULL, rows BIGINT NOT NULL, taken_at TIMESTAMP NOT NULL)",
)


#: ``sstore source status``: every fed stream, with its dead letters counted
STATUS_SQL = (f"SELECT p.stream, p.kind, p.origin, p.position, p.batches, p.updated, "
              f"(SELECT count(*) FROM {SCHEMA}.dead_letters d WHERE d.stream = p.stream) "
              f"AS dead_letters FROM {SCHEMA}.positions p ORDER BY p.stream")


class SourceError(TerminalError):
    """A source cannot go on without a person: its position disagrees with the stream, an
    item it took changed, the stream has another feeder."""


@dataclass(frozen=True)
class DeadLetter:
    """An item of the range that no row could be made of, and why."""

    position: int
    error: str
    payload: bytes | None = None
    subject: str | None = None


@dataclass
class Chunk:
    """A contiguous range of a source's positions, ``first``..``last``, read as one batch.

    ``batch_id`` is derived from the position (default: ``last``). ``record`` runs inside the
    batch's transaction (the source's own bookkeeping); ``token`` is whatever ``acknowledge``
    needs (JetStream messages, a slot's LSN)."""

    first: int
    last: int
    rows: pa.Table
    record: Callable[[Transaction], None] | None = None
    dead: list[DeadLetter] = field(default_factory=list)
    token: object = None
    batch_id: int = 0

    def __post_init__(self) -> None:
        if self.batch_id == 0:
            self.batch_id = self.last
        if not 0 < self.first <= self.last:
            raise ValueError(f"a chunk covers positions first..last, 0 < first <= last; got "
                             f"{self.first}..{self.last}")


class Source(Protocol):
    """What a source implements (files, NATS JetStream; a Kafka partition would too:
    positions = offsets, ``acknowledge`` = commit the consumer group's offset)."""

    #: "files", "nats", ...: recorded with the position, checked at every start
    kind: str
    #: where it reads (a folder and pattern, a broker's stream and subject): recorded, checked
    origin: str

    def start(self, engine: Engine, stream: str, position: int) -> None:
        """Prepare to read after ``position`` (0: from the beginning), the last position the
        state file says committed. Called once, before any ``read``."""

    def read(self, timeout: float) -> Chunk | None:
        """The next range after the last one returned (the first after ``position``), or None
        when nothing is ready within ``timeout`` seconds."""

    def caught_up(self) -> bool:
        """After a ``read`` that returned None: whether nothing more is coming without new
        input (``--until-idle`` then ends)."""

    def acknowledge(self, chunk: Chunk) -> None:
        """The engine committed ``chunk``: tell the source (idempotent; may never come, after
        a crash, which ``start`` then covers)."""

    def close(self) -> None:
        """Let go of connections and files."""


@dataclass
class FeedReport:
    """What one ``feed`` call did."""

    batches: int = 0
    rows: int = 0
    dead_letters: int = 0
    position: int = 0
    seconds: float = 0.0


def prepare(engine: Engine, stream: str, kind: str, origin: str) -> int:
    """Create the bookkeeping tables, check that ``stream`` is fed by this source only, and
    return its committed position (0 for a new source)."""
    if engine.durability != "full":
        raise DeclarationError("a source needs a state file (full durability): its position is "
                               "committed in the batch's transaction, which the input log of "
                               "weak durability does not record")
    if stream not in engine.graph.streams or not engine.graph.is_border(stream):
        raise DeclarationError(
            f"no border stream {stream!r} to feed in {engine.path}: declare it in the program "
            f"(and run the program once, which records it in the state file); border streams: "
            f"{sorted(s for s in engine.graph.streams if engine.graph.is_border(s)) or 'none'}")
    if engine.schema(stream) is None:
        raise DeclarationError(f"stream {stream!r} has no columns declared: declare it in the "
                               f"program before feeding it from a source")
    for statement in TABLES:
        engine.execute(statement)
    rows = select(engine, f"SELECT kind, origin, position FROM {SCHEMA}.positions "
                  "WHERE stream = ?", stream)
    if not rows:
        engine.execute(f"INSERT INTO {SCHEMA}.positions VALUES (?, ?, ?, 0, 0, NULL)",
                       stream, kind, origin)
        return 0
    row = rows[0]
    if (row["kind"], row["origin"]) != (kind, origin):
        raise SourceError(
            f"stream {stream!r} is fed by the {row['kind']} source {row['origin']!r} (at "
            f"position {row['position']}), not by {kind} {origin!r}: a stream has one source, "
            f"whose positions are its batch-ids. Feed another stream, or run `sstore source "
            f"drop STATE --stream {stream}` first if the old source is gone for good")
    return int(row["position"])


def kind_of(engine: Engine, stream: str) -> str | None:
    """The kind of source that feeds ``stream`` ("files", "nats", "postgres"), or None."""
    for statement in TABLES:
        engine.execute(statement)
    rows = select(engine, f"SELECT kind FROM {SCHEMA}.positions WHERE stream = ?", stream)
    return str(rows[0]["kind"]) if rows else None


def forget(engine: Engine, stream: str) -> bool:
    """Remove what the state file remembers of ``stream``'s source (its position, and for
    landing files the files it took); True if there was one. The stream's batches stay."""
    for statement in TABLES:
        engine.execute(statement)
    rows = select(engine, f"SELECT kind FROM {SCHEMA}.positions WHERE stream = ?", stream)
    with engine.transaction() as tx:
        tx.execute(f"DELETE FROM {SCHEMA}.positions WHERE stream = ?", stream)
        tx.execute(f"DELETE FROM {SCHEMA}.files WHERE stream = ?", stream)
    return bool(rows)


def feed(engine: Engine, source: Source, stream: str, *, until_idle: bool = False,
         stop: threading.Event | None = None, poll: float = 0.5,
         on_batch: Callable[[Chunk], None] | None = None) -> FeedReport:
    """Feed ``stream`` from ``source`` exactly once (the module docstring's protocol) until
    ``stop`` is set, or, with ``until_idle``, until the source is caught up. With the
    program's own engine each batch's procedures run before the source is acknowledged; with
    ``Engine.open_existing`` the batches wait in the state file for the program."""
    began = time.perf_counter()
    position = prepare(engine, stream, source.kind, source.origin)
    report = FeedReport(position=position)
    try:
        source.start(engine, stream, position)
        while stop is None or not stop.is_set():
            chunk = source.read(poll)
            if chunk is None:
                if until_idle and source.caught_up():
                    break
                continue
            if chunk.first <= position:
                raise SourceError(f"source {source.origin!r} gave positions {chunk.first}.."
                                  f"{chunk.last}, but {position} is committed already")
            while not _commit(engine, stream, chunk):  # a reader's backpressure: wait
                if stop is None:
                    time.sleep(poll)
                elif stop.wait(poll):
                    return report
            crash_point("source.after_commit")
            if not engine.foreign:
                engine.run_until_idle()
            source.acknowledge(chunk)
            log.info("stream %s: batch %s committed (positions %s..%s, %s rows, %s dead "
                     "letters)", stream, chunk.batch_id, chunk.first, chunk.last,
                     chunk.rows.num_rows, len(chunk.dead))
            position = chunk.last
            report.batches += 1
            report.rows += chunk.rows.num_rows
            report.dead_letters += len(chunk.dead)
            report.position = position
            if on_batch is not None:
                on_batch(chunk)
    finally:
        source.close()
        report.seconds = time.perf_counter() - began
    return report


def _commit(engine: Engine, stream: str, chunk: Chunk) -> bool:
    """Step 2: the rows, the position, the dead letters and the source's records in one
    transaction. False when a transient refusal (a reader downstream past its backpressure
    bound, ``IngestTimeoutError``) left nothing written: the same chunk is sent again."""
    def along(tx: Transaction) -> None:
        tx.execute(f"UPDATE {SCHEMA}.positions SET position = ?, batches = batches + 1, "
                   "updated = now() WHERE stream = ?", chunk.last, stream)
        for dead in chunk.dead:
            tx.execute(f"INSERT INTO {SCHEMA}.dead_letters VALUES (?, ?, ?, ?, ?, ?, now())",
                       stream, dead.position, chunk.batch_id, dead.subject, dead.payload,
                       dead.error)
        if chunk.record is not None:
            chunk.record(tx)

    another = (f"stream {stream!r} already holds batch {chunk.batch_id} or later, but its "
               f"source's committed position is below {chunk.first}: another feeder ingested "
               f"into this stream, or {SCHEMA}.positions was changed by hand. A stream fed by "
               f"a source has no other feeder; nothing was ingested")
    try:
        ingested = engine.ingest(stream, chunk.rows, batch_id=chunk.batch_id, along=along)
    except (OutOfOrderBatchError, ResendMismatchError) as exc:
        raise SourceError(f"{another} ({exc})") from exc
    except TransientError as exc:
        log.warning("stream %s: batch %s not taken yet (%s); trying again", stream,
                    chunk.batch_id, exc)
        return False
    if ingested.duplicate:
        raise SourceError(another)
    for dead in chunk.dead:
        log.warning("stream %s position %s: dead letter (%s)", stream, dead.position, dead.error)
    return True


def select(engine: Engine, sql: str, *args: Any) -> list[dict[str, Any]]:
    """A small read of the bookkeeping tables, as dicts."""
    names, rows = engine.query_rows(sql, *args)
    return [dict(zip(names, row, strict=True)) for row in rows]


def dead_letters(engine: Engine, stream: str) -> list[dict[str, Any]]:
    """The dead letters a source recorded for ``stream``, oldest first."""
    return select(engine, f"SELECT position, batch_id, subject, payload, error, dead_at FROM "
                  f"{SCHEMA}.dead_letters WHERE stream = ? ORDER BY position", stream)
