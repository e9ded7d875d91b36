"""``sstore status STATE`` while another process runs the pipeline and holds the file.

A real second process (``tests.observe_flow``) owns the state file, as a running pipeline
does; ``sstore status`` runs as a third process, the way an operator types it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sstore.observe import live
from tests.observe_flow import DATAFLOW, PROCEDURES

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def sstore(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sstore.cli", *args], capture_output=True,
                          text=True, env={**ENV, "COLUMNS": "150"}, timeout=120, check=False)


@contextmanager
def pipeline(state: str, batches: int, *flags: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """The pipeline process: it has run ``batches`` batches and holds ``state`` until the
    block ends; yields it and its URL ("-" when it does not serve)."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.observe_flow", state, str(batches),
                             *flags], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == ["ready"], (line, proc.stderr.read() if proc.stderr else "")
        yield proc, line[1]
    finally:
        if proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=60)


def test_status_of_a_running_pipeline_comes_from_it(tmp_path: Path) -> None:
    state = str(tmp_path / "state.duckdb")
    with pipeline(state, 5, "--serve", "--halt-at", "4") as (proc, url):
        found = live.find(state)
        assert found is not None and found.pid == proc.pid and found.url == url
        as_json = sstore("status", state, "--json")
        text = sstore("status", state)
        consumers = sstore("consumers", "list", state)
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["live"]["pid"] == proc.pid and doc["live"]["url"] == url
    assert [p["name"] for p in doc["procedures"]] == PROCEDURES
    assert [n["name"] for n in doc["live"]["dataflow"]] == DATAFLOW
    last = {p["name"]: p["last_batch"] for p in doc["procedures"]}
    assert last == {"z_parse": 5, "b_enrich": 5, "a_total": 5, "y_watch": 3}
    assert all(p["last_commit_at"] for p in doc["procedures"])
    assert "bad batch 4" in doc["procedures"][-1]["halted"]
    committed = {p["name"]: p["batches_committed"] for p in doc["live"]["procedures"]}
    assert committed == {"z_parse": 5, "b_enrich": 5, "a_total": 5, "y_watch": 3}
    pressure = {c["consumer"]: c for c in doc["backpressure"]["consumers"]}
    assert pressure["y_watch"]["lag_batches"] == 2 and pressure["y_watch"]["halted"]
    assert pressure["y_watch"]["bound_batches"] == 10_000 and not pressure["y_watch"]["over"]
    assert doc["backpressure"]["blocked"] is False

    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert f"Live from the running engine (PID {proc.pid}) at {url}" in out
    shown = [line.split()[0] for line in out.splitlines()
             if line.split() and line.split()[0] in PROCEDURES]
    assert shown[:4] == PROCEDURES  # dataflow order, not alphabetical
    assert "halted: batch 4: ValueError: bad batch 4" in out
    assert "Backpressure: ingest flows; 0.0 s blocked" in out
    watch = next(line for line in out.splitlines() if line.split()[:2] == ["y_watch",
                                                                            "procedure"])
    assert "2 batches" in watch and "10,000 batches" in watch
    assert consumers.returncode == 0, consumers.stderr
    # the pipeline has closed: the discovery file went with it, the file reads as usual
    assert not os.path.exists(live.discovery_path(state))
    after = sstore("status", state, "--json")
    assert after.returncode == 0 and "live" not in json.loads(after.stdout)


def test_a_pipeline_that_does_not_serve_is_named_with_how_to_serve(tmp_path: Path) -> None:
    state = str(tmp_path / "state.duckdb")
    with pipeline(state, 2) as (proc, url):
        assert url == "-"
        done = sstore("status", state)
    assert done.returncode == 1
    err = done.stderr
    assert "in use by another process" in err and f"PID {proc.pid}" in err
    assert "--serve PORT" in err and "sstore.observe.serve(engine)" in err
    assert "Traceback" not in err


def test_a_killed_server_leaves_a_stale_file_that_is_ignored(tmp_path: Path) -> None:
    state = str(tmp_path / "state.duckdb")
    with pipeline(state, 2, "--serve") as (proc, _):
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert os.path.exists(live.discovery_path(state))  # it had no chance to remove it
    assert live.find(state) is None
    alone = sstore("status", state, "--json")  # nobody holds the file: read it directly
    assert alone.returncode == 0, alone.stderr
    assert "live" not in json.loads(alone.stdout)
    # another pipeline holds the file now and does not serve: the stale file is not used
    with pipeline(state, 1) as (other, _):
        done = sstore("status", state)
    assert done.returncode == 1
    assert f"PID {other.pid}" in done.stderr and "--serve PORT" in done.stderr
    assert "did not answer" not in done.stderr
