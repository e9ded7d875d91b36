"""Rates over a sliding window, from counters sampled whenever someone looks.

A dashboard polls every two seconds and Prometheus every fifteen: each read samples the
counters, and a rate is the change since the oldest sample still inside the window (or the
newest one before it, so a slow poller still gets a rate). Nothing is sampled on the commit
path.
"""

from __future__ import annotations

import collections
import threading

WINDOW_SECONDS = 10.0


class RateMeter:
    """Per-key rates of monotonically increasing counters. ``origin`` (monotonic seconds) is
    when counters that start at zero with their owner were zero."""

    def __init__(self, origin: float, window: float = WINDOW_SECONDS) -> None:
        self.origin = origin
        self.window = window
        self._samples: dict[str, collections.deque[tuple[float, float]]] = {}
        self._mutex = threading.Lock()

    def rate(self, key: str, value: float, now: float, from_zero: bool = True) -> float:
        """Record ``value`` of counter ``key`` at ``now`` (monotonic seconds); return its rate
        per second over the window. ``from_zero``: the counter was 0 at ``origin`` (so the
        first read already has a rate); otherwise the rate starts with the second sample."""
        with self._mutex:
            samples = self._samples.get(key)
            if samples is None:
                samples = self._samples[key] = collections.deque()
                if from_zero:
                    samples.append((self.origin, 0.0))
            if samples and value < samples[-1][1]:
                samples.clear()  # the counter restarted (a sink object replaced)
            samples.append((now, value))
            while len(samples) > 2 and samples[1][0] <= now - self.window:
                samples.popleft()
            first_t, first_v = samples[0]
            return (value - first_v) / (now - first_t) if now > first_t else 0.0
