"""Which batch-ids a border stream has taken, in bounded memory.

An ingest must know whether its batch-id was ingested before (a re-send: a no-op) or was
never ingested and is lower than the last one (refused, ``OutOfOrderBatchError``). The truth
is ``sstore_sys.commits``, which keeps one record per border batch; a set of every id in
memory grew by one entry per batch for as long as the service ran (weeks: millions).

Batch-ids mostly come in runs (``ingest`` without an id takes the last one plus one), so the
ids are kept as ascending ranges of consecutive ids, at most ``RANGES`` of them: only the
newest. An id at or below ``floor`` (older than the ranges kept) is looked up in the table, a
point query that only a re-send of a very old batch (or a wrong one) pays. Without a lookup
(a ledger built by hand) nothing is dropped, so the answer never depends on the bound.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

#: the most ranges of consecutive ids kept in memory per border stream (two ints each)
RANGES = 4096


class IngestedIds:
    """Batch-ids ingested into one border stream: ``firsts[i]..lasts[i]`` (inclusive), ascending,
    newest ``limit`` ranges; ids at or below ``floor`` are answered by ``lookup``."""

    def __init__(self, lookup: Callable[[int], bool] | None, limit: int = RANGES) -> None:
        if limit < 2:  # the newest range must survive an eviction (a group's undo pops it)
            raise ValueError("IngestedIds needs room for at least 2 ranges")
        self.lookup = lookup
        self.limit = limit
        self.firsts: list[int] = []
        self.lasts: list[int] = []
        self.floor = 0

    def __len__(self) -> int:
        """Ranges held in memory (what the bound is about)."""
        return len(self.firsts)

    def add(self, batch_id: int) -> None:
        """``batch_id`` was ingested; it is higher than every id before it."""
        if self.lasts and batch_id <= self.lasts[-1]:
            raise AssertionError(f"batch {batch_id} ingested after {self.lasts[-1]}")
        if self.lasts and batch_id == self.lasts[-1] + 1:
            self.lasts[-1] = batch_id
        else:
            self.firsts.append(batch_id)
            self.lasts.append(batch_id)
        if self.lookup is not None and len(self.firsts) > self.limit:
            self.floor = self.lasts[0]  # committed long ago: the table answers for it
            del self.firsts[0], self.lasts[0]

    def remove_newest(self, batch_id: int) -> None:
        """Undo ``add(batch_id)`` (a group commit rolled back before its COMMIT)."""
        if not self.lasts or self.lasts[-1] != batch_id:
            raise AssertionError(f"batch {batch_id} is not the newest ingested")
        if self.firsts[-1] == batch_id:
            self.firsts.pop()
            self.lasts.pop()
        else:
            self.lasts[-1] = batch_id - 1

    def replace(self, ranges: list[tuple[int, int]]) -> None:
        """Start from the newest ranges of the table (ascending, as ``add`` makes them; the
        caller may pass only the newest ``limit``): anything older is left to the lookup."""
        if self.lookup is not None:
            ranges = ranges[-self.limit:]
        self.firsts = [first for first, _ in ranges]
        self.lasts = [last for _, last in ranges]
        self.floor = self.firsts[0] - 1 if self.lookup is not None and ranges else 0

    def __contains__(self, batch_id: int) -> bool:
        if batch_id <= self.floor and self.lookup is not None:
            return self.lookup(batch_id)
        i = bisect.bisect_right(self.firsts, batch_id) - 1
        return i >= 0 and batch_id <= self.lasts[i]
