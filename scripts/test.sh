#!/usr/bin/env bash
# The test command: sets up .venv, makes sure PostgreSQL answers, runs the whole suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh test,bench,spark,airflow
bash scripts/jdbc.sh
bash scripts/postgres.sh
exec "${SSTORE_VENV:-$root/.venv}/bin/python" -m pytest "$@"
