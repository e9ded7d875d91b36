"""Flink's side of ``benchmarks.nexmark``: PyFlink 2.3 in a virtual environment of its own,
the queries run as a subprocess (``benchmarks/nexmark_flink_job.py``).

``apache-flink`` pins ``pandas<2.3`` and ``pyarrow<21``, older than the project's, so it cannot
live in the project's environment. ``ensure_venv`` makes ``.sstore/flink-venv`` (or
``$SSTORE_HOME/flink-venv``) on first use with this interpreter's ``venv`` and installs
``apache-flink==2.3.0`` from PyPI into it (about 850 MB, once); later runs find it ready.
PyFlink brings Flink's jars (the filesystem, CSV and blackhole connectors used here) and
starts a local mini-cluster in the job's JVM; Java 17 is the one the project already needs
for Spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

FLINK_PACKAGE = "apache-flink==2.3.0"
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nexmark_flink_job.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def venv_dir() -> str:
    home = os.environ.get("SSTORE_HOME") or os.path.join(ROOT, ".sstore")
    return os.path.join(home, "flink-venv")


def _python(path: str) -> str:
    return os.path.join(path, "bin", "python")


def ready(path: str) -> bool:
    """PyFlink imports in the environment at ``path``."""
    if not os.path.exists(_python(path)):
        return False
    done = subprocess.run([_python(path), "-c", "import pyflink.table"], capture_output=True,
                          timeout=120, check=False)
    return done.returncode == 0


def ensure_venv(path: str | None = None, log: Any = print) -> str:
    """The interpreter of a virtual environment with PyFlink, made on first use."""
    path = path or venv_dir()
    if ready(path):
        return _python(path)
    log(f"creating Flink's virtual environment in {path} ({FLINK_PACKAGE}, about 850 MB, "
        "once)")
    subprocess.run([sys.executable, "-m", "venv", path], check=True)
    subprocess.run([_python(path), "-m", "pip", "install", "--quiet", FLINK_PACKAGE],
                   check=True)
    if not ready(path):
        raise RuntimeError(f"PyFlink does not import in {path} after installing it")
    return _python(path)


def run(python: str, events_dir: str, queries: list[str], parallelism: int, check_dir: str,
        live_files: list[str] | None = None, timeout: float = 3600) -> list[dict[str, Any]]:
    """Run ``queries`` on Flink over the event files; one record per query (the job's JSON
    line: seconds of the timed run, startup, peak RSS of the JVM, result rows). The results
    are in ``check_dir/<query>.csv``. ``live_files``: the event files of 10,000 to drop into
    each query's latency run (``benchmarks.nexmark_flink_latency``), which adds
    ``latencies_ms`` to its record; None: no latency run."""
    from benchmarks import nexmark_flink_latency as latency
    os.makedirs(check_dir, exist_ok=True)
    args = [python, JOB, events_dir, ",".join(queries), str(parallelism), check_dir]
    if live_files is not None:
        args.append(os.path.join(check_dir, "live"))
    deadline = time.monotonic() + timeout
    records: list[dict[str, Any]] = []
    with open(os.path.join(check_dir, "job.stderr"), "w+", encoding="utf-8") as errors, \
            subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=errors, text=True, cwd=check_dir) as job:
        assert job.stdin is not None and job.stdout is not None
        stdin, stdout = job.stdin, job.stdout

        def message() -> dict[str, Any]:
            while True:
                line = stdout.readline()
                if not line:
                    return {}
                if line.startswith("{"):
                    return dict(json.loads(line))

        def stop() -> None:
            stdin.write("stop\n")
            stdin.flush()

        while time.monotonic() < deadline:
            found = message()
            if not found:
                break
            if "ready" in found:
                assert live_files is not None
                records[-1] |= latency.measure(found, live_files, stop, message)
            else:
                records.append(found)
        else:
            job.kill()
        code = job.wait()
        if code != 0:
            errors.seek(0)
            tail = "\n".join(errors.read().strip().splitlines()[-15:])
            raise RuntimeError(f"the Flink job failed (exit {code}) after "
                               f"{len(records)} queries:\n{tail}")
    return records
