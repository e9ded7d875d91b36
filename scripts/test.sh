#!/usr/bin/env bash
# The test command: sets up .venv and Java's PostgreSQL driver, runs the whole suite.
# PostgreSQL: $SSTORE_POSTGRES_URL, else the server at the default address, else a private one
# that the test session starts under .sstore/postgres and stops at its end (tests/conftest.py).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh test,bench,spark,airflow
bash scripts/jdbc.sh
bash scripts/jemalloc.sh
# Two workers (pytest-xdist; SSTORE_TEST_WORKERS to change, 0 for one process): most tests
# wait on PostgreSQL, a JVM or a child process, so two share this machine's two cores well
# (measured: 21.6 min in one process, 12.7-13.7 in two). Arguments given here come later and win.
exec "${SSTORE_VENV:-$root/.venv}/bin/python" -m pytest -n "${SSTORE_TEST_WORKERS:-2}" \
  --dist worksteal "$@"
