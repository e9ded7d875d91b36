"""Peak resident memory of one benchmark run, not of the whole process's life.

``resource.getrusage`` only knows the process's lifetime peak, which after the first large run
says nothing about the next one. Linux lets a process reset its own peak (``VmHWM``) by
writing ``5`` to ``/proc/<pid>/clear_refs``; the same works for its children (Spark's JVM,
started by PySpark). ``PeakRss.start()`` resets the peaks, ``stop()`` reads them. Where the
reset is refused (another kernel, a sandbox), the lifetime peak is reported and ``scope``
says so.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Any

import psutil


def _reset(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _hwm_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class PeakRss:
    """Peak RSS in MB of this process and, apart, of its child processes (the JVM)."""

    scope: str = "run"

    def start(self) -> None:
        me = psutil.Process()
        ok = _reset(me.pid)
        for child in me.children(recursive=True):
            _reset(child.pid)
        self.scope = "run" if ok else "process lifetime"

    def stop(self) -> dict[str, Any]:
        me = psutil.Process()
        own = _hwm_mb(me.pid) if self.scope == "run" else None
        if own is None:
            own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        children = [m for m in (_hwm_mb(c.pid) for c in me.children(recursive=True))
                    if m is not None]
        return {"peak_rss_mb": round(own, 1),
                "peak_rss_children_mb": round(sum(children), 1) if children else None,
                "peak_rss_scope": self.scope}
