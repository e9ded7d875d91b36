"""PostgreSQL -> engine: full and incremental copies, and the three ways to reach remote data."""

from __future__ import annotations

import decimal
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from migrators import MigrationError, PostgresUnavailable, cast
from migrators.access import Replica, cross_system_query, migrate_to_engine
from sstore import Engine
from sstore.base.retry import RetryPolicy
from tests.pg_proxy import CuttingProxy


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
    # the changed and the new row travel, with the row(s) at the newest changed_at already
    # read (a merge re-reads the boundary: a row that ties with it must not be skipped)
    assert replica.refresh() == 3
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


# -- migrate_to_engine under transient failures: every PostgreSQL step honours retry=, and a
# retried step neither applies nor removes a row twice. Tier 2 is ids 2, 5, 8, ... (17 rows).
FAST = RetryPolicy(attempts=2, first_delay=0.01, max_delay=0.02)
TIER2 = 17


def move_tier2(engine: Engine, url: str, retry: RetryPolicy | None = None) -> int:
    return migrate_to_engine(engine, url, "customers", "cold_customers", key=["id"],
                             where="tier = %s", where_params=[2], retry=retry)


def pg(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url) as con:
        return con.execute(sql).fetchall()


def wait_and_terminate(admin: psycopg.Connection, statement: str) -> None:
    """Terminate the backend whose ``statement`` (a LIKE pattern) waits for a lock: a real
    mid-step failure (57P01, as when an operator or a failover kills a session)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = "
                             "current_database() AND wait_event_type = 'Lock' AND query LIKE %s "
                             "AND pid <> pg_backend_pid()", (statement,)).fetchall()
        if pids:
            admin.execute("SELECT pg_terminate_backend(%s)", pids[0])
            return
        time.sleep(0.02)
    raise AssertionError(f"no backend ever waited in {statement!r}")


def test_a_server_away_gives_up_by_the_callers_budget(engine: Engine) -> None:
    began = time.monotonic()
    with pytest.raises(PostgresUnavailable,
                       match="read rows to move from customers: gave up after 2 attempts"):
        move_tier2(engine, "postgresql://postgres@127.0.0.1:1/x", retry=FAST)
    assert time.monotonic() - began < 3  # the read ignored retry= before: 8 attempts, 16 s


def test_a_removal_that_gives_up_is_completed_by_moving_again(
        engine: Engine, customers: str) -> None:
    """The removal's step fails on every attempt (a row lock held elsewhere outlasts the
    session's lock_timeout: 55P03, transient): the engine keeps what it committed, the
    source keeps its rows, and moving again delivers each row once."""
    locker = psycopg.connect(customers)
    locker.execute("SELECT id FROM customers WHERE id = 5 FOR UPDATE")
    try:
        with pytest.raises(PostgresUnavailable, match="remove moved rows from customers: "
                                                      "gave up after 2 attempts"):
            move_tier2(engine, customers + "?options=-c%20lock_timeout%3D100", retry=FAST)
    finally:
        locker.rollback()
        locker.close()
    assert local(engine, "SELECT count(*) FROM cold_customers") == [(TIER2,)]
    assert pg(customers, "SELECT count(*) FROM customers WHERE tier = 2") == [(TIER2,)]
    assert move_tier2(engine, customers, retry=FAST) == TIER2
    assert local(engine, "SELECT count(*), count(DISTINCT id) FROM cold_customers") == \
        [(TIER2, TIER2)]
    assert pg(customers, "SELECT count(*), count(*) FILTER (WHERE tier = 2) FROM customers") \
        == [(50 - TIER2, 0)]


def test_backends_terminated_in_the_read_and_in_the_removal_are_retried(
        engine: Engine, customers: str) -> None:
    """The read waits on a table lock, the removal on a row lock; each is terminated there
    once, and each step is retried on a new connection by the caller's policy."""
    locker = psycopg.connect(customers)
    locker.execute("SELECT id FROM customers WHERE id = 5 FOR UPDATE")  # for the removal
    locker.execute("SAVEPOINT table_lock")
    locker.execute("LOCK TABLE customers IN ACCESS EXCLUSIVE MODE")     # for the read

    def faults() -> None:
        with psycopg.connect(customers, autocommit=True) as admin:
            wait_and_terminate(admin, "SELECT%customers%")
            locker.execute("ROLLBACK TO SAVEPOINT table_lock")  # the read may go on now
            wait_and_terminate(admin, "DELETE FROM%customers%")
            locker.rollback()                                   # the removal may go on now

    thread = threading.Thread(target=faults)
    thread.start()
    policy = RetryPolicy(attempts=3, first_delay=0.05, max_delay=0.1)
    try:
        assert move_tier2(engine, customers, retry=policy) == TIER2
    finally:
        thread.join()
        locker.close()
    assert policy.retries_done == 2  # one per step, both by the policy handed in
    assert local(engine, "SELECT count(*), count(DISTINCT id), min(id % 3) FROM "
                         "cold_customers") == [(TIER2, TIER2, 2)]
    assert pg(customers, "SELECT count(*), count(*) FILTER (WHERE tier = 2) FROM customers") \
        == [(50 - TIER2, 0)]


