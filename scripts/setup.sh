#!/usr/bin/env bash
# Create .venv and install sstore with what the given extras need. Sourced by demo.sh and test.sh.
# Usage: scripts/setup.sh [EXTRAS]   (default: test,bench)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-test,bench}"
venv="${SSTORE_VENV:-$root/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
stamp="$venv/.sstore-installed-$extras"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  "$venv/bin/pip" install -q --upgrade pip >/dev/null
  "$venv/bin/pip" install -q -e "$root[$extras]"
  touch "$stamp"
fi
