"""The faults of the chaos run: which ones, in what order (seeded), and how each is injected.

Five kinds (the issue's list):

- ``engine_kill``: SIGKILL of the engine worker, wherever it is.
- ``migrator_kill``: SIGKILL of ``sstore migrate`` while it moves a stream. The migrator only
  has work when a sink lags, so the fault first makes one lag: the chaos run locks the target
  table (``LOCK TABLE ... IN SHARE MODE``, as a long report query or a slow ``ALTER`` would),
  lets the engine run ahead a few batches, SIGKILLs the worker, lets go of the lock, and runs
  ``sstore migrate STATE --stream S --table T`` (the mode and key of the pipeline's sink) in
  small chunks; that process is SIGKILLed when PostgreSQL shows its COPY (variant "copy") or
  as soon as a chunk of it has committed (variant "commit": the watermark moved, so the kill
  lands between a PostgreSQL commit and the engine's acknowledgement, or just after).
- ``pg_restart``: PostgreSQL stopped ``immediate`` (a crash: recovery at start) or ``fast``
  and started again while the worker runs.
- ``backend_terminate``: ``pg_terminate_backend`` of a worker session that ``pg_stat_activity``
  shows in a COPY.
- ``target_reset``: a user's "start over": the worker is killed, the warehouse's DimTrade
  outputs are dropped (variant "tables": dimtrade, dimessages, rejects; variant "schema": the
  whole warehouse schema) with plain SQL, and the engine's state file is deleted. The next
  worker starts from the first batch into an empty target.

A fault that finds nothing to hit (no COPY within its window, a migrator that finished first) is
recorded as a miss, not counted, and tried again later (``ATTEMPTS`` times in all).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.chaos_procs import ROOT, admin, backends, child_env, in_copy, watermarks
from migrators.watermarks import lock_rows
from sstore.base.sql import ident, qualified
from sstore.maintenance import StreamTarget

KINDS = ("engine_kill", "migrator_kill", "pg_restart", "backend_terminate", "target_reset")
#: How often each kind is drawn beyond the one of each that every plan has. Resets are rarer:
#: each one sends the whole data set again.
WEIGHTS = {"engine_kill": 3, "migrator_kill": 2, "pg_restart": 2, "backend_terminate": 2,
           "target_reset": 1}
OUTPUT_TABLES = ("dimtrade", "dimessages", "rejects")
ATTEMPTS = 3  # tries of a fault that finds nothing to hit
STARTUP_SHARE = 0.2  # faults that hit a worker while it starts (warehouse, dimensions, lookups)


@dataclass(frozen=True)
class Fault:
    """One planned fault. ``share``: where it fires, as a share of the worker's remaining
    work per remaining fault (0: while the worker starts up); ``delay``: how long after that
    point, as a share of an engine batch's time (of the start-up's time for a start-up
    fault); the rest is per kind (see the module docstring)."""

    kind: str
    share: float
    delay: float
    variant: str = ""
    sink: int = 0
    lag: int = 1
    attempt: int = 1  # a miss is tried again as a new fault with the next attempt number


@dataclass
class Injection:
    """What happened when a fault was tried."""

    number: int
    kind: str
    variant: str
    landed: bool
    position: int
    at_seconds: float
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_plan(rng: random.Random, count: int, kinds: Sequence[str] = KINDS) -> list[Fault]:
    """``count`` faults: every kind at least once, the rest drawn by ``WEIGHTS``, shuffled."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {KINDS}")
    chosen = list(kinds)[:count]
    chosen += rng.choices(list(kinds), [WEIGHTS[k] for k in kinds], k=count - len(chosen))
    rng.shuffle(chosen)
    return [make_fault(rng, kind) for kind in chosen]


def make_fault(rng: random.Random, kind: str) -> Fault:
    startup = rng.random() < STARTUP_SHARE and kind not in ("migrator_kill",
                                                            "backend_terminate")
    sink = rng.choice((0, 0, 1, 2))  # dimtrade (merge, rows in every batch) half the time
    variant = {"pg_restart": rng.choice(("immediate", "fast")),
               "target_reset": rng.choice(("tables", "schema")),
               # append sinks often have batches without rows: no COPY to wait for
               "migrator_kill": rng.choice(("copy", "commit")) if sink == 0 else "commit",
               }.get(kind, "")
    return Fault(kind, 0.0 if startup else rng.uniform(0.05, 1.5), rng.random(), variant,
                 sink=sink, lag=rng.randint(1, 3))


