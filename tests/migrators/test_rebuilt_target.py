"""A sink's target rebuilt by hand under its own name, with its rows copied over: the usual
PostgreSQL way to change a column's type or to compact a table

    CREATE TABLE t_new AS SELECT * FROM t; DROP TABLE t; ALTER TABLE t_new RENAME TO t;

The watermark was written for the old table (its OID). The sink and the polystore took a
table under the target's name with another OID for one that holds none of the stream's
batches: the sink delivered every batch the engine still had again (duplicates, exit 0), and a
split object counted them twice (the engine fragment from batch 1 on). Which batches the new
table holds cannot be known, so both refuse while it holds rows; dropped (or emptied), it is
refilled as before.
"""

from __future__ import annotations

import psycopg
import pytest

from migrators.engine_to_postgres import StreamToPostgres
from migrators.errors import TargetReplacedError
from sstore import Engine
from sstore.polystore import Polystore
from sstore.polystore.cost import CostModel

SQL = "SELECT count(*) AS n, sum(o_id) AS s FROM orders"


def rebuild(url: str, table: str) -> None:
    with psycopg.connect(url) as con:
        con.execute(f"CREATE TABLE {table}_new AS SELECT * FROM {table}")
        con.execute(f"DROP TABLE {table}")
        con.execute(f"ALTER TABLE {table}_new RENAME TO {table.split('.')[-1]}")


def pg_count(url: str, table: str) -> tuple[int, int]:
    with psycopg.connect(url) as con:
        row = con.execute(f"SELECT count(*), count(DISTINCT o_id) FROM {table}").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.fixture
def delivered(tmp_path, pg_url: str):
    """Batches 1-2 delivered into public.orders_rb and not yet collected; batch 3 only in the
    engine."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    engine.stream("orders_in", {"o_id": "INTEGER", "o_c_id": "INTEGER"})
    sink = StreamToPostgres(engine, "orders_in", pg_url, "public.orders_rb",
                            batch_column="_batch_id")
    engine.ingest("orders_in", [(1, 1), (2, 2), (3, 3)], batch_id=1)
    engine.ingest("orders_in", [(4, 4), (5, 5)], batch_id=2)
    sink.run_once()
    engine.ingest("orders_in", [(6, 6)], batch_id=3)
    yield engine, sink
    engine.close()


def test_a_sink_refuses_a_rebuilt_target_that_holds_rows(delivered, pg_url: str) -> None:
    engine, sink = delivered
    rebuild(pg_url, "public.orders_rb")
    with pytest.raises(TargetReplacedError, match="holds rows"):
        StreamToPostgres(engine, "orders_in", pg_url, "public.orders_rb",
                         batch_column="_batch_id").run_once()
    assert pg_count(pg_url, "public.orders_rb") == (5, 5)  # nothing written twice
    assert engine.acknowledged(sink.consumer) == 2
    with psycopg.connect(pg_url) as con:  # emptied on purpose: refilled from the engine
        con.execute("TRUNCATE public.orders_rb")
    assert StreamToPostgres(engine, "orders_in", pg_url, "public.orders_rb",
                            batch_column="_batch_id").run_once().rows == 6
    assert pg_count(pg_url, "public.orders_rb") == (6, 6)


def test_a_split_object_refuses_a_rebuilt_target_that_holds_rows(delivered, tmp_path,
                                                                 pg_url: str) -> None:
    engine, _sink = delivered
    ps = Polystore(str(tmp_path / "catalog.json"), costs=CostModel())
    ps.attach_engine("stream", engine)
    ps.add_postgres("pg", pg_url)
    ps.split("orders", {"stream": "orders_in", "pg": "public.orders_rb"})
    assert ps.query(SQL).to_pylist()[0] == {"n": 6, "s": 21}
    rebuild(pg_url, "public.orders_rb")
    with pytest.raises(TargetReplacedError, match="holds rows"):
        ps.query(SQL)
    for plan in ps.plans(SQL, rewrite=False):
        with pytest.raises(TargetReplacedError):
            ps.run_plan(plan)
    with psycopg.connect(pg_url) as con:  # emptied: it holds none of the stream's batches
        con.execute("TRUNCATE public.orders_rb")
    assert ps.query(SQL).to_pylist()[0] == {"n": 6, "s": 21}
    ps.close()


def test_a_split_object_over_a_merging_sink_is_refused(tmp_path, pg_url: str) -> None:
    """The sink merges by key: account 1 is updated in batch 2, not delivered yet. The split
    object's UNION ALL counted account 1 twice (3 rows for 2 accounts, its old balance in
    PostgreSQL, its new one in the stream), whatever the plan. The sink records its key in
    its watermark row; the polystore refuses such an object. An appending sink's object is
    read as before."""
    from sstore.polystore.delivered import MergedFragmentsError

    engine = Engine(str(tmp_path / "m.duckdb"))
    engine.stream("acct", {"a_id": "INTEGER", "bal": "INTEGER"})
    engine.stream("moves", {"a_id": "INTEGER", "bal": "INTEGER"})
    merging = StreamToPostgres(engine, "acct", pg_url, "public.acct", mode="merge",
                               key=("a_id",))
    appending = StreamToPostgres(engine, "moves", pg_url, "public.moves")
    for stream in ("acct", "moves"):
        engine.ingest(stream, [(1, 10), (2, 20)], batch_id=1)
    merging.run_once()
    appending.run_once()
    for stream in ("acct", "moves"):
        engine.ingest(stream, [(1, 15)], batch_id=2)
    ps = Polystore(str(tmp_path / "catalog.json"), costs=CostModel())
    ps.attach_engine("stream", engine)
    ps.add_postgres("pg", pg_url)
    ps.split("accts", {"stream": "acct", "pg": "public.acct"})
    ps.split("all_moves", {"stream": "moves", "pg": "public.moves"})
    with pytest.raises(MergedFragmentsError, match=r"merges its batches .* by key \(a_id\)"):
        ps.query("SELECT count(*) AS n FROM accts")
    assert ps.query("SELECT count(*) AS n, sum(bal) AS s FROM all_moves").to_pylist() == [
        {"n": 3, "s": 45}]
    ps.close()
    engine.close()


def test_a_watermark_table_of_an_older_sstore_gets_the_merge_key(tmp_path,
                                                                 pg_url: str) -> None:
    """``sstore.watermarks`` made before ``merge_key`` existed: the column is added when a
    sink starts, and the sink records its key in its existing row."""
    engine = Engine(str(tmp_path / "o.duckdb"))
    engine.stream("acct", {"a_id": "INTEGER", "bal": "INTEGER"})
    engine.ingest("acct", [(1, 10)], batch_id=1)
    StreamToPostgres(engine, "acct", pg_url, "public.acct", mode="merge",
                     key=("a_id",)).run_once()
    with psycopg.connect(pg_url) as con:
        con.execute("ALTER TABLE sstore.watermarks DROP COLUMN merge_key")
    engine.ingest("acct", [(1, 11)], batch_id=2)
    StreamToPostgres(engine, "acct", pg_url, "public.acct", mode="merge",
                     key=("a_id",)).run_once()
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT batch_id, merge_key FROM sstore.watermarks").fetchall() == [
            (2, "a_id")]
        assert con.execute("SELECT a_id, bal FROM public.acct").fetchall() == [(1, 11)]
    engine.close()
