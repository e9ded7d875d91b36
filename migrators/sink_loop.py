"""The loop a sink thread runs: one sink's (``StreamToPostgres.attach``) or a sink group's
(``SinkGroup.attach``).

Kept apart from the delivery of a chunk so that both kinds of sink thread wait, retry and halt
by the same rules: woken by a commit (or after ``idle_seconds``), deliver what is pending,
retry transient failures for as long as the thread runs, halt on a terminal one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from migrators.postgres import RetryPolicy
from sstore.retry import Kind, call, kind_of


class Acknowledging(Protocol):
    """What ``idle_seconds`` reads of a sink."""

    ack_every: float
    _unacked: int


def idle_seconds(sinks: Sequence[Acknowledging]) -> float | None:
    """How long a sink thread sleeps when no batch commits: an acknowledgement held back is
    sent after ``ack_every`` (at least every 10 ms) even then; None: no live sink to feed."""
    if not sinks:
        return None
    if any(s._unacked for s in sinks):
        return min(1.0, max(min(s.ack_every for s in sinks), 0.01))
    return 1.0


def feed_until_stopped(wake: threading.Event, stopping: threading.Event, retry: RetryPolicy,
                       what: str, deliver: Callable[[], object],
                       idle: Callable[[], float | None],
                       on_retry: Callable[[BaseException, int], None],
                       on_success: Callable[[], None],
                       on_terminal: Callable[[BaseException], None]) -> None:
    """The loop of a sink thread (one sink's, or a sink group's): wait until woken by a
    commit or ``idle()`` seconds pass (None: nothing left to feed, the loop ends), then
    ``deliver``, retrying transient failures for as long as the thread runs (``retry``'s
    delays, no limit). A terminal failure goes to ``on_terminal`` (the halt) and ends the
    loop; a transient one while stopping just ends it."""
    forever = RetryPolicy(attempts=None, first_delay=retry.first_delay,
                          max_delay=retry.max_delay)
    while not stopping.is_set():
        timeout = idle()
        if timeout is None:
            return
        wake.wait(timeout=timeout)
        wake.clear()
        if stopping.is_set():
            break
        try:
            call(deliver, forever, what, on_retry=on_retry, stop=stopping)
            on_success()
        except Exception as exc:  # noqa: BLE001 - classified: terminal halts, else stopping
            if stopping.is_set() and kind_of(exc) is Kind.TRANSIENT:
                break
            on_terminal(exc)
            return
