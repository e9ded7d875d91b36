"""What has committed: the in-memory mirror of ``sstore_sys.commits``.

Every commit (a border batch ingested, a procedure's transaction execution, a window slide) adds
a row ``(node, batch_id, n_rows)`` to ``sstore_sys.commits`` inside the same DuckDB transaction
as the data it describes. This ledger mirrors those rows so that scheduling needs no SQL; after a
crash it is rebuilt from the table, which is why recovery is simply a restart.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sstore.dataflow.graph import Graph
from sstore.storage.ingested import RANGES, IngestedIds


@dataclass
class NodeBatches:
    """Retained batch-ids of one stream or window, ascending, with a number per batch.

    For streams the number is the batch's row count; for windows it is the sequence number of the
    newest row visible after that slide (the window's contents are the ``size`` rows or batches up
    to it).
    """

    ids: list[int] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)

    def add(self, batch_id: int, number: int) -> None:
        if self.ids and batch_id <= self.ids[-1]:
            raise AssertionError(f"batch {batch_id} recorded after {self.ids[-1]}")
        self.ids.append(batch_id)
        self.numbers.append(number)

    def first_after(self, batch_id: int) -> int | None:
        i = bisect.bisect_right(self.ids, batch_id)
        return self.ids[i] if i < len(self.ids) else None

    def number(self, batch_id: int) -> int | None:
        i = bisect.bisect_left(self.ids, batch_id)
        if i < len(self.ids) and self.ids[i] == batch_id:
            return self.numbers[i]
        return None

    def drop_through(self, batch_id: int) -> None:
        i = bisect.bisect_right(self.ids, batch_id)
        del self.ids[:i]
        del self.numbers[:i]


class Ledger:
    """Progress of procedures and external consumers, batches of streams and windows."""

    def __init__(self, graph: Graph, lookup: Callable[[str, int], bool] | None = None,
                 ranges: int = RANGES) -> None:
        """``lookup(stream, batch_id)``: whether the durable records hold that border batch
        (``systables.was_ingested``); with it, memory keeps only the newest ``ranges`` runs
        of consecutive batch-ids per border stream (``sstore.storage.ingested``), without it all."""
        self.graph = graph
        self.lookup = lookup
        self.ranges = ranges
        self.progress: dict[str, int] = {}
        self.batches: dict[str, NodeBatches] = {}
        self.ingested: dict[str, IngestedIds] = {}
        self.last_ingested: dict[str, int] = {}
        self.holders: dict[str, set[str]] = {}
        self.collected: dict[str, int] = {}  # stream -> highest batch-id GC removed
        #: border stream -> highest batch-id whose commit record GC compacted into a run
        self.compacted: dict[str, int] = {}
        #: undo entries of records not yet committed (group commit), None outside a group
        self._journal: list[tuple[bool, str, int | None]] | None = None

    def load(self, rows: Iterable[tuple[str, int, int]]) -> None:
        """Rebuild from ``sstore_sys.commits`` rows (any order)."""
        for node, batch_id, number in sorted(rows, key=lambda r: (r[0], r[1])):
            self.record(node, batch_id, number)

    def load_ingested(self, stream: str, ranges: list[tuple[int, int]]) -> None:
        """The ingested batch-ids of border ``stream``, as runs of consecutive ids from the
        table (``systables.load_ingested``), replace what ``load`` derived from the records it
        was given (only the ones still retained)."""
        ids = self.ingested_ids(stream)
        ids.replace(ranges)
        self.last_ingested[stream] = ids.lasts[-1] if ids.lasts else 0

    def ingested_ids(self, stream: str) -> IngestedIds:
        ids = self.ingested.get(stream)
        if ids is None:
            lookup = self.lookup
            ids = self.ingested[stream] = IngestedIds(
                None if lookup is None else lambda b: lookup(stream, b), self.ranges)
        return ids

    def was_ingested(self, stream: str, batch_id: int) -> bool:
        """Whether border ``stream`` took ``batch_id`` (a re-send of it is a no-op)."""
        ids = self.ingested.get(stream)
        return ids is not None and batch_id in ids

    def record(self, node: str, batch_id: int, number: int) -> None:
        graph = self.graph
        if node in graph.procedures or node not in graph.streams and node not in graph.windows:
            # procedures, and external consumers such as migrators, only advance
            if self._journal is not None:
                self._journal.append((True, node, self.progress.get(node)))
            self.progress[node] = max(self.progress.get(node, 0), batch_id)
            return
        border = graph.is_border(node)
        if self._journal is not None:
            # an ingest that leads a group (``group.ingest_and_run``) is undone with its
            # previous last batch-id; any other stream or window batch was simply the newest
            self._journal.append((False, node, self.last_ingested.get(node, 0) if border
                                  else None))
        self.batches.setdefault(node, NodeBatches()).add(batch_id, number)
        if border:
            self.ingested_ids(node).add(batch_id)
            self.last_ingested[node] = max(self.last_ingested.get(node, 0), batch_id)

    # -- group commit: records made visible to the scheduler before their COMMIT -------------
    def begin_journal(self) -> None:
        """Records from now on may be taken back (``rollback_journal``) until ``end_journal``:
        a group commit records each member's commits here so that the scheduler can pick the
        next member, before the group's one COMMIT."""
        if self._journal is not None:
            raise AssertionError("a journal is already open")
        self._journal = []

    def end_journal(self) -> None:
        """The group committed: its records stay."""
        self._journal = None

    def rollback_journal(self) -> None:
        """The group rolled back: undo its records, newest first."""
        journal, self._journal = self._journal or [], None
        for is_progress, node, value in reversed(journal):
            if not is_progress:  # a batch of a stream or window: it was the newest
                batch_id = self.batches[node].ids.pop()
                self.batches[node].numbers.pop()
                if value is not None:  # an ingest: value is the last batch-id before it
                    self.ingested[node].remove_newest(batch_id)
                    self.last_ingested[node] = value
            elif value is None:
                self.progress.pop(node, None)
            else:
                self.progress[node] = value

    def start_after_collected(self) -> dict[str, int]:
        """Call once, at start, after ``collected`` is loaded. A procedure that has never run
        starts after every batch collected from any of its inputs; returns those procedures
        with the batch they start after.

        Garbage collection removes a batch only once every reader has committed it, so for a
        procedure declared with the dataflow no input batch at or below its progress is ever
        collected. One declared later has progress 0: with one input, the ledger lists only
        retained batches and it starts after the collected ones by itself; with several, the
        scheduler would pick the oldest batch of the input collected least far, and
        ``Runtime.input_batch`` hand the batches of the other inputs that GC (or a group
        commit, or a chain) never stored as EMPTY batches: "no rows" where there were some."""
        started: dict[str, int] = {}
        for name, decl in self.graph.procedures.items():
            if self.progress.get(name, 0):
                continue
            gone = max((self.collected.get(node, 0) for node in decl.inputs), default=0)
            if gone:
                self.progress[name] = gone
                started[name] = gone
        return started

    def rewind(self, consumer: str, batch_id: int) -> None:
        """An external consumer's progress goes back to ``batch_id`` (its target lost what it
        had acknowledged after that; see ``sstore.storage.consumers``)."""
        self.progress[consumer] = batch_id

    def node_batches(self, node: str) -> NodeBatches:
        return self.batches.setdefault(node, NodeBatches())

    def frontier(self, node: str) -> int:
        """Highest batch-id up to which ``node`` is complete (no batch at or below it can come)."""
        stream = self.graph.source_stream(node)
        producer = self.graph.producer_of(stream)
        if producer is None:
            return self.last_ingested.get(stream, 0)
        return self.progress.get(producer, 0)

    def next_batch(self, procedure: str) -> int | None:
        """The batch ``procedure`` must run next, if all of its inputs have completed it."""
        decl = self.graph.procedures[procedure]
        done = self.progress.get(procedure, 0)
        candidates = [self.node_batches(n).first_after(done) for n in decl.inputs]
        present = [c for c in candidates if c is not None]
        if not present:
            return None
        batch_id = min(present)
        if all(self.frontier(n) >= batch_id for n in decl.inputs):
            return batch_id
        return None

    def retain_from(self, stream: str) -> int | None:
        """Oldest batch-id of ``stream`` still needed by a consumer or holder (None: none is).

        A stream nobody reads keeps its latest batch for pull readers, or every batch when it
        is declared with ``retain="all"`` (a consumer declared later then finds them all)."""
        readers = self.graph.consumers_of(stream) + sorted(self.holders.get(stream, ()))
        batches = self.node_batches(stream)
        if not batches.ids:
            return None
        if not readers:
            decl = self.graph.streams.get(stream)
            if decl is not None and decl.retain == "all":
                return batches.ids[0]
            return batches.ids[-1]  # nobody reads it: keep the latest batch for pull readers
        done = min(self.progress.get(r, 0) for r in readers)
        return batches.first_after(done)
