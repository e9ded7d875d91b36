"""What every benchmark shares: percentiles, machine facts, writing results."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from sstore.base import allocator
from sstore.base.extras import MissingExtraError, require

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def require_extras(*extras: str) -> None:
    """Exit at once with the one-line hint (``Error: this needs ...``, status 1) when an extra
    the benchmark needs is not installed: before the run, not when it plots at the end."""
    try:
        for extra in extras:
            require(extra)
    except MissingExtraError as exc:
        raise SystemExit(f"Error: {exc}") from None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: with 400 samples p99 is the 4th worst, not an interpolation."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def machine_info() -> dict[str, Any]:
    """What the numbers depend on: CPU, memory, library versions, the commit measured."""
    info: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(), "python": platform.python_version(),
        "cpus": os.cpu_count(), "duckdb": duckdb.__version__, "pyarrow": pa.__version__,
        "tempdir": tempfile.gettempdir(), "loadavg_at_end": os.getloadavg(),
        "malloc": allocator.in_use(),
    }
    info["cpu_model"] = _first_line_value("/proc/cpuinfo", "model name")
    info["mem_total"] = _first_line_value("/proc/meminfo", "MemTotal")
    info["git_commit"] = _git("rev-parse", "HEAD")
    info["sstore_dirty"] = bool(_git("status", "--porcelain", "--", "sstore", "migrators"))
    return info


def write_results(name: str, payload: dict[str, Any] | list[Any]) -> str:
    """Write ``benchmarks/results/NAME.json``; return its path."""
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, default=str)
    return path


def fresh_database(base: str, name: str) -> str:
    """Drop and create database ``name`` on the server of ``base``; return its URL."""
    import psycopg

    from migrators.urls import with_database
    from sstore.base.sql import ident
    with psycopg.connect(base, autocommit=True) as con:
        con.execute(f"DROP DATABASE IF EXISTS {ident(name)}")
        con.execute(f"CREATE DATABASE {ident(name)}")
    return with_database(base, name)


def _first_line_value(path: str, key: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _git(*args: str) -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10,
                          check=False)
    return done.stdout.strip()
