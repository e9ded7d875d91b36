"""Exactly-once across crashes: a child process is killed with SIGKILL, restarted, fed the same
input again; its final state must equal that of a run that never crashed.

Random kills (timers) hit wherever they land; crash points (``SSTORE_CRASH_AT``) hit each step
of the commit protocols on purpose, so every step is covered on every run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

BATCHES = 80
ROOT = Path(__file__).resolve().parents[2]


def start(mode: str, path: str, env_extra: dict[str, str] | None = None,
          batches: int = BATCHES) -> subprocess.Popen:
    """``tests.crash_worker MODE PATH BATCHES`` as a child process (other crash tests use it
    with their own modes and batch counts)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SSTORE_CRASH_AT", None)
    env.update(env_extra or {})
    return subprocess.Popen([sys.executable, "-m", "tests.crash_worker", mode, path,
                             str(batches)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen) -> None:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"worker failed:\n{err.decode()[-3000:]}"
    assert b"DONE" in out


def result(path: str) -> dict[str, list[list[object]]]:
    with open(path + ".result.json") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The uncrashed run (full mode), its result and its duration."""
    path = str(tmp_path_factory.mktemp("ref") / "ref.duckdb")
    began = time.monotonic()
    finish(start("full", path))
    seconds = time.monotonic() - began
    ref = result(path)
    # sanity: the workload really exercised every procedure on every batch
    procs = {row[0] for row in ref["te_log"]}
    assert procs == {"split", "double", "triple", "merge"}
    assert len(ref["te_log"]) == 4 * BATCHES and ref["window_sums"]
    return {"result": ref, "seconds": seconds}


def kill_until_done(mode: str, path: str, rng: random.Random, max_delay: float, *,
                    min_delay: float = 0.05,
                    launch: Callable[[str, str], subprocess.Popen] | None = None) -> int:
    """Start (``launch``, default ``start``), kill after a random delay, repeat until the
    worker finishes; return kills."""
    kills = 0
    while True:
        proc = (launch or start)(mode, path)
        try:
            proc.wait(timeout=rng.uniform(min_delay, max_delay))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            continue
        finish(proc)
        return kills


@pytest.mark.parametrize("mode, wanted_kills", [("full", 14), ("weak", 8), ("fused", 6)])
def test_random_sigkills_change_nothing(mode: str, wanted_kills: int, reference: dict,
                                        tmp_path: Path) -> None:
    rng = random.Random(hash(mode) & 0xFFFF)
    max_delay = 0.6 + 0.8 * float(reference["seconds"])
    kills = episodes = 0
    while kills < wanted_kills:
        path = str(tmp_path / f"{mode}-{episodes}.state")
        kills += kill_until_done(mode, path, rng, max_delay)
        assert result(path) == reference["result"], f"{mode} run {episodes} differs after kills"
        episodes += 1
    assert kills >= wanted_kills


CRASH_POINTS = {
    "full": ["ingest.before_commit:7", "ingest.after_commit:50", "te.before_commit:3",
             "te.before_commit:97", "te.after_commit:101", "gc.before_commit:2"],
    # ingest_and_run: b's ingest leads each batch's group (te.*); a's ingests stay plain
    "fused": ["te.before_commit:5", "te.before_commit:60", "te.after_commit:33"],
    "weak": ["log.after_append:9", "ingest.before_commit:60", "te.before_commit:77",
             "te.after_commit:41", "checkpoint.after_snapshot:1", "checkpoint.after_snapshot:2"],
}


@pytest.mark.parametrize("mode, point", [(m, p) for m, ps in CRASH_POINTS.items() for p in ps])
def test_crash_at_each_protocol_step(mode: str, point: str, reference: dict,
                                     tmp_path: Path) -> None:
    path = str(tmp_path / "state")
    proc = start(mode, path, {"SSTORE_CRASH_AT": point})
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, f"crash point {point} was never reached"
    finish(start(mode, path))
    assert result(path) == reference["result"]
