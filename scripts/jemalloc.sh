#!/usr/bin/env bash
# The sstore command and the benchmarks run under jemalloc where the machine has it
# (sstore/base/allocator.py: glibc's malloc slows a long run down as its heap fragments).
# Installs Debian's libjemalloc2 when sstore.base.allocator finds no libjemalloc.so.2 (run after
# scripts/setup.sh); without root or apt-get it says how and goes on (sstore then uses the C
# library's malloc).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${SSTORE_VENV:-$root/.venv}/bin/python"
"$python" -c "import sys; from sstore.base.allocator import jemalloc_library as j; sys.exit(j() is None)" \
  && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing jemalloc (libjemalloc2)" >&2
  apt-get update -q >/dev/null && apt-get install -y -q libjemalloc2 >/dev/null
  exit 0
fi
echo "No libjemalloc.so.2: install libjemalloc2 (or set SSTORE_JEMALLOC); sstore runs on the C library's malloc meanwhile." >&2
