"""``sstore.base.sql.one_value``: the value of a query that always answers one row, from DuckDB's
and PostgreSQL's ``fetchone()`` alike (both drivers type it as optional: the helper turns a missing
row into a named broken invariant instead of ``None[0]``'s TypeError)."""

from __future__ import annotations

import duckdb
import psycopg
import pytest

from sstore.base.sql import one_value
from sstore.dataflow.graph import ErrorPolicy


def test_one_value_of_duckdb_and_postgresql(pg_url: str) -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS x FROM range(5)")
    assert one_value(con.execute("SELECT count(*) FROM t").fetchone()) == 5
    assert one_value(con.execute("SELECT max(x) FROM t WHERE x > 9").fetchone()) is None
    with psycopg.connect(pg_url) as pg:
        assert one_value(pg.execute("SELECT to_regclass('public.nope') IS NOT NULL").fetchone()) \
            is False
        assert one_value(pg.execute("SELECT %s::int + 1", (41,)).fetchone()) == 42


def test_one_value_names_a_missing_row() -> None:
    con = duckdb.connect()
    with pytest.raises(LookupError, match="answered none"):
        one_value(con.execute("SELECT 1 WHERE false").fetchone())


def test_error_policy_prints_as_its_value() -> None:
    """A StrEnum (ruff UP042): messages and tables that format a policy show its value, as
    ``on_error`` is spelled when declared."""
    assert f"{ErrorPolicy.DEAD_LETTER}" == str(ErrorPolicy.DEAD_LETTER) == "dead_letter"
    assert ErrorPolicy("halt") is ErrorPolicy.HALT and ErrorPolicy.HALT == "halt"
