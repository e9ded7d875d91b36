"""Shared fixtures. Tests use real DuckDB files in a temporary directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sstore import Engine


@pytest.fixture
def state_path(tmp_path: Path) -> str:
    return str(tmp_path / "state.duckdb")


@pytest.fixture
def engine(state_path: str):
    eng = Engine(state_path)
    yield eng
    eng.close()


# -- PostgreSQL: the server that runs on this machine (or SSTORE_POSTGRES_URL), and a fresh,
# empty database for each test that asks for ``pg_url``.
from pytest_postgresql import factories  # noqa: E402

from migrators.urls import default_url, parse  # noqa: E402

_server = parse(default_url())
postgresql_server = factories.postgresql_noproc(
    host=_server.host, port=_server.port, user=_server.user or "postgres",
    password=_server.password,
    # per process, so that two test runs on one server (a developer's and CI's) do not collide
    dbname=f"sstore_test_{os.getpid()}")
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

    session = get_spark("local[2]")
    yield session
    stop_spark()
