"""Deterministic crash points for tests.

The engine calls ``crash_point("te.before_commit")`` and friends at each step of its commit
protocols. Normally that is a dictionary lookup and nothing else. When the environment variable
``SSTORE_CRASH_AT`` names a point and a count (``te.before_commit:17``), the process kills
itself with SIGKILL the 17th time it reaches that point: a crash test can hit every step of the
protocol on purpose instead of hoping a timer lands there.

``SSTORE_CRASH_SIGNAL`` (``TERM``, ``INT``; default ``KILL``) sends another signal instead, once,
at that pass: a clean stop requested at a known step of a protocol (``sstore.execution.stopping``),
which the process then finishes as it would after a user's Ctrl-C or ``kill``.

``procedure.body`` is never called by the engine: a procedure's own code calls it (the model
test's ``enrich`` does, between its statements), so that a crash or a stop can land while user
code runs inside an open transaction, not only at the engine's own steps.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "ingest.before_log", "ingest.before_commit", "ingest.after_commit",
    "te.before_commit", "te.after_commit",
    "gc.before_commit", "log.after_append", "checkpoint.after_snapshot",
    "dead_letters.before_delete", "file.before_rename",
    "evolve.before_commit", "evolve.after_commit", "upgrade.before_commit",
    "start.before_commit", "procedure.body", "source.after_commit",
)

_target: tuple[str, int] | None = None
_signal: int = signal.SIGKILL
_hits: dict[str, int] = {}


def _load() -> None:
    global _target, _signal
    name = os.environ.get("SSTORE_CRASH_SIGNAL", "KILL").upper().removeprefix("SIG")
    if name not in ("KILL", "TERM", "INT"):
        raise ValueError(f"SSTORE_CRASH_SIGNAL names {name!r}; known: KILL, TERM, INT")
    _signal = getattr(signal, f"SIG{name}")
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
    # once: a process that survives the signal (a clean stop) passes the point again, and a
    # second SIGTERM would end it at once (``sstore.execution.stopping``)
    if _hits[point] == _target[1]:
        os.kill(os.getpid(), _signal)


_load()