def test_a_retried_removal_takes_only_the_row_versions_it_moved(
        engine: Engine, customers: str) -> None:
    """Just before the removal, row 5 changes at the source; its COMMIT then reaches the
    server but the answer is lost (the relay cuts the connection), and meanwhile a new row 2
    arrives under a moved key. The retried removal deletes neither: both stay in PostgreSQL
    for the next move, which takes them once. Matching by key alone lost both rows."""
    def on_send(chunk: bytes) -> bool:
        if b"DELETE FROM" in chunk and not changed:
            changed.append(pg(customers, "UPDATE customers SET name = 'changed' WHERE id = 5 "
                                         "RETURNING id"))
        return b"COMMIT\x00" in chunk and bool(changed) and proxy.cuts == 0

    def on_cut() -> None:
        pg(customers, "INSERT INTO customers VALUES (2, 'reborn', 2, now()) RETURNING id")

    changed: list[list[tuple]] = []
    url = urlsplit(customers)
    with CuttingProxy((url.hostname or "127.0.0.1", url.port or 5432), on_send,
                      on_cut) as proxy:
        login = url.netloc.rpartition("@")[0]  # user and password, if any
        relayed = urlunsplit(url._replace(netloc=f"{login}@127.0.0.1:{proxy.port}",
                                          query="sslmode=disable&gssencmode=disable"))
        policy = RetryPolicy(attempts=3, first_delay=0.05, max_delay=0.1)
        assert move_tier2(engine, relayed, retry=policy) == TIER2
    assert proxy.cuts == 1 and policy.retries_done == 1
    assert pg(customers, "SELECT id, name FROM customers WHERE tier = 2 ORDER BY id") == \
        [(2, "reborn"), (5, "changed")]
    assert local(engine, "SELECT count(*), count(DISTINCT id) FROM cold_customers") == \
        [(TIER2, TIER2)]
    assert move_tier2(engine, customers, retry=FAST) == 2  # the next move takes both, once
    assert local(engine, "SELECT id, name FROM cold_customers WHERE id IN (2, 5) "
                         "ORDER BY id") == [(2, "reborn"), (5, "changed")]
    assert local(engine, "SELECT count(*) FROM cold_customers") == [(TIER2,)]
    assert pg(customers, "SELECT count(*) FROM customers WHERE tier = 2") == [(0,)]


def test_a_cross_system_query_and_a_replica_refresh_retry_by_the_policy_given(
        engine: Engine, customers: str) -> None:
    """The first read of each is cut (the relay closes the connection before the answer):
    both are read again, by the policy handed in, and return every row."""
    cut: list[bytes] = []

    def on_send(chunk: bytes) -> bool:
        if b"customers" in chunk and not cut:
            cut.append(chunk)
            return True
        return False

    url = urlsplit(customers)
    with CuttingProxy((url.hostname or "127.0.0.1", url.port or 5432), on_send) as proxy:
        login = url.netloc.rpartition("@")[0]  # user and password, if any
        relayed = urlunsplit(url._replace(netloc=f"{login}@127.0.0.1:{proxy.port}",
                                          query="sslmode=disable&gssencmode=disable"))
        policy = RetryPolicy(attempts=3, first_delay=0.05, max_delay=0.1)
        rows = cross_system_query(relayed, "SELECT count(*) AS n FROM customers", retry=policy)
        assert rows.column("n")[0].as_py() == 50
        assert proxy.cuts == 1 and policy.retries_done == 1
        cut.clear()
        policy = RetryPolicy(attempts=3, first_delay=0.05, max_delay=0.1)
        replica = Replica(engine, relayed, "customers", "cust_copy", retry=policy)
        assert replica.refresh() == 50
        assert proxy.cuts == 2 and policy.retries_done == 1
    assert local(engine, "SELECT count(*) FROM cust_copy") == [(50,)]
