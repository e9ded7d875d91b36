"""Push and pull access to committed batches of a stream or window.

Subscribers hear of a batch only after its transaction has committed, and outside the engine's
lock, so a slow callback delays its own thread but never a transaction. A callback that raises
is logged and counted; it cannot undo a commit. A pull subscription (no callback) keeps the
batches in memory until ``poll``: it is a reader with a backpressure bound like any other
(``sstore.execution.backpressure``), named ``name``, so one that is never polled cannot grow
forever.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

import pyarrow as pa

log = logging.getLogger("sstore")

Callback = Callable[[int, pa.Table], None]


class Subscription:
    """Committed batches of one stream: pushed to ``callback``, or queued for ``poll``."""

    def __init__(self, stream: str, callback: Callback | None, registry: Subscribers,
                 number: int = 0) -> None:
        self.stream = stream
        self.callback = callback
        self.failures = 0
        #: its name as a reader (``Engine.backpressure.bound(sub.name, ...)``)
        self.name = f"subscription:{stream}:{number}"
        #: the thread of the latest ``poll`` (an ingest elsewhere may wait for it)
        self.poller: threading.Thread | None = None
        self._queue: collections.deque[tuple[int, pa.Table]] = collections.deque()
        self._mutex = threading.Lock()
        self._registry = registry

    def deliver(self, batch_id: int, table: pa.Table) -> None:
        if self.callback is None:
            with self._mutex:
                self._queue.append((batch_id, table))
            return
        try:
            self.callback(batch_id, table)
        except Exception:  # a subscriber's bug must not reach the engine
            self.failures += 1
            log.exception("subscriber of %r failed on batch %s", self.stream, batch_id)

    def poll(self) -> list[tuple[int, pa.Table]]:
        """Batches committed since the last poll, oldest first (pull mode)."""
        with self._mutex:
            items = list(self._queue)
            self._queue.clear()
            self.poller = threading.current_thread()
        return items

    def queued(self) -> tuple[int, int, int]:
        """(batches, rows, bytes) waiting for ``poll``."""
        with self._mutex:
            tables = [t for _, t in self._queue]
        return len(tables), sum(t.num_rows for t in tables), sum(t.nbytes for t in tables)

    def close(self) -> None:
        self._registry.remove(self)


class Subscribers:
    def __init__(self) -> None:
        self._by_stream: dict[str, list[Subscription]] = {}
        self._mutex = threading.Lock()
        self._made = 0

    def add(self, stream: str, callback: Callback | None) -> Subscription:
        with self._mutex:
            self._made += 1
            sub = Subscription(stream, callback, self, self._made)
            self._by_stream.setdefault(stream, []).append(sub)
        return sub

    def pulls(self) -> list[Subscription]:
        """The pull subscriptions (no callback): the ones that keep batches."""
        with self._mutex:
            return [s for subs in self._by_stream.values() for s in subs if s.callback is None]

    def remove(self, sub: Subscription) -> None:
        with self._mutex:
            subs = self._by_stream.get(sub.stream, [])
            if sub in subs:
                subs.remove(sub)

    def wants(self, stream: str) -> bool:
        return bool(self._by_stream.get(stream))

    def publish(self, items: list[tuple[str, int, pa.Table]]) -> None:
        for stream, batch_id, table in items:
            with self._mutex:
                subs = list(self._by_stream.get(stream, ()))
            for sub in subs:
                sub.deliver(batch_id, table)
