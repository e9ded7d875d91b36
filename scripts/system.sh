#!/usr/bin/env bash
# The Debian packages the suite needs beside Python's: Java for Spark, Spark's PostgreSQL JDBC
# driver, jemalloc (sstore/base/allocator.py) and Chromium (the dashboard test drives it headless).
# Installs what is missing in one apt-get, as root or through password-less sudo; otherwise it
# lists what is missing and how to install it, and goes on (the tests that need a missing
# package then fail saying which).
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
[ -f "${SSTORE_JDBC_JAR:-/usr/share/java/postgresql.jar}" ] || need+=(libpostgresql-jdbc-java)
{ [ -n "${SSTORE_JEMALLOC:-}" ] || ldconfig -p 2>/dev/null | grep -q 'libjemalloc\.so\.2'; } \
  || need+=(libjemalloc2)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
  || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  sudo=(none)
fi
if [ "${sudo[0]:-}" != "none" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian packages: ${need[*]}" >&2
  "${sudo[@]}" apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q \
    "${need[@]}" >/dev/null
  exit 0
fi
echo "MISSING Debian packages: ${need[*]} (no root, sudo or apt-get here: install them, e.g." \
     "apt-get install ${need[*]}); the tests that need them will fail and say so" >&2
