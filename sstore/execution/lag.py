"""A reader's lag: the batches, rows and bytes it leaves retained, for backpressure.

``sstore.execution.backpressure`` decides what an ingest does about a reader over its bound;
this module only measures (see that module's docstring, "What counts"). The graph is fixed
once the engine has started, so what a border stream reaches and what lies upstream of a node
are computed once; a node's row width is measured again every ``PER_ROW_REFRESH`` batches.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sstore.dataflow.graph import Graph

if TYPE_CHECKING:
    from sstore.execution.backpressure import Bound
    from sstore.execution.runtime import Runtime

PER_ROW_REFRESH = 32  # a node's bytes per row is measured again after this many new batches


@dataclass
class Lag:
    """What a reader leaves retained: batches (stored plus on their way), rows, bytes."""

    batches: int
    rows: int
    bytes: int


@dataclass
class _Width:
    """A node's Arrow bytes per row, measured on batch ``batch_id``; ``newer``: batches seen
    since."""

    batch_id: int
    per_row: float
    newer: int = 0


class Lags:
    """One engine's lag measurements and their caches (``Backpressure.lags``)."""

    def __init__(self) -> None:
        self.per_row: dict[str, _Width] = {}  # node -> its measured row width
        self.downstream: dict[str, set[str]] = {}  # border stream -> nodes it reaches
        self.ancestors_of: dict[str, list[str]] = {}  # node -> streams and windows upstream

    def reach(self, rt: Runtime, stream: str) -> set[str]:
        """``stream`` and every stream and window downstream of it (the graph is fixed once
        the engine has started, so this is computed once per stream)."""
        known = self.downstream.get(stream)
        if known is not None:
            return known
        graph = rt.graph
        seen = {stream}
        todo = [stream]
        while todo:
            node = todo.pop()
            nxt = [w.name for w in graph.windows_on(node)]
            for ew in _event_windows_on(graph, node):  # their two output streams
                nxt.extend((ew.name, ew.late))
            for proc in graph.consumers_of(node):
                nxt.extend(graph.procedures[proc].outputs)
            for n in nxt:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        self.downstream[stream] = seen
        return seen

    def lag(self, rt: Runtime, reader: str, nodes: Sequence[str], bound: Bound | None
             ) -> Lag:
        """Batches (stored for ``reader`` plus on their way), rows and estimated bytes
        ``reader`` leaves retained. With ``bound``, stops counting exactly once the cheap
        upper bound shows it is under the batch bound and no byte bound applies."""
        ledger = rt.ledger
        done = ledger.progress.get(reader, 0)
        stored: list[tuple[str, int]] = []  # (node, index of the first batch above done)
        count = 0
        for node in nodes:
            nb = ledger.batches.get(node)
            if nb is None:
                continue
            i = _first_above(nb.ids, done)
            stored.append((node, i))
            count += len(nb.ids) - i
        ahead: list[tuple[list[int], int]] = []
        for node in nodes:
            complete = ledger.frontier(node)
            for up in self.upstream(rt, node):
                nb = ledger.batches.get(up)
                if nb is not None:
                    i = _first_above(nb.ids, max(complete, done))
                    if i < len(nb.ids):
                        ahead.append((nb.ids, i))
        upper = count + sum(len(ids) - i for ids, i in ahead)
        if ahead and (bound is None or bound.batches is None or upper >= bound.batches):
            ids: set[int] = set()
            for node, i in stored:
                ids.update(ledger.batches[node].ids[i:])
            for up_ids, i in ahead:
                ids.update(up_ids[i:])
            count = len(ids)
        elif ahead:
            count = upper  # under the bound either way; an upper estimate is enough here
        rows = 0
        size = 0.0
        if bound is None or bound.bytes is not None:
            for node, i in stored:
                if node in rt.graph.windows:
                    continue  # a window's numbers are row positions, not counts
                n = sum(ledger.batches[node].numbers[i:])
                rows += n
                size += n * self.bytes_per_row(rt, node)
        return Lag(count, rows, int(size))

    def upstream(self, rt: Runtime, node: str) -> list[str]:
        known = self.ancestors_of.get(node)
        if known is None:
            known = self.ancestors_of[node] = _ancestors(rt.graph, node)
        return known

    def bytes_per_row(self, rt: Runtime, node: str) -> float:
        """Arrow bytes per row of ``node``'s newest batch (remembered across empty ones),
        measured again once ``PER_ROW_REFRESH`` newer batches have come: ``nbytes`` of a
        batch costs 0.1-0.2 ms (a slice of a larger table), and every ingest asks for each
        node its readers leave retained, while a stream's row width hardly changes."""
        latest = rt.latest.get(node)
        known = self.per_row.get(node)
        if latest is None:
            return known.per_row if known is not None else 0.0
        batch_id, table = latest
        if known is not None:
            if batch_id != known.batch_id:
                known.batch_id, known.newer = batch_id, known.newer + 1
            if known.newer < PER_ROW_REFRESH or not table.num_rows:
                return known.per_row
        if table.num_rows:
            self.per_row[node] = _Width(batch_id, table.nbytes / table.num_rows)
            return self.per_row[node].per_row
        return 0.0


def is_over(lag: Lag, bound: Bound) -> bool:
    return (bound.batches is not None and lag.batches >= bound.batches) or \
        (bound.bytes is not None and lag.bytes >= bound.bytes)


def _first_above(ids: list[int], batch_id: int) -> int:
    return bisect.bisect_right(ids, batch_id)


def _event_windows_on(graph: Graph, stream: str) -> list[Any]:
    """Event-time windows over ``stream`` (``sstore.dataflow.event_windows``, where the graph has
    them): each writes two streams in the transaction of the source batch."""
    on = getattr(graph, "event_windows_on", None)
    return list(on(stream)) if on is not None else []


def _ancestors(graph: Graph, node: str) -> list[str]:
    """Streams and windows upstream of ``node`` (through windows and procedures)."""
    seen: list[str] = []
    todo = [node]
    while todo:
        current = todo.pop()
        ups: list[str] = []
        event = getattr(graph, "event_outputs", {}).get(current)
        if current in graph.windows:
            ups.append(graph.windows[current].source)
        elif event is not None:  # a stream written by an event-time window
            ups.append(graph.event_windows[event].source)
        else:
            producer = graph.producer_of(current)
            if producer is not None:
                ups.extend(graph.procedures[producer].inputs)
        for up in ups:
            if up not in seen:
                seen.append(up)
                todo.append(up)
    return seen
