"""``sstore.execution.passing.Passing.reads``: which held-back streams a statement may read from
their tables, on a real DuckDB catalog. A wrong "no" loses rows silently (a procedure reads an
empty batch); a wrong "yes" only stores a batch, so every doubt must answer "yes"."""

from __future__ import annotations

import duckdb
import pytest

from sstore.execution import passing
from sstore.execution.passing import Passing

STREAMS = ("orders", "ids")


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE orders (_batch_id BIGINT, id INTEGER)")
    con.execute("CREATE TABLE ids (_batch_id BIGINT, id INTEGER)")
    con.execute("CREATE TABLE users (id INTEGER)")
    return con


@pytest.mark.parametrize(("sql", "read"), [
    ("SELECT id FROM batch", set()),
    ("SELECT b.id, u.id FROM batch b JOIN users u ON u.id = b.id", set()),
    ("SELECT count(*), sum(id) FROM batch WHERE id > 0", set()),
    ("SELECT o.* FROM batch b JOIN orders o ON o._batch_id = ?", {"orders"}),
    ('SELECT * FROM "Orders"', {"orders"}),
    ("SELECT * FROM main.ids", {"ids"}),
    ("SELECT * FROM query_table('orders')", {"orders"}),
    ("SELECT * FROM query('SELECT * FROM ids')", {"ids"}),
    ("WITH x AS (SELECT * FROM orders) SELECT * FROM x JOIN ids USING (id)", {"orders", "ids"}),
])
def test_a_statement_reads_the_streams_it_names(con, sql: str, read: set[str]) -> None:
    assert Passing().reads(con, sql, STREAMS) == read


def test_a_view_is_read_through_and_read_again_after_it_changes(con) -> None:
    found = Passing()
    con.execute("CREATE VIEW recent AS SELECT * FROM users")
    assert found.reads(con, "SELECT * FROM recent", STREAMS) == set()
    statement = "CREATE OR REPLACE VIEW recent AS SELECT * FROM orders"
    con.execute(statement)
    passing.note(statement)  # what the engine does for each statement it runs
    assert found.reads(con, "SELECT * FROM recent", STREAMS) == {"orders"}
    con.execute("CREATE VIEW deeper AS SELECT * FROM recent")
    passing.note("CREATE VIEW deeper AS SELECT * FROM recent")
    assert found.reads(con, "SELECT * FROM deeper", STREAMS) == {"orders"}


def test_a_macro_may_read_anything(con) -> None:
    con.execute("CREATE MACRO everything() AS TABLE SELECT * FROM orders")
    assert Passing().reads(con, "SELECT * FROM everything()", STREAMS) == set(STREAMS)


def test_a_column_named_like_a_stream_is_not_its_table(con) -> None:
    """``p.votes`` is a column of alias ``p``; ``main.ids`` is the table ``ids``."""
    sql = "SELECT p.orders, x.ids FROM batch p JOIN users x ON x.id = p.id"
    assert Passing().reads(con, sql, STREAMS) == set()
    assert Passing().reads(con, 'SELECT * FROM memory.main.orders, "main"."ids"', STREAMS) \
        == {"orders", "ids"}
