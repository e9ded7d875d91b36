"""Every environment variable sstore reads, in one table: ``sstore --help`` prints it and the
README's "Configuration" table must list the same names (tests/cli/test_cli_commands.py checks
both, and that no module reads a variable missing here)."""

from __future__ import annotations

import textwrap
from typing import NamedTuple

EPILOG_WIDTH = 100


class Variable(NamedTuple):
    name: str
    meaning: str
    default: str


VARIABLES = (
    Variable("SSTORE_POSTGRES_URL",
             "the warehouse of every command, the tests and the scripts; used as it is "
             "(never probed or replaced)",
             "none: SSTORE_DEFAULT_POSTGRES_URL if a server answers there, else a private "
             "PostgreSQL (`sstore postgres --help`)"),
    Variable("SSTORE_DEFAULT_POSTGRES_URL",
             "where to look for a server when SSTORE_POSTGRES_URL is unset (tests point it at "
             "a closed port to get the private server)",
             "`postgresql://postgres@127.0.0.1:5432/postgres`"),
    Variable("SSTORE_PG_CONNECT_TIMEOUT",
             "seconds a PostgreSQL connection (psycopg or ADBC; not Spark's JDBC) waits for "
             "the server to answer, per attempt, when the URL has no `connect_timeout` of its "
             "own; whole seconds from 1 (psycopg waits at least 2)", "`5`"),
    Variable("SSTORE_POSTGRES_READER_ROLE", "the PostgreSQL role every read path (`sstore "
             "query`, the polystore, casts into the engine) runs as: it must not be able to "
             "write; sstore creates `sstore_reader` (member of pg_read_all_data) when it may, "
             "never a role named here", "`sstore_reader`"),
    Variable("SSTORE_HOME", "the project's own directory: the private PostgreSQL's data is "
             "in `$SSTORE_HOME/postgres`", "`.sstore` in the current directory"),
    Variable("SSTORE_SERVE_TOKEN", "the bearer token of the status server (`--serve`): "
             "required (16+ characters) for any `--serve-host` but loopback, which refuses to "
             "start without it; clients send `Authorization: Bearer <token>`, `sstore status` "
             "sends it from its environment (docs/operations.md, Security)",
             "unset: loopback only, no token"),
    Variable("SSTORE_SERVE_NAMES", "more names (comma-separated) the status server answers "
             "in the `Host` header, besides its bind address and, on loopback, "
             "`localhost`/`127.0.0.1`/`[::1]`", "none"),
    Variable("SSTORE_CATALOG", "the polystore catalog of `sstore query` and "
             "`sstore polystore`", "`sstore-catalog.json`"),
    Variable("SSTORE_COSTS", "the cost model's calibrated constants "
             "(`sstore polystore calibrate`); what queries measured since is kept beside "
             "them (`costs.learned.json`)", "`costs.json` beside the catalog"),
    Variable("SSTORE_TPCDI_DIR", "the TPC-DI data directory of the Airflow DAGs",
             "`/tmp/sstore/tpcdi`"),
    Variable("SSTORE_SPARK_MASTER", "the Spark master: bulk work, and `tpcdi run --mode "
             "spark-streaming` (docs/scaling.md)",
             "`local[*]`; `local[2]` for `--mode spark-streaming`"),
    Variable("SSTORE_JDBC_JAR", "the PostgreSQL JDBC driver for Spark",
             "`/usr/share/java/postgresql.jar` (Debian `libpostgresql-jdbc-java`)"),
    Variable("SSTORE_MALLOC", "the allocator of the `sstore` command and the benchmarks: "
             "`auto` (jemalloc when found, else the C library's), `jemalloc` (an error when "
             "missing), `system` (the C library's; its heap fragments over a long run, "
             "docs/operations.md)", "`auto`"),
    Variable("SSTORE_JEMALLOC", "the jemalloc library `SSTORE_MALLOC` preloads",
             "`libjemalloc.so.2` in the usual library directories (Debian `libjemalloc2`)"),
    Variable("LD_PRELOAD", "libraries the loader preloads: the `sstore` command adds "
             "jemalloc for its own process and gives its children the value it was started "
             "with", "unset"),
    Variable("SSTORE_DUCKDB_THREADS", "DuckDB's worker threads for every connection sstore "
             "opens (a whole number >= 1); one spends less CPU on small batches and gives up "
             "the parallelism of large ones (docs/tpcdi.md, issue 37)",
             "unset: DuckDB's default, one per core"),
    Variable("SSTORE_VENV", "where the scripts put the virtual environment", "`.venv`"),
    Variable("SSTORE_TEST_WORKERS", "pytest-xdist workers of `scripts/test.sh` (0: one "
             "process)", "`2`"),
    Variable("SSTORE_DIGEN_DIR", "test-only: real DIGen SF 3 output that "
             "`tests/workloads/tpcdi/test_tpcdi_digen.py` reads in place",
             "unset: those tests do not run, and the run says so"),
    Variable("SSTORE_REQUIRE_EXTERNAL_DATA", "test-only: `1` makes absent external data "
             "(`SSTORE_DIGEN_DIR`) a failure, not a banner (`.ci/run` sets it)", "unset"),
    Variable("SSTORE_CRASH_AT", "test-only: `point:n` kills the process the n-th time it "
             "reaches a commit-protocol step", "unset"),
    Variable("SSTORE_CRASH_SIGNAL", "test-only: the signal `SSTORE_CRASH_AT` sends "
             "(`KILL`, `TERM`, `INT`); TERM and INT ask for a clean stop at that step",
             "`KILL`"),
    Variable("JAVA_HOME", "the Java that Spark runs on", "`java` on the PATH"),
    Variable("SPARK_LOCAL_IP", "the address Spark's driver binds", "`127.0.0.1` (set when unset)"),
)


def epilog() -> str:
    """The table for ``sstore --help`` (click keeps ``\\b`` paragraphs as written)."""
    width = max(len(v.name) for v in VARIABLES)
    lines = ["\b", "Environment variables (also in README.md, \"Configuration\"):"]
    for v in VARIABLES:
        text = f"{v.meaning}; default: {v.default}".replace("`", "")
        for i, part in enumerate(textwrap.wrap(text, EPILOG_WIDTH - width - 6)):
            lines.append(f"  {v.name if i == 0 else '':<{width}}  {part}")  # click adds 2
    return "\n".join(lines)
