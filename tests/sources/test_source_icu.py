"""End to end: the ICU workload fed from NATS JetStream, delivered into PostgreSQL, under
SIGKILLs of the process that runs the source, the dataflow and the sinks (at the source's and
the ingest's protocol steps, and by timers) and a broker restart: the warehouse ends exactly as
in a run fed directly that never crashed (tests/icu_worker.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.test_crash import finish, result
from tests.icu_worker import generated
from tests.nats_server import NatsServer, publish
from tests.workloads.test_icu_crash import _database

ROOT = Path(__file__).resolve().parents[2]


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    full = dict(os.environ, PYTHONPATH=str(ROOT))
    full.pop("SSTORE_CRASH_AT", None)
    full.update(env or {})
    return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture
def databases(warehouse_server) -> Iterator[tuple[str, str]]:
    pid = os.getpid()
    for reference in _database(warehouse_server, f"icu_nats_ref_{pid}"):
        for fed in _database(warehouse_server, f"icu_nats_fed_{pid}"):
            yield reference, fed


def test_icu_from_nats_under_sigkills_equals_a_direct_run(
        tmp_path: Path, databases: tuple[str, str]) -> None:
    reference_url, url = databases
    ref_path = str(tmp_path / "ref.duckdb")
    finish(start(["tests.icu_worker", "full", ref_path, reference_url]))
    broker = NatsServer(tmp_path / "nats")
    broker.start()
    try:
        batches = generated().batches
        payloads = [json.dumps(table.to_pylist(), default=str).encode() for table in batches]
        seqs = publish(broker.url, "ICU", "ICU.readings", payloads, create=True)
        assert seqs == list(range(1, len(batches) + 1))  # sequence = the direct batch-id
        path = str(tmp_path / "fed.duckdb")
        args = ["tests.icu_nats_worker", path, url, broker.url]
        for spec in ("source.after_commit:7", "ingest.before_commit:30"):
            proc = start(args, {"SSTORE_CRASH_AT": spec})
            proc.communicate(timeout=300)
            assert proc.returncode == -signal.SIGKILL, spec
        proc = start(args)
        time.sleep(3.0)
        proc.kill()  # wherever the timer lands
        proc.communicate(timeout=60)
        broker.kill()  # and the broker restarts before the last run
        broker.start()
        finish(start(args))
    finally:
        broker.kill()
    fed, ref = result(path), result(ref_path)
    assert fed["warehouse"] == ref["warehouse"]
    assert fed["counts"] == ref["counts"]
    assert fed["engine_alerts"] == ref["engine_alerts"]
    assert ref["warehouse"]["alerts"] and ref["warehouse"]["rejects"]
