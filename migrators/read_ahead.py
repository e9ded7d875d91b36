"""A sink's read-ahead: the next chunks read from the engine and made ready for COPY in a
helper thread while the current chunk goes to PostgreSQL.

A catch-up moves chunks one after the other: read the batches from DuckDB (under the
engine's lock), convert them for the target, encode them for binary COPY, then one
PostgreSQL transaction. Done in one thread, the reading and encoding were a third of a
10,000-row chunk's time. Here a helper thread does them for chunk k+1 while the delivering
thread waits for PostgreSQL to take chunk k.

Timing matters more than one would think, because of Python's GIL: the encoder holds it for
a whole call, and a thread that wakes up (PostgreSQL answered) waits for it for up to the
switch interval (5 ms, most of a chunk's COPY). So the helper is not let loose on the whole
plan: it prepares one chunk at a time, started by ``kick()``, which the delivering thread calls
once its COPY stream is in the socket and PostgreSQL works on it, the longest wait it has.
Kicked as the COPY began, the helper's encoder held the GIL while the delivering thread still
had most of 700 KB to send (0.84-0.91x raw COPY at 10,000-row chunks; 1.03x kicked after the
send). The helper's work (a chunk's encoding, or a read of a few chunks) fits in that wait and
the helper is idle, not holding the GIL, when PostgreSQL answers. A chunk not kicked is
prepared when it is reached (the delivering thread then just waits for it, as it would have
done the work itself).

Reads go by groups of chunks (one DuckDB query, one hold of the engine's lock, per up to
``READ_AHEAD_ROWS`` rows); the first group is a single chunk, so delivery starts after the
smallest read. Batches listed as committed do not change and stay held until acknowledged,
so reading them early reads the same rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from migrators.postgres import TargetColumns

#: rows per read of the engine (several chunks; a bigger chunk is read alone). Small enough
#: that a read fits in one COPY's wait (a 20,000-row read took 1.9 ms here, 100,000: 6.5 ms)
READ_AHEAD_ROWS = 20_000


@dataclass
class Chunk:
    """Consecutive committed batches ``first``..``last`` delivered in one transaction."""

    first: int
    last: int
    rows: int
    batches: int


def in_chunks(batches: Iterable[tuple[int, int]], chunk_rows: int) -> list[Chunk]:
    """``batches`` (batch-id, rows; consecutive committed ones, in order) grouped into
    chunks of up to ``chunk_rows`` rows; a bigger batch goes alone, a batch is never split."""
    chunks: list[Chunk] = []
    current: Chunk | None = None
    for batch_id, n in batches:
        if current is not None and current.rows + n > chunk_rows:
            chunks.append(current)
            current = None
        if current is None:
            current = Chunk(batch_id, batch_id, 0, 0)
        current.last, current.rows, current.batches = batch_id, current.rows + n, \
            current.batches + 1
    if current is not None:
        chunks.append(current)
    return chunks


@dataclass(frozen=True)
class Converted:
    """A chunk's rows made ready for the target as planned: converted for the target types
    known then (``types``, compared by identity) after watermark ``after``, and in append
    mode already encoded for COPY (``payload``). A watermark or types found otherwise when
    the chunk is delivered convert again."""

    after: int
    types: TargetColumns | None
    data: pa.Table
    payload: bytes | None


Planned = tuple[Chunk, pa.Table, Converted | None]


class ReadAhead:
    """The chunks of a plan, in order, each with its rows and (read ahead) its ``Converted``.

    ``read(group)``: the rows of a group of chunks, in batch order. ``convert(rows, after)``:
    those rows ready for a delivery after watermark ``after``. ``threaded``: False reads in
    the caller's thread, unconverted (a caller holding the engine's lock: a helper thread
    reading would wait for it forever)."""

    def __init__(self, chunks: list[Chunk], after: int, read: Callable[[list[Chunk]], pa.Table],
                 convert: Callable[[pa.Table, int], Converted], *, threaded: bool,
                 name: str) -> None:
        self._groups = groups(chunks)
        self._read, self._convert = read, convert
        self._planned: list[tuple[int, Chunk, int]] = []  # (group, chunk, batch it follows)
        for g, group in enumerate(self._groups):
            for chunk in group:
                self._planned.append((g, chunk, after))
                after = chunk.last
        self._threaded = threaded and len(self._planned) > 1
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._futures: dict[int, Future[Planned]] = {}
        self._reads: dict[int, Future[tuple[pa.Table, np.ndarray]]] = {}
        self._next = 0  # the chunk the iteration yields next
        self._mutex = threading.Lock()

    def __iter__(self) -> Iterator[Planned]:
        if not self._threaded:
            for group in self._groups:
                for chunk, rows in slices(group, self._read(group)):
                    yield chunk, rows, None
            return
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
        try:
            for k in range(len(self._planned)):
                with self._mutex:
                    self._next = k + 1
                    future = self._submit(k)
                    del self._futures[k]
                yield future.result()
        finally:
            self.close()

    def kick(self) -> None:
        """Start preparing the chunk after the one being delivered (the delivering thread
        calls this once its COPY stream is sent, ``copy_arrow(sent=...)``)."""
        with self._mutex:
            if self._pool is not None and self._next < len(self._planned):
                self._submit(self._next)

    def close(self) -> None:
        """Cancel what has not started (an abandoned plan) and stop the helper thread."""
        with self._mutex:
            pool, self._pool = self._pool, None
            futures: list[Future[Any]] = [*self._futures.values(), *self._reads.values()]
            for future in futures:
                future.cancel()
        if pool is not None:
            pool.shutdown(wait=True)

    def _submit(self, k: int) -> Future[Planned]:
        """Chunk ``k``'s task (once), after its group's read (the helper runs them in order)."""
        assert self._pool is not None
        if k not in self._futures:
            g, chunk, after = self._planned[k]
            if g not in self._reads:
                self._reads[g] = self._pool.submit(self._read_indexed, self._groups[g])
                self._reads.pop(g - 1, None)  # its chunks are all submitted: let its rows go
            self._futures[k] = self._pool.submit(self._prepare, self._reads[g], chunk, after)
        return self._futures[k]

    def _read_indexed(self, group: list[Chunk]) -> tuple[pa.Table, np.ndarray]:
        rows = self._read(group)
        return rows, rows["_batch_id"].to_numpy()

    def _prepare(self, read: Future[tuple[pa.Table, np.ndarray]], chunk: Chunk,
                 after: int) -> Planned:
        rows, ids = read.result()
        part = _chunk_of(rows, ids, chunk)
        return chunk, part, self._convert(part, after)


def groups(chunks: list[Chunk]) -> list[list[Chunk]]:
    """Chunks grouped for one read each: the first chunk alone (delivery starts early), then
    up to ``READ_AHEAD_ROWS`` rows per group (a chunk bigger than that goes alone)."""
    out: list[list[Chunk]] = []
    for i, chunk in enumerate(chunks):
        if i > 1 and sum(c.rows for c in out[-1]) + chunk.rows <= READ_AHEAD_ROWS:
            out[-1].append(chunk)
        else:
            out.append([chunk])
    return out


def slices(group: list[Chunk], rows: pa.Table) -> Iterator[tuple[Chunk, pa.Table]]:
    """The rows of each chunk of a group read at once (rows are in batch order)."""
    ids = rows["_batch_id"].to_numpy()
    for chunk in group:
        yield chunk, _chunk_of(rows, ids, chunk)


def _chunk_of(rows: pa.Table, ids: np.ndarray, chunk: Chunk) -> pa.Table:
    lo = int(np.searchsorted(ids, chunk.first, side="left"))
    hi = int(np.searchsorted(ids, chunk.last, side="right"))
    return rows.slice(lo, hi - lo)


def in_batch_order(rows: pa.Table) -> pa.Table:
    """``rows`` sorted by ``_batch_id`` (stable: rows of one batch keep their order)."""
    ids = rows["_batch_id"].to_numpy()
    if ids.size > 1 and bool((ids[1:] < ids[:-1]).any()):
        rows = rows.take(pc.sort_indices(rows["_batch_id"]))
    return rows
