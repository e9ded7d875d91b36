"""Statements parsed once (``sstore.base.duck.parsed``): the same text gives the same answers as
parsing it every time, over whatever data is registered at each run, with bound parameters, on
any connection and thread; scripts and syntax errors behave as with the text; the cache stays
bounded."""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from sstore.base import duck
from sstore.base.duck import arrow, connect, execute, parsed


@pytest.fixture
def con(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    c = connect(str(tmp_path / "state.duckdb"))
    c.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
    return c


def test_one_parse_serves_every_run_over_the_data_registered_then(
        con: duckdb.DuckDBPyConnection) -> None:
    insert = "INSERT INTO t SELECT ?, * FROM new_rows"
    for batch in (1, 2, 3):
        con.register("new_rows", pa.table({"b": [f"x{batch}", f"y{batch}"]}))
        execute(con, insert, [batch])
    assert parsed(con, insert) is parsed(con, insert)  # parsed once, kept
    query = "SELECT a, count(*) AS n FROM t WHERE a >= ? GROUP BY a ORDER BY a"
    assert arrow(con, query, [2]).to_pylist() == [{"a": 2, "n": 2}, {"a": 3, "n": 2}]
    con.execute("DELETE FROM t WHERE a = 3")  # the same parsed statement sees the change
    assert arrow(con, query, [2]).to_pylist() == [{"a": 2, "n": 2}]
    named = "SELECT $x + 1 AS y"
    assert arrow(con, named, {"x": 41}).to_pylist() == [{"y": 42}]


def test_a_parsed_statement_serves_other_connections_and_threads(
        con: duckdb.DuckDBPyConnection) -> None:
    con.execute("INSERT INTO t SELECT range, 'v' FROM range(100)")
    query = "SELECT count(*) FROM t WHERE a < ?"
    wrong: list[object] = []

    def reader(limit: int) -> None:
        cursor = con.cursor()
        for _ in range(100):
            got = execute(cursor, query, [limit]).fetchall()
            if got != [(limit,)]:
                wrong.append(got)

    threads = [threading.Thread(target=reader, args=(n,)) for n in (10, 20, 30, 40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_scripts_and_errors_behave_as_with_the_text(con: duckdb.DuckDBPyConnection) -> None:
    script = "INSERT INTO t VALUES (1, 'a'); INSERT INTO t VALUES (2, 'b')"
    assert parsed(con, script) == script  # several statements: run as the text
    execute(con, script)
    assert con.execute("SELECT count(*) FROM t").fetchall() == [(2,)]
    with pytest.raises(duckdb.ParserException):
        execute(con, "SELEC 1")
    with pytest.raises(duckdb.CatalogException, match="no_such_table"):
        arrow(con, "SELECT * FROM no_such_table")


def test_the_cache_stays_bounded(con: duckdb.DuckDBPyConnection,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(duck, "PARSED_LIMIT", 8)
    monkeypatch.setattr(duck, "_parsed", {})
    for n in range(50):
        assert execute(con, f"SELECT {n} AS n").fetchall() == [(n,)]
    assert len(duck._parsed) == 8
    assert "SELECT 49 AS n" in duck._parsed and "SELECT 0 AS n" not in duck._parsed
