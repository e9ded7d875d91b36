"""Shared fixtures. Tests use real DuckDB files in a temporary directory."""

from __future__ import annotations

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
