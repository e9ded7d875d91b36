"""PostgreSQL's meaning across engines (issue 35): the declared translations and what is kept
in PostgreSQL (``sstore.polystore.meaning``), the session time zone a query runs in outside
PostgreSQL, a state file's parallel reads, and ``sstore query --format json`` with repeated
column names. Each case was found by the differential test (``benchmarks.polystore_fuzz``,
the seed named) or named in the issue."""

from __future__ import annotations

import json
import threading

import duckdb
import pytest
from click.testing import CliRunner

from sstore import Engine
from sstore.cli.app import main
from sstore.cli.format import unique_names
from sstore.polystore.meaning import kept_in_postgres, kept_types, naming_kept_columns
from sstore.polystore.sqltext import parse, to_sql
from sstore.storage.statefile import StateFileReader

#: (PostgreSQL SQL, dialect, what is kept in PostgreSQL: the start of each reason)
KEPT = [
    ("SELECT id / 2 FROM t", "duckdb", ["integer division"]),           # fuzz seed 1
    ("SELECT 7 / 2", "spark", ["integer division"]),
    ("SELECT amt / 3.0, CAST(k AS numeric) / 4 FROM t", "duckdb", []),   # surely not integers
    ("SELECT * FROM a NATURAL JOIN b", "duckdb", ["NATURAL JOIN"]),      # fuzz seeds 1-3
    ("SELECT * FROM a JOIN b USING (k)", "duckdb", ["SELECT * over JOIN ... USING"]),
    ("SELECT k, a.x FROM a JOIN b USING (k)", "duckdb", []),
    ("SELECT to_hex(id) FROM t", "duckdb", ["function to_hex"]),         # fuzz seed 2
    ("SELECT date_trunc('month', d) FROM t", "duckdb", ["function date_trunc"]),
    ("SELECT initcap(name) FROM t", "duckdb", ["function initcap"]),
    ("SELECT every(f), octet_length(n), make_date(2024, 2, 29) FROM t", "duckdb", []),
    ("SELECT d + interval '1 day' FROM t", "spark", ["interval arithmetic"]),
    ("SELECT d - e FROM t", "spark", ["a difference of two values"]),
    ("SELECT CAST(amt AS integer) FROM t", "spark", ["a cast to an integer type"]),
    ("SELECT CAST(amt AS integer) FROM t", "duckdb", []),
    ("SELECT round(a) FROM t", "spark", ["round"]),
    ("SELECT x.a FROM t AS x(a)", "spark", ["an alias list"]),        # fuzz seed 1, Spark
    ("SELECT x.a FROM t AS x(a)", "duckdb", []),
    ("SELECT CAST(ts AS text), d::varchar FROM t", "spark", ["a cast to text"]),  # seed 2
    ("SELECT CAST(ts AS text) FROM t", "duckdb", []),
    # Spark, fuzz seed 3: COALESCE(k, '') of an integer; concat('a', true) is 'at' in PostgreSQL
    ("SELECT concat(name, k) FROM t", "duckdb", ["function concat"]),
    ("SELECT name || 'x' FROM t", "spark", []),
    ("SELECT 1 FROM t WHERE EXISTS (SELECT 1 FROM u)", "duckdb", []),
    ("SELECT k FROM t WHERE a IS NULL AND b = 2 OR NOT c", "duckdb", []),
    ("SELECT id / 2 FROM t", "postgres", []),
]


@pytest.mark.parametrize(("sql", "dialect", "reasons"), KEPT)
def test_what_is_kept_in_postgresql(sql: str, dialect: str, reasons: list[str]) -> None:
    found = kept_in_postgres(parse(sql), dialect)
    assert len(found) == len(reasons), found
    assert all(f.startswith(r) for f, r in zip(found, reasons)), found


#: (PostgreSQL SQL, dialect, the SQL that engine runs)
TRANSLATED = [
    # fuzz seed 1: PostgreSQL's LIKE escapes with a backslash, DuckDB's with nothing
    ("SELECT 1 FROM t WHERE n LIKE 'a\\_b'", "duckdb",
     "SELECT 1 FROM t WHERE n LIKE 'a\\_b' ESCAPE '\\'"),
    ("SELECT 1 FROM t WHERE n ILIKE 'a%' ESCAPE '!'", "duckdb",
     "SELECT 1 FROM t WHERE n ILIKE 'a%' ESCAPE '!'"),
    ("SELECT every(f) FROM t", "duckdb", "SELECT BOOL_AND(CAST(f AS BOOLEAN)) FROM t"),
    ("SELECT octet_length(n) FROM t", "duckdb", "SELECT STRLEN(n) FROM t"),
    # sqlglot reads to_hex as HEX and printed it back so: PostgreSQL has no hex()
    ("SELECT to_hex(id) FROM t", "postgres", "SELECT TO_HEX(id) FROM t"),
]


