"""Push and pull access to committed batches of a stream or window.

Subscribers hear of a batch only after its transaction has committed, and outside the engine's
lock, so a slow callback delays its own thread but never a transaction. A callback that raises
is logged and counted; it cannot undo a commit.
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

    def __init__(self, stream: str, callback: Callback | None, registry: "Subscribers") -> None:
        self.stream = stream
        self.callback = callback
        self.failures = 0
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
        return items

    def close(self) -> None:
        self._registry.remove(self)


class Subscribers:
    def __init__(self) -> None:
        self._by_stream: dict[str, list[Subscription]] = {}
        self._mutex = threading.Lock()

    def add(self, stream: str, callback: Callback | None) -> Subscription:
        sub = Subscription(stream, callback, self)
        with self._mutex:
            self._by_stream.setdefault(stream, []).append(sub)
        return sub

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
