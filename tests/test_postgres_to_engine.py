"""PostgreSQL -> engine: full and incremental copies, and the three ways to reach remote data."""

from __future__ import annotations

import decimal

import psycopg
import pytest

from migrators import MigrationError, PostgresUnavailable, cast
from migrators.access import Replica, cross_system_query, migrate_to_engine
from sstore import Engine
from sstore.retry import RetryPolicy


@pytest.fixture
def customers(pg_url: str) -> str:
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, tier SMALLINT, "
                    "changed_at TIMESTAMP)")
        con.execute("INSERT INTO customers SELECT i, 'c' || i, i % 3, "
                    "TIMESTAMP '2024-01-01' + i * INTERVAL '1 minute' "
                    "FROM generate_series(1, 50) i")
    return pg_url


def local(engine: Engine, sql: str) -> list[tuple]:
    return [tuple(r.values()) for r in engine.query(sql).to_pylist()]


def test_full_copy_then_lookups_inside_a_procedure(engine: Engine, customers: str) -> None:
    engine.stream("orders", {"customer": "INTEGER"})

    @engine.procedure(input="orders", output="named")
    def name_orders(tx, batch):
        return tx.sql("SELECT o.customer, c.name FROM batch o JOIN customers_copy c "
                      "ON c.id = o.customer")

    assert cast(customers, engine, table="customers", into="customers_copy") == 50
    assert local(engine, "SELECT count(*), max(id) FROM customers_copy") == [(50, 50)]

    engine.ingest("orders", [(7,), (9,)])
    engine.run_until_idle()
    assert sorted(engine.latest("named")[1].column("name").to_pylist()) == ["c7", "c9"]
    # a full copy again replaces, it does not duplicate
    cast(customers, engine, table="customers", into="customers_copy")
    assert local(engine, "SELECT count(*) FROM customers_copy") == [(50,)]


def test_query_result_and_incremental_refresh(engine: Engine, customers: str) -> None:
    n = cast(customers, engine, query="SELECT id, name FROM customers WHERE tier = 0",
             into="tier0")
    assert n == 16 and local(engine, "SELECT count(*) FROM tier0") == [(16,)]
    replica = Replica(engine, customers, "customers", "cust", key=["id"], since="changed_at")
    assert replica.refresh() == 50
    with psycopg.connect(customers) as con:
        con.execute("UPDATE customers SET name = 'renamed', changed_at = '2030-01-01' "
                    "WHERE id = 3")
        con.execute("INSERT INTO customers VALUES (51, 'new', 1, '2030-01-02')")
    assert replica.refresh() == 2  # only the changed and the new row travel
    assert local(engine, "SELECT count(*) FROM cust") == [(51,)]
    assert local(engine, "SELECT name FROM cust WHERE id = 3") == [("renamed",)]


def test_cross_system_query_keeps_nothing(engine: Engine, customers: str) -> None:
    rows = cross_system_query(customers, "SELECT count(*) AS n FROM customers WHERE tier = $1", 1)
    assert rows.column("n")[0].as_py() == 17
    tables = local(engine, "SELECT count(*) FROM information_schema.tables "
                           "WHERE table_schema = 'main'")
    assert tables == [(0,)]


def test_migration_removes_at_the_source_only_what_the_engine_committed(
        engine: Engine, customers: str) -> None:
    moved = migrate_to_engine(engine, customers, "customers", "cold_customers", key=["id"],
                              where="tier = %s", where_params=[2])
    assert moved == 17
    assert local(engine, "SELECT count(*) FROM cold_customers") == [(17,)]
    with psycopg.connect(customers) as con:
        assert con.execute("SELECT count(*) FROM customers WHERE tier = 2").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM customers").fetchone() == (33,)
    # moving again finds nothing and changes nothing
    assert migrate_to_engine(engine, customers, "customers", "cold_customers", key=["id"],
                             where="tier = %s", where_params=[2]) == 0
    assert local(engine, "SELECT count(*) FROM cold_customers") == [(17,)]


def test_bad_queries_and_unreachable_servers(engine: Engine, customers: str) -> None:
    with pytest.raises(MigrationError, match="nope"):
        cast(customers, engine, table="nope", into="x")
    # two tries (one retry), not the default budget's 8 (16 s of waiting for nothing)
    with pytest.raises(PostgresUnavailable, match="gave up after 2 attempts"):
        cast("postgresql://postgres@127.0.0.1:1/x", engine, table="t", into="x",
             retry=RetryPolicy(attempts=2))


def test_numeric_arrives_as_decimal(pg_url: str) -> None:
    """ADBC hands numeric over as text; the engine gets decimals (with the column's precision
    and scale, or the widest scale its values use), so sums and comparisons work there."""
    from migrators.postgres_to_engine import read_postgres
    table = read_postgres(pg_url, "SELECT 12.34::numeric(10,2) AS price, 1.125::numeric AS free, "
                                  "NULL::numeric(8,2) AS missing")
    assert [str(f.type) for f in table.schema] == ["decimal128(10, 2)", "decimal128(38, 3)",
                                                   "decimal128(8, 2)"]
    assert table.to_pylist() == [{"price": decimal.Decimal("12.34"),
                                  "free": decimal.Decimal("1.125"), "missing": None}]
