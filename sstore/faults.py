"""Deterministic crash points for tests.

The engine calls ``crash_point("te.before_commit")`` and friends at each step of its commit
protocols. Normally that is a dictionary lookup and nothing else. When the environment variable
``SSTORE_CRASH_AT`` names a point and a count (``te.before_commit:17``), the process kills
itself with SIGKILL the 17th time it reaches that point: a crash test can hit every step of the
protocol on purpose instead of hoping a timer lands there.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "ingest.before_log", "ingest.before_commit", "ingest.after_commit",
    "te.before_commit", "te.after_commit",
    "gc.before_commit", "log.after_append", "checkpoint.after_snapshot",
    "dead_letters.before_delete", "file.before_rename",
)

_target: tuple[str, int] | None = None
_hits: dict[str, int] = {}


def _load() -> None:
    global _target
    spec = os.environ.get("SSTORE_CRASH_AT", "")
    if not spec:
        _target = None
        return
    point, _, count = spec.partition(":")
    if point not in POINTS:
        raise ValueError(f"SSTORE_CRASH_AT names unknown point {point!r}; points: {POINTS}")
    _target = (point, int(count or "1"))


def crash_point(point: str) -> None:
    if _target is None or _target[0] != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] >= _target[1]:
        os.kill(os.getpid(), signal.SIGKILL)


_load()
