"""The process allocator (``sstore.base.allocator``): the ``sstore`` command and the benchmarks run
under jemalloc where the machine has it, what they start does not inherit the preload, and a
policy that cannot be met is a one-line error before any work, never a silent fallback.

Real processes: the re-execution is an ``execve``, so each case runs a fresh interpreter and
reads ``/proc/self/maps`` inside it. CI installs Debian's ``libjemalloc2`` (``.ci/run``,
``scripts/jemalloc.sh``); without it the first test fails and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sstore.base import allocator

ROOT = Path(__file__).resolve().parents[2]
SSTORE = Path(sys.executable).parent / "sstore"

# Prints a line when it starts (twice when the process re-executes itself), then what the
# process and a child of it see, and what it reads on stdin (a pipe survives the execve).
PROBE = """
import json, os, subprocess, sys
print("started", flush=True)
from sstore.base.allocator import use_jemalloc, in_use
use_jemalloc()
child = subprocess.run(["sh", "-c", 'printf "%s" "${LD_PRELOAD-unset}"'],
                       capture_output=True, text=True).stdout
print(json.dumps({"in_use": in_use(), "preload": os.environ.get("LD_PRELOAD"),
                  "child_preload": child, "stdin": sys.stdin.read()}))
"""


PIPED = "trade 1\ntrade 2\n"


def probe(**env: str) -> tuple[int, dict[str, object], str]:
    """Run PROBE with ``env`` over a clean allocator environment: (starts, report, stderr)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("LD_PRELOAD", allocator.MODE_VARIABLE, allocator.LIBRARY_VARIABLE,
                         allocator.REEXEC_MARKER)}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env={**base, **env}, cwd=ROOT, timeout=60, input=PIPED)
    lines = done.stdout.splitlines()
    report = json.loads(lines[-1]) if done.returncode == 0 else {}
    return lines.count("started"), report, done.stderr


def test_this_machine_has_jemalloc() -> None:
    """The rest of this file and the benchmarks' numbers assume it: fail loudly, not skip."""
    assert allocator.jemalloc_library() is not None, (
        "no libjemalloc.so.2: apt-get install libjemalloc2 (scripts/jemalloc.sh)")


def test_use_jemalloc_re_executes_once_and_children_inherit_nothing() -> None:
    starts, report, _ = probe()
    assert starts == 2  # the first image, then the re-executed one
    assert report["in_use"] == "jemalloc"
    assert report["preload"] is None and report["child_preload"] == "unset"
    assert report["stdin"] == PIPED  # nothing read before the execve, nothing lost


def test_a_users_own_preload_is_kept_and_given_back_to_children() -> None:
    starts, report, _ = probe(LD_PRELOAD="libm.so.6")
    assert starts == 2 and report["in_use"] == "jemalloc"
    assert report["preload"] == "libm.so.6" and report["child_preload"] == "libm.so.6"


def test_system_means_no_re_execution() -> None:
    starts, report, _ = probe(SSTORE_MALLOC="system")
    assert starts == 1 and report["in_use"] == "system" and report["child_preload"] == "unset"


def test_auto_without_the_library_runs_on_and_jemalloc_without_it_is_an_error() -> None:
    starts, report, _ = probe(SSTORE_JEMALLOC="/nonexistent/libjemalloc.so.2")
    assert starts == 1 and report["in_use"] == "system"
    starts, report, err = probe(SSTORE_MALLOC="jemalloc",
                                SSTORE_JEMALLOC="/nonexistent/libjemalloc.so.2")
    assert starts == 1 and report == {} and "AllocatorError" in err and "libjemalloc2" in err


def test_a_preload_that_did_not_take_is_not_retried_forever() -> None:
    """The marker says the process was already re-executed: it is never re-executed again;
    with ``jemalloc`` required that is an error, with ``auto`` it runs on the C library's."""
    marker = {allocator.REEXEC_MARKER: ""}
    starts, report, _ = probe(**marker)
    assert starts == 1 and report["in_use"] == "system" and report["preload"] is None
    starts, report, err = probe(SSTORE_MALLOC="jemalloc", **marker)
    assert starts == 1 and "loader ignored LD_PRELOAD" in err


def test_the_sstore_command_reports_its_allocator_and_rejects_a_bad_policy() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    for command in ([str(SSTORE)], [sys.executable, "-m", "sstore.cli"]):
        done = subprocess.run([*command, "--version"], capture_output=True, text=True, env=env,
                              timeout=60)
        assert done.returncode == 0 and "malloc: jemalloc" in done.stdout, done
    done = subprocess.run([str(SSTORE), "--version"], capture_output=True, text=True,
                          env={**env, "SSTORE_MALLOC": "system"}, timeout=60)
    assert "malloc: system" in done.stdout
    # auto without the library: the command runs on the C library's and says why under -v
    missing = {**env, "SSTORE_JEMALLOC": "/nonexistent/libjemalloc.so.2"}
    done = subprocess.run([str(SSTORE), "-v", "status", "--help"], capture_output=True,
                          text=True, env=missing, timeout=60)
    assert done.returncode == 0 and "INFO sstore.base.allocator: jemalloc not found" in done.stderr
    for bad in ({"SSTORE_MALLOC": "tcmalloc"},
                {"SSTORE_MALLOC": "jemalloc", "SSTORE_JEMALLOC": "/nonexistent/lib.so"}):
        done = subprocess.run([str(SSTORE), "--version"], capture_output=True, text=True,
                              env={**env, **bad}, timeout=60)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith("Error: SSTORE_MALLOC") and "\n" == done.stderr[-1:]
        assert len(done.stderr.splitlines()) == 1


def test_a_benchmark_run_as_a_program_records_jemalloc(tmp_path: Path) -> None:
    """``python -m benchmarks.NAME`` runs under jemalloc, and its results say so."""
    code = ("import runpy, sys; sys.argv = ['-m']; import benchmarks; "
            "from benchmarks.common import machine_info; print(machine_info()['malloc'])")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=60)
    assert done.stdout.splitlines()[-1] == "jemalloc", done


def test_importing_sstore_and_its_command_loads_nothing_heavy() -> None:
    """The allocator is chosen before DuckDB and Arrow are loaded; a re-execution that came
    after them would pay their import twice on every command."""
    code = ("import sys, sstore, sstore.cli, sstore.base.allocator; "
            "print(sorted(m for m in ('duckdb', 'pyarrow', 'click') if m in sys.modules)); "
            "from sstore import Engine, SStoreError; "
            "print(Engine.__module__, 'duckdb' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)
    assert done.stdout.splitlines() == ["[]", "sstore.engine True"]
