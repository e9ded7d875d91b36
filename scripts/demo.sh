#!/usr/bin/env bash
# The demo command: sets up .venv, Java's PostgreSQL driver and a PostgreSQL (the local server,
# else a private one left running: `sstore postgres stop` stops it), then runs a whole
# TPC-DI DimTrade run (streaming), two cross-island queries and the audit (sstore tpcdi demo).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if ! command -v java >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  apt-get update -q >/dev/null && apt-get install -y -q openjdk-17-jre-headless >/dev/null
fi
bash scripts/setup.sh test,bench,spark,airflow
bash scripts/jdbc.sh
bash scripts/jemalloc.sh
SSTORE_POSTGRES_URL="$(bash scripts/postgres.sh)"  # the local server, else a private one
export SSTORE_POSTGRES_URL
exec "${SSTORE_VENV:-$root/.venv}/bin/sstore" tpcdi demo "$@"
