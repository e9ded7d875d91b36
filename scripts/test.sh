#!/usr/bin/env bash
# The test command: installs what the suite needs (Debian packages: scripts/system.sh; .venv:
# scripts/setup.sh), then runs the whole suite. Tests of external data (real DIGen output, at
# $SSTORE_DIGEN_DIR) that is absent do not run and are listed loudly at the end of the run;
# with SSTORE_REQUIRE_EXTERNAL_DATA=1 (CI) they fail instead.
# PostgreSQL: $SSTORE_POSTGRES_URL, else the server at the default address, else a private one
# that the test session starts under .sstore/postgres and stops at its end (tests/conftest.py).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/system.sh
bash scripts/setup.sh test,bench,spark,airflow
bash scripts/jdbc.sh
bash scripts/jemalloc.sh
venv="${SSTORE_VENV:-$root/.venv}"
# Lint and types first, as configured in pyproject.toml (ruff: the whole tree; mypy: strict on
# sstore/ and migrators/, its cache in .mypy_cache): either failing fails the run before a test
# starts. Seconds with warm caches; the first mypy run of a checkout takes about a minute.
"$venv/bin/ruff" check .
"$venv/bin/mypy"
# Two workers (pytest-xdist; SSTORE_TEST_WORKERS to change, 0 for one process): most tests
# wait on PostgreSQL, a JVM or a child process, so two share this machine's two cores well
# (measured: 21.6 min in one process, 12.7-13.7 in two). Arguments given here come later and win.
exec "$venv/bin/python" -m pytest -n "${SSTORE_TEST_WORKERS:-2}" --dist worksteal "$@"