@pytest.mark.parametrize(("sql", "dialect", "expected"), TRANSLATED)
def test_declared_translations(sql: str, dialect: str, expected: str) -> None:
    tree = parse(sql)
    before = tree.sql()
    assert to_sql(tree, dialect) == expected
    assert tree.sql() == before  # pure: the shared tree is not changed


def test_char_n_columns_are_kept_in_postgresql_when_a_query_names_them() -> None:
    """Fuzz seed 1: PostgreSQL ignores a char(n)'s padding (``code = 'ab'`` is true for
    'ab '), DuckDB does not."""
    kept = kept_types({("pg", "public.dim"): {"k": "integer", "code": "character(3)"}})
    assert list(kept) == ["code"]
    assert naming_kept_columns(parse("SELECT q.code = 'ab' FROM dim AS q"), kept)
    assert naming_kept_columns(parse("SELECT * FROM dim"), kept)
    assert not naming_kept_columns(parse("SELECT k, count(*) FROM dim GROUP BY k"), kept)


def test_engine_query_runs_in_the_time_zone_asked_for_this_query_only(engine: Engine) -> None:
    """Fuzz seed 2 (PostgreSQL's zone Asia/Kolkata): extract(hour from ts) in the engine's
    DuckDB answered in UTC."""
    sql = "SELECT extract(hour from TIMESTAMPTZ '2024-01-01 00:00:00+00') AS h"
    assert engine.query(sql, time_zone="Asia/Kolkata").to_pylist() == [{"h": 5}]
    assert engine.query(sql).to_pylist() == [{"h": 0}]
    with pytest.raises(duckdb.Error):
        engine.query("SELECT 1 / 'x'::INTEGER AS broken", time_zone="Asia/Kolkata")
    assert engine.query(sql).to_pylist() == [{"h": 0}]  # reset after a failure too


def test_a_state_files_parallel_reads_do_not_share_a_connection(state_path: str) -> None:
    """Issue 35: a plan's two fetches of one state file ran on its one connection in two
    threads and failed at random ("connection is busy")."""
    Engine(state_path).close()
    reader = StateFileReader(state_path)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for _ in range(60):
                n = reader.query("SELECT count(*) AS n FROM range(20000) a, range(5) b")
                assert n.to_pylist() == [{"n": 100000}]
        except BaseException as exc:  # noqa: BLE001 - collected, the test fails on it
            errors.append(exc)
    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reader.close()
    assert errors == []


def test_json_output_keeps_every_column_of_repeated_names(state_path: str) -> None:
    """Issue 35: ``SELECT a.id, b.id`` printed one ``id`` per row with --format json."""
    Engine(state_path).close()
    result = CliRunner().invoke(main, ["query", state_path,
                                       "SELECT 1 AS id, 2 AS id, 3 AS id_1, 4 AS id",
                                       "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [{"id": 1, "id_2": 2, "id_1": 3, "id_3": 4}]
    assert unique_names(["a", "a", "a"]) == ["a", "a_1", "a_2"]


def test_a_query_without_tables_runs_in_postgresql_when_only_it_keeps_the_meaning(
        tmp_path, pg_url: str) -> None:
    """Issue 35: ``SELECT 7 / 2`` answered 3.5 (the island's DuckDB); PostgreSQL says 3.
    Without a PostgreSQL engine in the catalog it is refused with the reason."""
    from sstore.polystore import Polystore
    from sstore.polystore.cost import CostModel
    from sstore.polystore.sqltext import QueryError

    alone = Polystore(str(tmp_path / "alone.json"), costs=CostModel())
    assert alone.query("SELECT 1 + 1 AS two").to_pylist() == [{"two": 2}]
    with pytest.raises(QueryError, match="integer division"):
        alone.query("SELECT 7 / 2 AS x")
    alone.close()
    with Polystore(str(tmp_path / "catalog.json"), costs=CostModel()) as ps:
        ps.add_postgres("pg", pg_url)
        assert ps.query("SELECT 7 / 2 AS x").to_pylist() == [{"x": 3}]
        assert [p.name for p in ps.plans("SELECT 7 / 2 AS x")] == ["in pg"]
        assert [p.name for p in ps.plans("SELECT 1 AS x")] == ["island"]
