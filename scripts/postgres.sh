#!/usr/bin/env bash
# Make sure a PostgreSQL answers at $SSTORE_POSTGRES_URL (default: postgresql://postgres@127.0.0.1:5432/postgres).
# A local Debian cluster that is down is started; anything else gets a clear message.
set -uo pipefail
url="${SSTORE_POSTGRES_URL:-postgresql://postgres@127.0.0.1:5432/postgres}"
if pg_isready -d "$url" -q 2>/dev/null; then
  exit 0
fi
if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  echo "PostgreSQL is not answering at $url; starting the local cluster" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start || true
  for _ in $(seq 1 30); do
    pg_isready -d "$url" -q 2>/dev/null && exit 0
    sleep 1
  done
fi
echo "No PostgreSQL answers at $url." >&2
echo "Start one (for example: docker compose up -d postgres) or point SSTORE_POSTGRES_URL at one." >&2
exit 1
