"""Event-time windows across SIGKILLs, in both durability modes: the closed windows (with their
revisions), the late rows, the watermarks and the open windows' rows end the same as in a run
that never crashed. The worker is ``tests/crash_worker.py events-full|events-weak`` (readings
-> a cleaning procedure -> a tumbling window fed inside its TE, and a sliding window fed inside
the ingest); kills are random timers and ``SSTORE_CRASH_AT`` crash points, as in
tests/engine/test_crash.py, with fewer batches to keep the runtime modest."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.engine import test_crash as crash
from tests.engine.test_crash import finish, result

BATCHES = 24


def start(mode: str, path: str, env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    return crash.start(f"events-{mode}", path, env_extra, BATCHES)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    path = str(tmp_path_factory.mktemp("evref") / "ref.duckdb")
    began = time.monotonic()
    finish(start("full", path))
    seconds = time.monotonic() - began
    ref = result(path)
    # the workload exercised every outcome: first closes, corrections, late rows, open rows
    revisions = {row[4] for row in ref["closes"]}
    assert 1 in revisions and max(revisions) > 1
    assert {row[0] for row in ref["late_rows"]} == {"per_minute", "sliding"}
    assert all(n > 0 for _, n in ref["open_rows"])
    for name, _, _, rows_in, rows_late in ref["watermarks"]:
        assert rows_late == sum(1 for r in ref["late_rows"] if r[0] == name) and rows_in
    return {"result": ref, "seconds": seconds}


@pytest.mark.parametrize("mode, wanted_kills", [("full", 3), ("weak", 3)])
def test_random_sigkills_keep_windows_and_late_rows(mode: str, wanted_kills: int,
                                                    reference: dict, tmp_path: Path) -> None:
    rng = random.Random(len(mode))
    max_delay = 0.5 + 0.8 * float(reference["seconds"])
    kills = episodes = 0
    while kills < wanted_kills:
        path = str(tmp_path / f"{mode}-{episodes}.state")
        kills += crash.kill_until_done(mode, path, rng, max_delay, min_delay=0.3, launch=start)
        assert result(path) == reference["result"], f"{mode} run {episodes} differs"
        episodes += 1


@pytest.mark.parametrize("mode, point", [
    ("full", "ingest.before_commit:13"), ("full", "te.before_commit:19"),
    ("weak", "log.after_append:16"), ("weak", "checkpoint.after_snapshot:1")])
def test_crash_points_keep_windows_and_late_rows(mode: str, point: str, reference: dict,
                                                 tmp_path: Path) -> None:
    path = str(tmp_path / "state")
    proc = start(mode, path, {"SSTORE_CRASH_AT": point})
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, f"crash point {point} was never reached"
    finish(start(mode, path))
    assert result(path) == reference["result"]
