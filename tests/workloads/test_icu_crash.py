"""The ICU workload across SIGKILLs, in both durability modes: the alerts, the per-patient
windows, the rejected and the too-late readings in PostgreSQL, and the engine's counts, end
the same as in a run that never crashed. The worker is ``tests/icu_worker.py`` (the whole
dataflow with its four warehouse sinks); kills are random timers and ``SSTORE_CRASH_AT``
crash points, as in tests/engine/test_event_windows_crash.py."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sstore.base.sql import ident
from sstore.workloads import icu
from tests.engine.test_crash import finish, result
from tests.icu_worker import generated

ROOT = Path(__file__).resolve().parents[2]


def start(mode: str, path: str, url: str, env_extra: dict[str, str] | None = None
          ) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SSTORE_CRASH_AT", None)
    env.update(env_extra or {})
    return subprocess.Popen([sys.executable, "-m", "tests.icu_worker", mode, path, url],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture
def database(warehouse_server, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database of its own (the reference needs one for the whole module)."""
    yield from _database(warehouse_server, f"icu_crash_{os.getpid()}_{request.node.name}")


def _database(server, name: str) -> Iterator[str]:
    name = "".join(c if c.isalnum() else "_" for c in name)[:60].lower()
    auth = server.user + (f":{server.password}" if server.password else "")
    base = f"postgresql://{auth}@{server.host}:{server.port}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as con:
        con.execute(f"DROP DATABASE IF EXISTS {ident(name)}")
        con.execute(f"CREATE DATABASE {ident(name)}")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as con:
            con.execute(f"DROP DATABASE IF EXISTS {ident(name)} WITH (FORCE)")


@pytest.fixture(scope="module")
def reference(warehouse_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    for url in _database(warehouse_server, f"icu_crash_ref_{os.getpid()}"):
        path = str(tmp_path_factory.mktemp("icuref") / "ref.duckdb")
        began = time.monotonic()
        finish(start("full", path, url))
        seconds = time.monotonic() - began
        ref = result(path)
        gen = generated()
        verdict = icu.match([dict(zip(("alert_id", "patient", "kind", "window_start",
                                       "window_end"), (a[0], a[1], a[2], _ts(a[3]), _ts(a[4]))))
                             for a in ref["warehouse"]["alerts"]], gen.episodes)
        assert verdict.ok and len(gen.episodes) >= 5, verdict.describe(gen.episodes)
        assert ref["counts"]["late"] > 0 and ref["warehouse"]["late"]
        assert len(ref["warehouse"]["rejects"]) == gen.bad
        yield {"result": ref, "seconds": seconds}


def _ts(text: str):
    import datetime
    return datetime.datetime.fromisoformat(text)


@pytest.mark.parametrize("mode", ["full", "weak"])
def test_random_sigkills_keep_alerts_and_warehouse(mode: str, reference: dict, database: str,
                                                   tmp_path: Path) -> None:
    rng = random.Random(len(mode) * 31)
    max_delay = max(1.5, 0.6 * float(reference["seconds"]))  # most runs die before done
    path, kills = str(tmp_path / f"{mode}.state"), 0
    while True:
        proc = start(mode, path, database)
        try:
            proc.wait(timeout=rng.uniform(1.0, max_delay) if kills < 2 else 300)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            continue
        finish(proc)
        break
    assert kills >= 1
    assert result(path) == reference["result"], f"{mode} run after {kills} kills differs"


@pytest.mark.parametrize("mode, point", [("full", "te.before_commit:40"),
                                         ("weak", "log.after_append:30")])
def test_crash_points_keep_alerts_and_warehouse(mode: str, point: str, reference: dict,
                                                database: str, tmp_path: Path) -> None:
    path = str(tmp_path / "state")
    proc = start(mode, path, database, {"SSTORE_CRASH_AT": point})
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, f"crash point {point} was never reached"
    finish(start(mode, path, database))
    assert result(path) == reference["result"]
