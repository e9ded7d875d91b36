#!/usr/bin/env bash
# The demo command: sets up .venv and runs the voter workload with a progress bar.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh test,bench
exec "${SSTORE_VENV:-$root/.venv}/bin/sstore" demo "$@"