# -------------------------------------------------------------------------- migrator kill
def lock_target(url: str, table: str) -> psycopg.Connection | None:
    """Open a transaction that makes the sinks of ``table`` wait: it holds the table in SHARE
    mode (COPY and INSERT wait for it, readers do not) and the table's watermark rows ``FOR
    UPDATE`` (so batches without rows, which need no COPY, wait too). None if the table is
    not there (a reset dropped it)."""
    con = psycopg.connect(url, application_name="chaos-harness")
    try:
        con.execute("SET lock_timeout = '5s'")
        con.execute(f"LOCK TABLE {qualified(table)} IN SHARE MODE")
        lock_rows(con, table)
    except psycopg.Error:
        con.close()
        return None
    return con


def migrate_command(state: str, url: str, sink: StreamTarget, chunk_rows: int) -> list[str]:
    """``sstore migrate`` for one of the pipeline's sinks: same stream, table, mode and key."""
    cmd = [sys.executable, "-m", "sstore.cli", "migrate", state, "--stream", sink.stream,
           "--postgres", url, "--table", sink.table, "--mode", sink.mode,
           "--chunk-rows", str(chunk_rows)]
    return cmd + (["--key", ",".join(sink.key)] if sink.key else [])


def kill_migrator(state: str, url: str, sink: StreamTarget, trigger: str, chunk_rows: int,
                  log_path: Path, timeout: float = 120.0) -> tuple[bool, str]:
    """Run ``sstore migrate`` and SIGKILL it at its first COPY (``trigger`` "copy") or once
    its first chunk committed ("commit"). Returns (killed, what happened)."""
    app = "chaos-migrate"
    with open(log_path, "ab") as log, admin(url) as con:
        before = watermarks(con, sink.table)
        proc = subprocess.Popen(migrate_command(state, url, sink, chunk_rows), cwd=ROOT,
                                env=child_env(app), stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        seen = ""
        while proc.poll() is None and time.monotonic() < deadline:
            if trigger == "copy":
                copying = [b for b in backends(con, app) if in_copy(b)]
                seen = copying[0].query[:60] if copying else ""
            else:
                moved = watermarks(con, sink.table) - before
                seen = f"watermark now {min(moved)}" if moved else ""
            if seen:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
        else:
            if proc.poll() is None:
                proc.kill()
        code = proc.wait(60)
    if seen:
        return True, f"{sink.table}: killed at {seen}"
    return False, f"{sink.table}: sstore migrate ended first (exit {code}), nothing to kill"


# -------------------------------------------------------------------------- backend terminate
def terminate_copy(url: str, app: str, until: float, still_running: Any) -> tuple[bool, str]:
    """Poll ``pg_stat_activity`` until a session of ``app`` is in a COPY, then
    ``pg_terminate_backend`` it. Gives up at ``until`` (monotonic) or when
    ``still_running()`` is false."""
    with admin(url) as con:
        while time.monotonic() < until and still_running():
            for backend in backends(con, app):
                if in_copy(backend):
                    done = con.execute("SELECT pg_terminate_backend(%s)",
                                       (backend.pid,)).fetchone()
                    if done and done[0]:
                        return True, f"backend {backend.pid} in {backend.query[:70]}"
            time.sleep(0.001)
    return False, "no COPY seen in the window"


# -------------------------------------------------------------------------- target reset
def reset_target(url: str, schema: str, state: str, variant: str) -> str:
    """Drop the DimTrade outputs (or the schema) with plain SQL and delete the state file: what
    a user does to start over. The watermarks in ``sstore.watermarks`` are not the user's to
    know about and stay as they are."""
    with admin(url) as con:
        if variant == "schema":
            con.execute(f"DROP SCHEMA IF EXISTS {ident(schema)} CASCADE")
        else:
            for table in OUTPUT_TABLES:
                con.execute(f"DROP TABLE IF EXISTS {ident(schema)}.{ident(table)}")
    removed = [p for p in (Path(state), Path(state + ".wal")) if p.exists()]
    for path in removed:
        path.unlink()
    return f"dropped {'schema ' + schema if variant == 'schema' else 'the output tables'}, " \
           f"deleted {', '.join(p.name for p in removed) or 'no state file'}"
