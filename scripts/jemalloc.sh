#!/usr/bin/env bash
# The sstore command and the benchmarks run under jemalloc where the machine has it
# (sstore/allocator.py: glibc's malloc slows a long run down as its heap fragments).
# Installs Debian's libjemalloc2 when no libjemalloc.so.2 is found; without root or apt-get it
# says how and goes on (sstore then uses the C library's malloc).
set -euo pipefail
for lib in "${SSTORE_JEMALLOC:-}" /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 \
           /usr/lib/aarch64-linux-gnu/libjemalloc.so.2 /usr/lib64/libjemalloc.so.2; do
  [ -n "$lib" ] && [ -f "$lib" ] && exit 0
done
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing jemalloc (libjemalloc2)" >&2
  apt-get update -q >/dev/null && apt-get install -y -q libjemalloc2 >/dev/null
  exit 0
fi
echo "No libjemalloc.so.2: install libjemalloc2 (or set SSTORE_JEMALLOC); sstore runs on the C library's malloc meanwhile." >&2
