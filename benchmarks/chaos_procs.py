"""The processes of the chaos run and what it sees of them in PostgreSQL.

- ``Worker``: one engine worker (``benchmarks.chaos_worker``) as a child process; a thread reads
  its JSON lines, so the chaos run knows how far it is (``position``: trade events the engine
  has taken, over the three TPC-DI batches) and can wait for a position instead of a time.
- ``backends``: the PostgreSQL sessions of a program, by the application name every child gets
  through ``PGAPPNAME`` (libpq reads it: psycopg and ADBC sessions both carry it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from migrators.watermarks import rows_of

ROOT = Path(__file__).resolve().parent.parent


def child_env(app: str) -> dict[str, str]:
    """The environment of a child: this checkout first on the path, its PostgreSQL sessions
    named ``app``."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
            "PGAPPNAME": app}


class Worker:
    """An engine worker process and its progress (see the module docstring).

    ``offsets[b]``: events of the TPC-DI batches before ``b``, to turn a batch's progress into
    a position over the whole run; ``start_position``: where the engine was when it started
    (the worker reports a position only after its first new engine batch)."""

    def __init__(self, args: Sequence[str], app: str, log_path: Path,
                 offsets: Mapping[int, int], start_position: int) -> None:
        self.app = app
        self.offsets = dict(offsets)
        self.position = start_position
        self.ticks = 0
        self.finished = False  # it printed "done"
        self.started_at = time.monotonic()
        self.last_tick_at = self.started_at
        self.first_tick_at: float | None = None
        self.tick_intervals: list[float] = []
        self._changed = threading.Condition()
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.chaos_worker", *args],
                                     cwd=ROOT, env=child_env(app), stdout=subprocess.PIPE,
                                     stderr=self._log)
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"read-{app}")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            with self._changed:
                if line["event"] == "progress":
                    self.position = self.offsets[line["batch"]] + line["done"]
                    self.ticks += 1
                    now = time.monotonic()
                    if self.first_tick_at is None:
                        self.first_tick_at = now
                    else:
                        self.tick_intervals.append(now - self.last_tick_at)
                    self.last_tick_at = now
                elif line["event"] == "done":
                    self.finished = True
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_for(self, position: int | None = None, ticks: int | None = None,
                 quiet: float | None = None, timeout: float = 600.0) -> str:
        """Wait until the worker reaches ``position``, or has made ``ticks`` more engine
        batches, or has been ``quiet`` (no engine batch) that many seconds. Returns "reached",
        "quiet", "exited" or "timeout"."""
        deadline = time.monotonic() + timeout
        start_ticks = self.ticks
        with self._changed:
            while True:
                if position is not None and self.position >= position:
                    return "reached"
                if ticks is not None and self.ticks - start_ticks >= ticks:
                    return "reached"
                if not self.running and not self._reader.is_alive():
                    return "exited"
                now = time.monotonic()
                if quiet is not None and now - self.last_tick_at >= quiet:
                    return "quiet"
                if now >= deadline:
                    return "timeout"
                self._changed.wait(0.05)

    def kill(self) -> None:
        """SIGKILL, then reap it."""
        if self.running:
            self.proc.send_signal(signal.SIGKILL)
        self.wait(60)

    def wait(self, timeout: float) -> int:
        """Wait for the exit; return the exit status."""
        code = self.proc.wait(timeout)
        self._reader.join(10)
        self._log.close()
        return code


@dataclass(frozen=True)
class Backend:
    pid: int
    state: str | None
    query: str
    in_transaction: bool


def backends(con: psycopg.Connection, app: str) -> list[Backend]:
    """The sessions of application ``app`` now (``con`` is in autocommit: fresh statistics)."""
    rows = con.execute("SELECT pid, state, query, xact_start IS NOT NULL FROM "
                       "pg_stat_activity WHERE application_name = %s", (app,)).fetchall()
    return [Backend(int(r[0]), r[1], r[2] or "", bool(r[3])) for r in rows]


def in_copy(backend: Backend) -> bool:
    """Whether the session is running a COPY into PostgreSQL right now (a sink's binary COPY,
    straight into the target or into the staging table of a merge; not the COPY out that
    reads lookups)."""
    query = " ".join(backend.query.split()).upper()
    return backend.state == "active" and query.startswith("COPY") and "FROM STDIN" in query


def admin(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True, application_name="chaos-harness")


def watermarks(con: psycopg.Connection, table: str) -> frozenset[str]:
    """The watermark rows of ``table`` as text (``con`` in autocommit). Compared before and
    after, any change means a sink committed a chunk, whatever else the rows hold (which
    engine, how many rows, when)."""
    return rows_of(con, table)
