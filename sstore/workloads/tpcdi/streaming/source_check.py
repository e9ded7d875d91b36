"""Resuming a TPC-DI batch only over the source files it started from.

A streaming run on an existing state file leaves out the event lines the engine already took
(``StreamingDimTrade.lines_ingested``): engine batch-ids count lines, not content. If the files
were regenerated or edited in between (another seed or scale factor in the same folder, a
"fixed" Trade.txt), the resumed run would load the old version of the first lines and the new
version of the rest into one warehouse and exit 0. That mix is the worst outcome there is, so
the state file remembers what it streamed:

- before a TPC-DI batch's first line is sent, its event lines' digest (SHA-256 over the lines
  in order) and count are recorded in the state table ``tpcdi_sources``;
- a later run that finds some lines of that batch already taken compares: the same digest
  goes on; another one raises ``SourceChangedError`` before anything is sent, unless the
  whole batch had been taken already (nothing of the new files would be streamed then: a
  warning says so, since the warehouse keeps the old version until a backfill replaces it).

A state file from before this check has taken lines without a record: the record is written
from the files as they are now, with a warning that the lines already taken cannot be checked.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from sstore.base.errors import TerminalError
from sstore.engine import Engine
from sstore.workloads.tpcdi.streaming.events import BatchEvents

log = logging.getLogger("sstore.tpcdi")

TABLE = "tpcdi_sources"
DDL = (f"CREATE TABLE IF NOT EXISTS {TABLE} (tpcdi_batch INTEGER PRIMARY KEY, "
       f"lines BIGINT NOT NULL, digest VARCHAR NOT NULL)")


class SourceChangedError(TerminalError):
    """The event lines of a TPC-DI batch differ from those the state file started to stream."""


@dataclass(frozen=True)
class SourceRecord:
    lines: int
    digest: str


def digest_of(events: BatchEvents) -> SourceRecord:
    """SHA-256 over the batch's event lines in order (each line ends with a newline)."""
    h = hashlib.sha256()
    for chunk in events.lines.column("line").chunks:
        h.update("".join(f"{line}\n" for line in chunk.to_pylist()).encode())
    return SourceRecord(events.lines.num_rows, h.hexdigest())


def declare(engine: Engine) -> None:
    """The state table of the records (idempotent: ``Engine.execute`` skips a redeclaration)."""
    engine.execute(DDL)


def recorded(engine: Engine, tpcdi_batch: int) -> SourceRecord | None:
    _, rows = engine.query_rows(f"SELECT lines, digest FROM {TABLE} WHERE tpcdi_batch = ?",
                                tpcdi_batch)
    return SourceRecord(int(rows[0][0]), str(rows[0][1])) if rows else None


def check_and_record(engine: Engine, events: BatchEvents, taken: int) -> None:
    """Before streaming ``events`` with ``taken`` of its lines already in the engine: refuse
    a changed source (see the module docstring), else record the digest if it is new."""
    now = digest_of(events)
    before = recorded(engine, events.tpcdi_batch)
    if taken and before is not None and before != now:
        where = (f"Batch{events.tpcdi_batch}: the state file has taken lines 1..{taken} of "
                 f"{before.lines} event lines with digest {before.digest[:16]}; the files now "
                 f"give {now.lines} lines with digest {now.digest[:16]}")
        if taken < now.lines:
            raise SourceChangedError(
                f"{where}. Streaming the rest would put two versions of the data into one "
                f"warehouse. Restore the files the run started from, or start over with a "
                f"fresh state file and warehouse schema.")
        log.warning("%s. Nothing of it is streamed again (every line was taken); the "
                    "warehouse keeps what was streamed until a backfill replaces it.", where)
        return
    if before == now:
        return
    if taken and before is None:
        log.warning("Batch%d: the state file took %d event lines before it recorded their "
                    "digest; recording the files as they are now (the lines already taken "
                    "cannot be checked)", events.tpcdi_batch, taken)
    with engine.transaction() as tx:
        tx.execute(f"INSERT OR REPLACE INTO {TABLE} VALUES (?, ?, ?)",
                   events.tpcdi_batch, now.lines, now.digest)
