#!/usr/bin/env bash
# Spark reaches PostgreSQL through the JDBC driver from Debian's libpostgresql-jdbc-java.
# Installs it when neither $SSTORE_JDBC_JAR nor /usr/share/java/postgresql.jar exists.
set -euo pipefail
jar="${SSTORE_JDBC_JAR:-/usr/share/java/postgresql.jar}"
[ -f "$jar" ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing the PostgreSQL JDBC driver (libpostgresql-jdbc-java)" >&2
  apt-get update -q >/dev/null && apt-get install -y -q libpostgresql-jdbc-java >/dev/null
  exit 0
fi
echo "No PostgreSQL JDBC jar at $jar: install libpostgresql-jdbc-java or set SSTORE_JDBC_JAR." >&2
exit 1
