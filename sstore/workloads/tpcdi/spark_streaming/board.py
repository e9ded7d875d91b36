"""Knowing when one micro-batch of a Structured Streaming query is done (closed-loop driving).

The benchmark thread drops a file into the watched directory and waits; Spark's
``foreachBatch`` thread reports each batch-id as done (with the time) or the error that
stopped it. ``wait`` returns when the batch is done and fails loudly when the query died, the
callback raised, or nothing happened for ``timeout`` seconds.
"""

from __future__ import annotations

import threading
import time
from typing import Any


class BatchBoard:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._done: dict[int, float] = {}
        self._failure: BaseException | None = None
        self._cv = threading.Condition()

    def done(self, batch_id: int) -> None:
        with self._cv:
            self._done[batch_id] = time.perf_counter()
            self._cv.notify_all()

    def failed(self, exc: BaseException) -> None:
        with self._cv:
            self._failure = exc
            self._cv.notify_all()

    def wait(self, batch_id: int, query: Any) -> float:
        """The ``perf_counter`` time at which ``batch_id``'s foreachBatch finished."""
        deadline = time.monotonic() + self.timeout
        with self._cv:
            while batch_id not in self._done:
                if self._failure is not None:
                    raise RuntimeError(f"Spark foreachBatch failed on batch {batch_id}: "
                                       f"{self._failure}") from self._failure
                if not query.isActive:
                    raise RuntimeError(f"the Spark query stopped: {query.exception()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"batch {batch_id}: no foreachBatch within "
                                       f"{self.timeout:.0f} s; query status {query.status}")
                self._cv.wait(0.5)
            return self._done[batch_id]
