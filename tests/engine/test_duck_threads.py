"""SSTORE_DUCKDB_THREADS: DuckDB's worker threads for every connection sstore opens, the
engine's included; unset leaves DuckDB's default; a bad value is refused, not guessed."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from sstore import Engine
from sstore.base.duck import THREADS_VARIABLE, connect


def _threads(con: duckdb.DuckDBPyConnection) -> int:
    return int(con.execute("SELECT current_setting('threads')").fetchall()[0][0])


def test_the_engine_runs_on_the_threads_asked_for(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THREADS_VARIABLE, "1")
    engine = Engine(str(tmp_path / "state.duckdb"))
    try:
        assert int(engine.query("SELECT current_setting('threads') AS t").column("t")[0]
                   .as_py()) == 1
    finally:
        engine.close()


def test_unset_or_empty_keeps_duckdbs_default(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    default = _threads(duckdb.connect(":memory:"))
    monkeypatch.delenv(THREADS_VARIABLE, raising=False)
    assert _threads(connect(str(tmp_path / "a.duckdb"))) == default
    monkeypatch.setenv(THREADS_VARIABLE, " ")
    assert _threads(connect(str(tmp_path / "b.duckdb"))) == default


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_value_that_is_not_a_thread_count_is_refused(value: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THREADS_VARIABLE, value)
    with pytest.raises(ValueError, match=THREADS_VARIABLE):
        connect(str(tmp_path / "c.duckdb"))
