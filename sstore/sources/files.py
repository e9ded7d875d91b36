"""Landing files: every complete file of a folder that matches a pattern, exactly once, in name
order, one file per batch.

When a file is complete (the rule, in this order; all must hold):

1. Its name matches the pattern and does not start with ``.`` (so ``.x.csv`` or ``x.csv.part``
   being written, then renamed into the pattern, is the safe way to land a file: a rename is
   atomic).
2. No process has it open for writing. On Linux this is asked of the kernel: a read lease
   (``fcntl F_SETLEASE``) is refused while any writer has the file open; the lease is released
   at once. Where leases are not available (another owner, a network file system) only rule 3
   applies.
3. Its size and modification time have not changed for ``settle`` seconds, and are the same
   before and after it is read (a writer that reopens it in between is seen).

Files are taken in name order (code point order, as ``sorted`` gives it: zero-pad numbers,
``batch10`` sorts before ``batch2``): a file that is not complete yet holds back the names
after it (batches keep the order the names say, as TPC-DI's batches need).

Exactly once: a taken file's name, size, modification time and SHA-256 digest are recorded in
``sstore_sources.files`` in the same transaction as its batch (``sstore.sources.base``); its
batch-id is its number in that table (1 for the first file). A file whose name was taken is
never taken again; if its content changed (another size, or another digest after its
modification time moved) the source stops with ``FileChangedError``: a rewritten landing file
is an upstream mistake that must be looked at, not a second batch. Taken files may be moved
away or deleted; their names stay taken.

Rows: a CSV file with a header naming the stream's columns (any order), or without a header
(``header=False``: the stream's columns in their declared order; TPC-DI's ``|``-separated
files, ``delimiter="|"``); every value is read as text and stored by the engine's input
value rule (``sstore.base.rows``: exactly as written in the column's type, or the file is
refused); an empty unquoted field is NULL, ``""`` is the empty string. A file that cannot
be read is not taken: the source stops and names it (fix it, or move it away, then run
again).
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import hashlib
import io
import logging
import os
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.csv as pacsv

from sstore.base.errors import SStoreError
from sstore.base.rows import to_arrow
from sstore.engine import Engine
from sstore.execution.transaction import Transaction
from sstore.sources.base import SCHEMA, Chunk, SourceError, select

log = logging.getLogger("sstore.sources")

#: seconds a file's size and modification time must stay unchanged before it is taken
SETTLE = 1.0


class FileChangedError(SourceError):
    """A landing file changed after its rows were taken."""


@dataclass(frozen=True)
class Taken:
    """What the state file recorded of a taken file."""

    size: int
    mtime_ns: int
    digest: str
    batch_id: int


def writer_open(path: str) -> bool | None:
    """Whether a process has ``path`` open for writing: True, False, or None when the kernel
    cannot say (no lease for this user or file system)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as exc:
        return True if exc.errno in (errno.EAGAIN, errno.EBUSY) else None
    else:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return False
    finally:
        os.close(fd)


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FileSource:
    """Landing files of ``directory`` matching ``pattern`` (the module docstring's rules)."""

    kind = "files"

    def __init__(self, directory: str, pattern: str = "*.csv", *,
                 settle: float = SETTLE, delimiter: str = ",", header: bool = True) -> None:
        if len(delimiter) != 1:
            raise ValueError(f"the delimiter is one character, not {delimiter!r}")
        self.directory = os.path.abspath(directory)
        self.pattern = pattern
        self.settle = settle
        #: CSV field separator (TPC-DI's files: ``|``)
        self.delimiter = delimiter
        #: whether the first line names the columns; without, the fields are the stream's
        #: columns in their declared order
        self.header = header
        self.origin = os.path.join(self.directory, pattern)
        self._stream = ""
        self._schema: pa.Schema | None = None
        self._taken: dict[str, Taken] = {}
        self._next = 1
        #: name -> (size, mtime_ns, first seen unchanged at, monotonic)
        self._seen: dict[str, tuple[int, int, float]] = {}
        self._waiting = False

    def start(self, engine: Engine, stream: str, position: int) -> None:
        self._stream = stream
        self._schema = engine.schema(stream)
        rows = select(engine, f"SELECT name, size, mtime_ns, digest, batch_id FROM "
                      f"{SCHEMA}.files WHERE stream = ?", stream)
        self._taken = {r["name"]: Taken(r["size"], r["mtime_ns"], r["digest"], r["batch_id"])
                       for r in rows}
        last = max((t.batch_id for t in self._taken.values()), default=0)
        if last != position:
            raise SourceError(f"stream {stream!r}: {SCHEMA}.files ends at batch {last} but "
                              f"the source's position is {position}: the tables were changed "
                              f"by hand")
        self._next = position + 1

    def names(self) -> list[str]:
        """The folder's names that match the pattern, in name order."""
        try:
            entries = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            raise SourceError(f"no folder {self.directory}") from None
        return [n for n in entries if not n.startswith(".")
                and fnmatch.fnmatchcase(n, self.pattern)
                and os.path.isfile(os.path.join(self.directory, n))]

    def read(self, timeout: float) -> Chunk | None:
        deadline = time.monotonic() + timeout
        while True:
            chunk = self._scan()
            if chunk is not None or time.monotonic() >= deadline:
                return chunk
            time.sleep(min(max(deadline - time.monotonic(), 0.0), 0.05))

    def caught_up(self) -> bool:
        """Nothing left to take but files a writer still holds open: a file only settling
        (closed, changed less than ``settle`` seconds ago) is waited for."""
        return not self._waiting

    def _scan(self) -> Chunk | None:
        self._waiting = False
        for name in self.names():
            path = os.path.join(self.directory, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            taken = self._taken.get(name)
            if taken is not None:
                self._check_unchanged(name, path, st, taken)
                continue
            if not self._complete(name, path, st):
                return None  # names after it wait: name order
            return self._take(name, path, st)
        return None

    def _complete(self, name: str, path: str, st: os.stat_result) -> bool:
        now = time.monotonic()
        seen = self._seen.get(name)
        if seen is None or seen[:2] != (st.st_size, st.st_mtime_ns):
            self._seen[name] = (st.st_size, st.st_mtime_ns, now)
            seen = self._seen[name]
        if writer_open(path):
            log.debug("%s: open for writing, not taken yet", path)
            return False
        if now - seen[2] < self.settle:
            self._waiting = True
            return False
        return True

    def _take(self, name: str, path: str, st: os.stat_result) -> Chunk | None:
        try:
            with open(path, "rb") as f:
                data = f.read()
            after = os.stat(path)
        except FileNotFoundError:  # moved away between the listing and the read
            self._seen.pop(name, None)
            return None
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns) \
                or len(data) != st.st_size:
            self._seen.pop(name, None)  # written to while read: settle again
            self._waiting = True
            return None
        table = self._parse(name, data)
        digest = digest_of(data)
        batch_id = self._next
        size, mtime_ns, rows = st.st_size, st.st_mtime_ns, table.num_rows
        stream = self._stream

        def record(tx: Transaction) -> None:
            tx.execute(f"INSERT INTO {SCHEMA}.files VALUES (?, ?, ?, ?, ?, ?, ?, now())",
                       stream, name, size, mtime_ns, digest, batch_id, rows)

        return Chunk(batch_id, batch_id, table, record=record,
                     token=(name, Taken(size, mtime_ns, digest, batch_id)))

    def _parse(self, name: str, data: bytes) -> pa.Table:
        """The file's rows as text columns (the engine converts them by its value rule)."""
        assert self._schema is not None
        types = {column: pa.string() for column in self._schema.names}
        names = None if self.header else self._schema.names
        try:
            table = pacsv.read_csv(
                io.BytesIO(data), read_options=pacsv.ReadOptions(column_names=names),
                parse_options=pacsv.ParseOptions(delimiter=self.delimiter),
                convert_options=pacsv.ConvertOptions(
                    column_types=types, strings_can_be_null=True, null_values=[""],
                    quoted_strings_can_be_null=False))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise SourceError(f"{os.path.join(self.directory, name)}: not a CSV file with a "
                              f"header this source can read ({exc}); it was not taken: fix "
                              f"it or move it away, then run again") from None
        try:
            return to_arrow(table, self._schema, f"stream {self._stream!r}")
        except SStoreError as exc:
            raise SourceError(f"{os.path.join(self.directory, name)}: {exc}; it was not "
                              f"taken: fix it or move it away, then run again") from None

    def _check_unchanged(self, name: str, path: str, st: os.stat_result, taken: Taken) -> None:
        if (st.st_size, st.st_mtime_ns) == (taken.size, taken.mtime_ns):
            return
        if st.st_size == taken.size:
            with open(path, "rb") as f:
                if digest_of(f.read()) == taken.digest:
                    return  # touched, or copied back whole: the same rows
        raise FileChangedError(
            f"{path} changed after it was taken (batch {taken.batch_id}: {taken.size} bytes, "
            f"sha256 {taken.digest[:16]}...; now {st.st_size} bytes): a landed file must not "
            f"be rewritten, and is not taken twice. Land the new rows under a new name; move "
            f"this one away (or put back what was taken) to go on")

    def acknowledge(self, chunk: Chunk) -> None:
        assert isinstance(chunk.token, tuple)
        name, taken = chunk.token
        assert isinstance(name, str) and isinstance(taken, Taken)
        self._taken[name] = taken
        self._seen.pop(name, None)
        self._next = chunk.last + 1

    def close(self) -> None:
        self._seen.clear()
