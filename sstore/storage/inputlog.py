"""The input log of a weak-durability engine (S-Store's "weak recovery").

In weak mode the state lives in memory and only what enters the engine from outside is written
to disk: border batches and ad hoc transactions, in the order they were applied, each tagged with
how many transaction executions had committed before it. Replaying the log through the same
(deterministic) procedures rebuilds the state exactly. A checkpoint writes the state to a
snapshot and lets the log start over.

Only what the engine accepted is logged: the record is appended (and fsynced) inside the
engine's transaction, after every statement of it succeeded and right before its COMMIT; if the
COMMIT (or the append itself) fails, ``undo`` cuts the record off again. So a record in the log
is either committed or was valid up to its COMMIT when the process died, and replays.

Each record also carries the digests (``sstore.base.digest``) of the transaction executions that
committed since the previous record (``note_te``), and an ad hoc transaction's record the
digests of its statements: replay recomputes them and stops on a difference
(``sstore.execution.recovery``). Two kinds of record exist for that alone and are not fsynced (the
next input's fsync makes them durable; a crash before it loses nothing a logged input depends on):
``gc``, a garbage collection and the bounds it removed below, replayed at the same point so
that a stream's table holds at replay what it held live; and ``te``, the digests of TEs that
no input followed yet.

Record layout: ``b"SSL1"`` | payload length (8 bytes, little-endian) | CRC32 of payload (4 bytes)
| payload. The payload is an Arrow IPC stream whose schema metadata says what the record is
(``gc`` and ``te`` records: that metadata alone, as JSON). A torn last record (a crash during
the append) was never acknowledged, so it is cut off; damage anywhere else is an error.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, cast

import pyarrow as pa

from sstore.base.errors import InputLogError
from sstore.base.faults import crash_point

MAGIC = b"SSL1"
HEADER = struct.Struct("<4sQI")


@dataclass
class LogRecord:
    lsn: int
    #: "ingest", "oltp", "gc", "te" or "identity" (the engine's UUID, see
    #: sstore.execution.lifecycle.identity)
    kind: str
    te_seq: int  # transaction executions committed before this record was applied
    stream: str | None = None
    batch_id: int | None = None
    table: pa.Table | None = None
    statements: list[tuple[str, Any]] | None = None
    engine_id: str | None = None
    #: digests of the TEs committed since the previous record, in order (None: a log written
    #: before digests existed, not checked)
    tes: list[int] | None = None
    #: an ad hoc transaction's statement digests (None: not recorded)
    digests: list[int] | None = None
    #: a GC's bounds: stream -> the lowest batch-id it kept
    keep: dict[str, int] | None = None


class InputLog:
    def __init__(self, path: str, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        self.next_lsn = 1
        self._file: IO[bytes] | None = None  # opened after replay
        #: (procedure, batch-id, digest) of the TEs committed since the last record; the next
        #: record carries them (live), or replay compares them with it (``take_tes``)
        self._tes: list[tuple[str, int, int]] = []
        self._taken: list[tuple[str, int, int]] = []  # what the last record took (``undo``)

    def records(self) -> Iterator[LogRecord]:
        """Read every whole record; cut off a torn tail."""
        if not os.path.exists(self.path):
            return
        good = 0
        with open(self.path, "rb") as f:
            data = f.read()
        offset = 0
        while offset < len(data):
            if len(data) - offset < HEADER.size:
                break
            magic, length, crc = HEADER.unpack_from(data, offset)
            end = offset + HEADER.size + length
            if magic != MAGIC:
                raise InputLogError(f"{self.path}: bad record header at byte {offset}")
            if end > len(data):
                break
            payload = data[offset + HEADER.size:end]
            if zlib.crc32(payload) != crc:
                if end == len(data):
                    break
                raise InputLogError(f"{self.path}: checksum mismatch in record at byte {offset}")
            record = _decode(payload)
            self.next_lsn = record.lsn + 1
            offset = good = end
            yield record
        if good < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good)

    def _open(self) -> IO[bytes]:
        if self._file is None:
            self._file = open(self.path, "ab")
        return self._file

    def note_te(self, procedure: str, batch_id: int, digest: int) -> None:
        """A TE committed (live or at replay) with this digest (``sstore.base.digest.te``)."""
        self._tes.append((procedure, batch_id, digest))

    def pending_tes(self) -> bool:
        """Whether TEs committed since the last record (``append_tes`` logs them)."""
        return bool(self._tes)

    def take_tes(self) -> list[tuple[str, int, int]]:
        """The TEs noted since the last record, forgotten here (replay compares them)."""
        taken, self._tes = self._tes, []
        return taken

    def append_ingest(self, stream: str, batch_id: int, table: pa.Table, te_seq: int) -> int:
        """Log a border batch; returns where its record starts (for ``undo``)."""
        meta = {"kind": "ingest", "lsn": self.next_lsn, "te_seq": te_seq, "stream": stream,
                "batch_id": batch_id}
        return self._append(_encode(table, self._with_tes(meta)))

    def append_oltp(self, statements: list[tuple[str, Any]], te_seq: int,
                    digests: list[int] | None = None) -> int:
        """Log an ad hoc transaction's statements (and their digests); returns where its
        record starts."""
        meta = {"kind": "oltp", "lsn": self.next_lsn, "te_seq": te_seq, "digests": digests}
        table = pa.table({"statements": pa.array([pickle.dumps(statements)], pa.binary())})
        return self._append(_encode(table, self._with_tes(meta)))

    def append_gc(self, keep: dict[str, int], te_seq: int) -> int:
        """Log a garbage collection (``sstore.execution.gc.collect``) with the bounds it removed
        below; not fsynced (see the module docstring)."""
        meta = {"kind": "gc", "lsn": self.next_lsn, "te_seq": te_seq, "keep": keep}
        return self._append(_encode_meta(self._with_tes(meta)), input=False, sync=False)

    def append_tes(self, te_seq: int) -> int:
        """Log the digests of the TEs no record carried yet; not fsynced."""
        meta = {"kind": "te", "lsn": self.next_lsn, "te_seq": te_seq}
        return self._append(_encode_meta(self._with_tes(meta)), input=False, sync=False)

    def _with_tes(self, meta: dict[str, Any]) -> dict[str, Any]:
        """The record carries the pending TE digests; ``undo`` gives them back."""
        self._taken, self._tes = self._tes, []
        meta["tes"] = [d for _, _, d in self._taken]
        return meta

    def append_identity(self, engine_id: str) -> int:
        """Record the engine's identity, so that a replayed state keeps it."""
        meta = {"kind": "identity", "lsn": self.next_lsn, "te_seq": 0, "engine_id": engine_id}
        self._taken = []
        return self._append(_encode(pa.table({"engine_id": [engine_id]}), meta), input=False)

    def identity(self) -> str | None:
        """The engine identity recorded in the log, if any (reads the log once)."""
        for record in self.records():
            if record.kind == "identity":
                return record.engine_id
        return None

    def _append(self, payload: bytes, input: bool = True, sync: bool = True) -> int:
        """Write one record durably; returns where it starts. ``input``: a border input
        (the crash point ``log.after_append`` counts those only); ``sync``: fsync it."""
        f = self._open()
        start = f.tell()
        try:
            f.write(HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload)
            f.flush()
            if self.fsync and sync:
                os.fsync(f.fileno())
        except BaseException:
            self._cut(start)  # a torn record must not stay in front of the next one
            self._tes = self._taken + self._tes
            raise
        self.next_lsn += 1
        if input:
            crash_point("log.after_append")
        return start

    def undo(self, start: int) -> None:
        """Remove the last record (appended at ``start``): its transaction did not commit."""
        self._cut(start)
        self.next_lsn -= 1
        self._tes, self._taken = self._taken + self._tes, []

    def _cut(self, start: int) -> None:
        try:
            f = self._open()
            f.truncate(start)
            f.flush()
            os.fsync(f.fileno())
        except OSError as exc:
            raise InputLogError(f"{self.path}: cannot remove a record the engine did not accept "
                                f"(byte {start} on): {exc}; a restart would replay it, so stop "
                                f"and truncate the file there by hand") from exc

    def restart(self) -> None:
        """Empty the log after a checkpoint (LSNs keep counting up); the TEs it took are in
        the snapshot, never replayed."""
        self._tes, self._taken = [], []
        if self._file is not None:
            self._file.close()
            self._file = None
        with open(self.path, "wb") as f:
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _encode(table: pa.Table, meta: dict[str, Any]) -> bytes:
    schema = table.schema.with_metadata({b"sstore": json.dumps(meta).encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(table.replace_schema_metadata(schema.metadata))
    return cast(bytes, sink.getvalue().to_pybytes())


def _encode_meta(meta: dict[str, Any]) -> bytes:
    """A record without rows (``gc``, ``te``): its metadata as JSON, a tenth of the cost of
    an Arrow IPC stream (an IPC stream starts with 0xFFFFFFFF, never with ``{``)."""
    return json.dumps(meta).encode()


def _decode(payload: bytes) -> LogRecord:
    if payload[:1] == b"{":
        meta = json.loads(payload)
        return LogRecord(meta["lsn"], meta["kind"], meta["te_seq"], tes=meta.get("tes"),
                         keep=meta.get("keep"))
    table = pa.ipc.open_stream(payload).read_all()
    meta = json.loads(table.schema.metadata[b"sstore"])
    table = table.replace_schema_metadata(None)
    tes = meta.get("tes")
    if meta["kind"] == "ingest":
        return LogRecord(meta["lsn"], "ingest", meta["te_seq"], meta["stream"], meta["batch_id"],
                         table, tes=tes)
    if meta["kind"] == "identity":
        return LogRecord(meta["lsn"], "identity", 0, engine_id=meta["engine_id"])
    statements = pickle.loads(table.column("statements")[0].as_py())
    return LogRecord(meta["lsn"], "oltp", meta["te_seq"], statements=statements, tes=tes,
                     digests=meta.get("digests"))
