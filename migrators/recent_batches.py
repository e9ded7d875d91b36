"""The batches a sink was just handed by the engine, kept in memory until delivered.

A sink running in its own thread is woken by a subscription to its stream, and the
subscription already carries each committed batch's rows (the Arrow table the engine stored).
Reading the same rows back through ``Engine.query`` cost a DuckDB query per chunk (about a
tenth of a 10,000-trade TPC-DI batch's way from COMMIT to PostgreSQL). The sink takes them
from here instead when every batch of a chunk is here, and reads them from the engine when
not (it started late, it lagged past the bound, the process restarted): the engine's stored
batches stay the source of truth, this is only a shortcut to the same rows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import pyarrow as pa

DEFAULT_MAX_ROWS = 200_000  # past this many rows held, new batches are read from the engine


class RecentBatches:
    """Committed batches of one stream, by batch-id, at most ``max_rows`` rows in all."""

    def __init__(self, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        self.max_rows = max_rows
        self._tables: OrderedDict[int, pa.Table] = OrderedDict()
        self._rows = 0
        self._full = False  # a batch was left out: keep none until the held ones are gone
        self._lock = threading.Lock()
        self.hits = 0  # chunks served from memory, for tests and metrics
        self.misses = 0

    def remember(self, batch_id: int, table: pa.Table) -> None:
        """A batch just committed (the subscription's callback). Batches arrive in order; one
        that would pass the bound is not kept, and neither is any later one until the held
        ones are delivered, so what is held is always a run without holes."""
        with self._lock:
            if self._tables and batch_id <= next(reversed(self._tables)):
                return  # a batch seen again (a rewind): the first copy is the same rows
            if self._rows + table.num_rows > self.max_rows or self._full:
                self._full = True
                return
            self._tables[batch_id] = table
            self._rows += table.num_rows

    def take(self, first: int, last: int, batches: int, rows: int,
             schema: pa.Schema) -> pa.Table | None:
        """The rows of batches ``first``..``last`` (``batches`` of them, ``rows`` rows, as the
        engine lists them) with a leading ``_batch_id`` column in ``schema``'s layout, or None
        if any of them is not held or does not match."""
        with self._lock:
            held = [(b, t) for b, t in self._tables.items() if first <= b <= last]
        if (len(held) != batches or sum(t.num_rows for _, t in held) != rows
                or any(not t.schema.equals(schema) for _, t in held)):
            self.misses += 1
            return None
        self.hits += 1
        parts = [t.add_column(0, "_batch_id", pa.array([b] * t.num_rows, pa.int64()))
                 for b, t in held]
        return pa.concat_tables(parts) if parts else None

    def forget_through(self, batch_id: int) -> None:
        """Batches up to ``batch_id`` are delivered: drop them."""
        with self._lock:
            while self._tables and next(iter(self._tables)) <= batch_id:
                _, table = self._tables.popitem(last=False)
                self._rows -= table.num_rows
            if not self._tables:
                self._full = False  # a fresh run can start with the next batch
