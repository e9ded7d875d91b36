"""The polystore against real engines: a streaming engine (DuckDB file), PostgreSQL, Spark.

ORDERS is split the way the paper's experiment splits it: the newest rows in the streaming
engine, the rest in PostgreSQL. Every plan must give the same answer.
"""

from __future__ import annotations

import os
import re

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from migrators.errors import PostgresUnavailable
from sstore import Engine
from sstore.base.errors import TerminalError
from sstore.polystore import Catalog, Polystore, QueryError, UnknownObjectError
from sstore.polystore.cost import CostModel
from sstore.workloads.tpcc.orders import (
    create_in_engine,
    create_in_postgres,
    orders_rows,
    split_rows,
)

ROWS = 6000


def _collect_by_hand(engine: Engine, where: str = "") -> None:
    """Remove ``orders_in``'s rows as garbage collection would (after a move). Not with
    ``engine.execute``: SQL may not write a stream's table (``sstore.dataflow.stream_writes``)."""
    with engine.lock:
        engine.connection.execute(f"DELETE FROM orders_in {where}")


def _sorted(table: pa.Table) -> list[dict]:
    rows = table.to_pylist()
    return sorted(rows, key=lambda r: tuple((v is None, str(v)) for v in r.values()))


@pytest.fixture
def split_orders(tmp_path, pg_url: str):
    """A polystore with ORDERS split 25% engine / 75% PostgreSQL, and a PostgreSQL customer
    table; yields (polystore, engine, all rows)."""
    rows = orders_rows(ROWS)
    recent, older = split_rows(rows, 0.25)
    engine = Engine(str(tmp_path / "stream.duckdb"))
    create_in_engine(engine, "orders_recent", recent)
    create_in_postgres(pg_url, "public.orders", older)
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE customer (c_id int PRIMARY KEY, c_name text)")
        con.execute("INSERT INTO customer SELECT g, 'customer ' || g FROM "
                    "generate_series(1, 3000) g")
    ps = Polystore(str(tmp_path / "catalog.json"))
    ps.attach_engine("stream", engine)
    ps.add_postgres("pg", pg_url)
    ps.split("orders", {"stream": "orders_recent", "pg": "public.orders"})
    yield ps, engine, rows
    ps.close()
    engine.close()


QUERIES = [
    "SELECT * FROM orders",
    ("SELECT o_carrier_id, count(*) AS n, sum(o_ol_cnt) AS lines FROM orders "
     "GROUP BY o_carrier_id"),
    "SELECT o_id, o_d_id, o_entry_d FROM orders WHERE o_carrier_id IS NULL AND o_d_id = 2",
    ("SELECT c_name, count(*) AS n FROM orders JOIN customer ON o_c_id = c_id "
     "WHERE o_ol_cnt > 12 GROUP BY c_name ORDER BY n DESC, c_name LIMIT 10"),
    ("WITH busy AS (SELECT o_c_id FROM orders GROUP BY o_c_id HAVING count(*) > 2) "
     "SELECT count(*) AS n FROM busy"),
]


@pytest.mark.parametrize("sql", QUERIES)
def test_every_plan_gives_the_same_answer(split_orders, sql: str) -> None:
    ps, _engine, rows = split_orders
    plans = ps.plans(sql)
    assert {p.rule for p in plans} >= {"migrate_then_run", "pull_into_island"}
    answers = [_sorted(ps.run_plan(p)) for p in plans]
    for plan, answer in zip(plans[1:], answers[1:]):
        assert answer == answers[0], f"{plan.name} differs from {plans[0].name}"
    assert _sorted(ps.query(sql)) == answers[0]
    if sql == "SELECT * FROM orders":
        assert len(answers[0]) == rows.num_rows


def test_spark_plan_gives_the_same_answer(split_orders, spark) -> None:
    ps, _engine, _rows = split_orders
    ps.add_spark("spark")
    sql = QUERIES[1]
    plans = {p.name: p for p in ps.plans(sql)}
    assert "in spark" in plans
    assert _sorted(ps.run_plan(plans["in spark"])) == \
        _sorted(ps.run_plan(plans["pull into island"]))
    # Spark's start-up and per-job costs make it lose on 6,000 rows
    assert ps.plans(sql)[0].name != "in spark"


def test_one_engine_runs_in_place(split_orders, pg_url: str) -> None:
    ps, _engine, _rows = split_orders
    plans = ps.plans("SELECT count(*) AS n FROM customer WHERE c_id <= 10")
    assert [p.name for p in plans] == ["in pg"] and not plans[0].steps
    assert ps.query("SELECT count(*) AS n FROM customer WHERE c_id <= 10").to_pylist() == \
        [{"n": 10}]
    in_engine = ps.query("SELECT count(*) AS n FROM orders_recent")
    assert in_engine.to_pylist() == [{"n": ROWS // 4}]
    assert [p.name for p in ps.plans("SELECT * FROM orders_recent")] == ["in stream"]


def test_dialects_are_translated(split_orders) -> None:
    """PostgreSQL syntax (casts with ::, ILIKE, string concatenation) runs in the island
    (DuckDB) and in PostgreSQL with the same result."""
    ps, _engine, _rows = split_orders
    sql = ("SELECT o_id::text || '-' || o_d_id::text AS k FROM orders "
           "WHERE o_id::text ILIKE '1%' AND o_d_id = 1")
    by_plan = {p.name: _sorted(ps.run_plan(p)) for p in ps.plans(sql)}
    assert len(set(map(str, by_plan.values()))) == 1
    assert len(by_plan["pull into island"]) > 0


def test_migration_is_cached_and_topped_up(tmp_path, pg_url: str) -> None:
    """A stream's part moved into PostgreSQL is kept: the next query moves nothing, a new batch
    moves only that batch, and batches the engine dropped leave the copy too."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    engine.stream("orders_in", {"o_id": "INTEGER", "o_c_id": "INTEGER"})
    engine.ingest("orders_in", [(1, 10), (2, 20)], batch_id=1)
    engine.ingest("orders_in", [(3, 30)], batch_id=2)
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE orders_old (o_id int, o_c_id int)")
        con.execute("INSERT INTO orders_old VALUES (100, 1), (101, 2)")
    ps = Polystore(str(tmp_path / "catalog.json"))
    ps.attach_engine("stream", engine)
    ps.add_postgres("pg", pg_url)
    ps.split("orders", {"stream": "orders_in", "pg": "orders_old"}, disjoint=True)  # no sink
    sql = "SELECT sum(o_id) AS s, count(*) AS n FROM orders"
    migrate = "migrate into pg"
    assert ps.query(sql, plan=migrate).to_pylist() == [{"s": 207, "n": 5}]
    again = {p.name: p for p in ps.plans(sql)}[migrate]
    assert again.steps[0].cached_rows == 3 and again.cost_detail["move"] < 0.05
    engine.ingest("orders_in", [(4, 40)], batch_id=3)
    topped = {p.name: p for p in ps.plans(sql)}[migrate]
    assert topped.steps[0].rows - topped.steps[0].cached_rows == 1
    assert ps.query(sql, plan=migrate).to_pylist() == [{"s": 211, "n": 6}]
    _collect_by_hand(engine, "WHERE _batch_id = 1")  # as GC would after a move
    assert ps.query(sql, plan=migrate).to_pylist() == [{"s": 208, "n": 4}]
    assert ps.query(sql, plan="pull into island").to_pylist() == [{"s": 208, "n": 4}]
    with psycopg.connect(pg_url) as con:
        copied = con.execute('SELECT count(*) FROM sstore_cache."orders__stream__to__pg"'
                             ).fetchone()
    assert copied == (2,)
    _collect_by_hand(engine)  # every batch migrated and dropped
    assert [p.name for p in ps.plans(sql)] == ["in pg"]  # the empty part is left out
    stale = {p.name: p for p in ps.plans(sql, rewrite=False)}[migrate]
    assert ps.run_plan(stale).to_pylist() == [{"s": 201, "n": 2}]  # and the copy emptied
    ps.close()
    engine.close()


def test_changed_table_is_copied_again(split_orders) -> None:
    """A plain table has no growing column: its copy is valid while its fingerprint holds."""
    ps, engine, _rows = split_orders
    sql = "SELECT count(*) AS n, sum(o_ol_cnt) AS lines FROM orders"
    first = ps.query(sql, plan="migrate into pg").to_pylist()
    assert {p.name: p for p in ps.plans(sql)}["migrate into pg"].steps[0].cached_rows == ROWS // 4
    engine.execute("UPDATE orders_recent SET o_ol_cnt = o_ol_cnt + 1 WHERE o_id % 2 = 0")
    assert {p.name: p for p in ps.plans(sql)}["migrate into pg"].steps[0].cached_rows == 0
    after = ps.query(sql, plan="migrate into pg").to_pylist()
    assert after[0]["n"] == first[0]["n"] and after[0]["lines"] > first[0]["lines"]
    assert after == ps.query(sql, plan="pull into island").to_pylist()


def test_repeats_make_migration_worth_it(split_orders) -> None:
    ps, _engine, _rows = split_orders
    once = {p.name: p.cost for p in ps.plans("SELECT * FROM orders")}
    often = {p.name: p.cost for p in ps.plans("SELECT * FROM orders", repeats=100)}
    assert often["migrate into pg"] < once["migrate into pg"]
    assert often["pull into island"] == pytest.approx(once["pull into island"])


def test_explain_lists_plans_with_costs(split_orders) -> None:
    ps, _engine, _rows = split_orders
    text = ps.explain("SELECT count(*) FROM orders")
    assert "* chosen plan" in text and "migrate into pg" in text and "pull into island" in text
    assert "estimated" in text and "cost model:" in text
    assert ps.query("EXPLAIN SELECT count(*) FROM orders").column_names == ["plan"]


def test_island_syntax(split_orders) -> None:
    ps, _engine, rows = split_orders
    assert ps.query("bdrel(SELECT count(*) AS n FROM orders)").to_pylist() == [{"n": ROWS}]
    # the streaming island sees only the engine's part of a split object: the freshest rows
    fresh = ps.query("bdstream(SELECT count(*) AS n FROM orders)")
    assert fresh.to_pylist() == [{"n": ROWS // 4}]
    cast = ps.query("SELECT count(*) AS n FROM bdcast(bdrel(SELECT o_id, o_c_id FROM orders "
                    "WHERE o_carrier_id IS NULL), undelivered, stream)")
    nulls = pc.sum(pc.is_null(rows.column("o_carrier_id"))).as_py()
    assert cast.to_pylist() == [{"n": nulls}]
    assert ps.catalog.lookup("undelivered").fragments[0].engine == "stream"
    assert ps.query("SELECT count(*) AS n FROM undelivered").to_pylist() == [{"n": nulls}]
    # BigDAWG's four-argument form, into the relational island
    ps.query("SELECT 1 FROM bdcast(bdstream(SELECT o_id FROM orders_recent LIMIT 7), "
             "seven, '(o_id integer)', relational)")
    assert ps.query("SELECT count(*) AS n FROM seven").to_pylist() == [{"n": 7}]


def test_bdstream_calls_a_stored_procedure(tmp_path) -> None:
    engine = Engine(str(tmp_path / "p.duckdb"))
    engine.stream("prices", {"symbol": "VARCHAR", "price": "DOUBLE"})

    @engine.procedure(input="prices", output="alerts")
    def check_price(tx, batch):
        return tx.sql("SELECT symbol, price, price > 100 AS high FROM batch")

    ps = Polystore(None, engines={"stream": engine})
    ps.catalog.add_engine("stream", "streaming", engine.path)
    out = ps.query("bdstream(CALL check_price('ACME', 120.5))")
    assert out.to_pylist() == [{"symbol": "ACME", "price": 120.5, "high": True}]
    assert ps.query("bdstream(CALL check_price('ZZZ', -3))").column("high").to_pylist() == [False]
    with pytest.raises(QueryError, match="no running streaming engine"):
        ps.query("bdstream(CALL no_such_proc(1))")
    engine.close()


def test_bad_queries_get_clear_errors(split_orders) -> None:
    ps, _engine, _rows = split_orders
    with pytest.raises(UnknownObjectError, match="no object 'nope'.*known: .*orders"):
        ps.query("SELECT * FROM nope")
    with pytest.raises(QueryError, match="cannot parse"):
        ps.query("SELEC * FROM orders")
    with pytest.raises(QueryError, match="no plan named"):
        ps.query("SELECT * FROM orders", plan="teleport")
    with pytest.raises(QueryError, match="bdcast takes"):
        ps.query("SELECT * FROM bdcast(bdrel(SELECT 1), x)")
    with pytest.raises(QueryError, match="unbalanced"):
        ps.query("bdrel(SELECT * FROM orders")


def test_unreachable_postgres_is_a_transient_error(split_orders, tmp_path) -> None:
    ps, _engine, _rows = split_orders
    ps.add_postgres("gone", "postgresql://postgres@127.0.0.1:1/nowhere", schema=None)
    ps.catalog.register("far", "gone", "public.far")
    with pytest.raises(PostgresUnavailable):
        ps.query("SELECT * FROM far JOIN orders ON true")


def test_catalog_persists_and_reloads(split_orders, tmp_path) -> None:
    _ps, _engine, _rows = split_orders
    again = Catalog(str(tmp_path / "catalog.json"))
    orders = again.lookup("orders")
    assert orders.split and [f.engine for f in orders.fragments] == ["stream", "pg"]
    assert {"customer", "orders_recent"} <= set(again.objects)
    assert again.engines["pg"].kind.value == "postgres"


def test_env_location_keeps_the_password_out_of_the_catalog(tmp_path, pg_url: str,
                                                            monkeypatch) -> None:
    monkeypatch.setenv("SSTORE_TEST_WAREHOUSE", pg_url)
    path = str(tmp_path / "c.json")
    with Polystore(path) as ps:
        ps.add_postgres("pg", "env:SSTORE_TEST_WAREHOUSE", schema=None)
        ps.catalog.register("one", "pg", "pg_catalog.pg_am")
        assert ps.query("SELECT count(*) AS n FROM one").column("n")[0].as_py() > 0
    with open(path, encoding="utf-8") as f:
        assert pg_url not in f.read()


def test_calibration_stores_measured_constants(tmp_path, pg_url: str) -> None:
    from sstore.polystore.calibrate import calibrate
    from sstore.workloads.tpcc.orders import create_in_engine, orders_rows
    model = calibrate(pg_url, orders_rows(5000), repeats=2, create_table=create_in_engine)
    assert model.measured.startswith("calibrated")
    assert model.fixed["postgres"] > 0
    # per value and per row (5,000 rows are too few to split them reliably: noise may put
    # all of it in one of the two, never below zero)
    assert model.fetch["postgres"] + model.fetch_row["postgres"] > 0
    assert min(model.fetch["postgres"], model.fetch_row["postgres"]) >= 0
    path = str(tmp_path / "costs.json")
    model.write(path)
    assert CostModel.read(path).fetch == model.fetch
    assert CostModel.read(path).fetch_row == model.fetch_row
    ps = Polystore(str(tmp_path / "catalog.json"))
    assert ps.costs.measured == model.measured  # costs.json beside the catalog is used


def test_calibration_measures_the_rows_it_is_given(pg_url: str) -> None:
    """The polystore knows no workload: any rows measure (created from their own types),
    and rows it cannot measure are refused before anything is created."""
    from sstore.polystore.calibrate import calibrate
    n = 3000
    rows = pa.table({"k": pa.array(range(n), pa.int64()),
                     "v": pa.array([i / 7 for i in range(n)], pa.float64()),
                     "label": pa.array([f"r{i % 13}" for i in range(n)], pa.string())})
    model = calibrate(pg_url, rows, repeats=1)
    assert "3,000 rows x 3 columns" in model.measured
    assert model.fixed["streaming"] > 0 and model.fixed["postgres"] > 0
    for bad, named in ((rows.rename_columns(["k", "V", "label"]), "['V']"),
                       (rows.slice(0, 0), "empty table")):
        with pytest.raises(TerminalError, match=re.escape(named)):
            calibrate(pg_url, bad, repeats=1)


def test_cli_builds_a_catalog_and_queries_it(tmp_path, pg_url: str) -> None:
    from click.testing import CliRunner

    from sstore.cli import main
    state = str(tmp_path / "cli.duckdb")
    rows = orders_rows(1000)
    recent, older = split_rows(rows, 0.5)
    with Engine(state) as engine:
        create_in_engine(engine, "orders_recent", recent)
    create_in_postgres(pg_url, "public.orders", older)
    catalog = str(tmp_path / "cat.json")
    runner = CliRunner()
    env = {"SSTORE_CATALOG": catalog}
    for args in (["polystore", "add-postgres", "pg", pg_url],
                 ["polystore", "add-engine", "stream", state],
                 ["polystore", "split", "orders", "stream=orders_recent", "pg=public.orders"],
                 ["polystore", "list"]):
        result = runner.invoke(main, args, env=env)
        assert result.exit_code == 0, result.output
    assert "stream:orders_recent, pg:public.orders" in result.output
    result = runner.invoke(main, ["query", "SELECT count(*) AS n FROM orders",
                                  "--format", "json"], env=env)
    assert result.exit_code == 0, result.output
    assert '"n": 1000' in result.output
    result = runner.invoke(main, ["query", "--explain", "SELECT * FROM orders"], env=env)
    assert result.exit_code == 0 and "chosen" in result.output
    assert "migrate into stream" not in result.output  # a state file named here is only read
    assert "measured" not in result.output
    result = runner.invoke(main, ["query", "--explain", "--analyze", "SELECT * FROM orders"],
                           env=env)
    chosen = next(line for line in result.output.splitlines() if line.startswith("* chosen"))
    assert result.exit_code == 0 and "estimated" in chosen and "measured" in chosen
    result = runner.invoke(main, ["query", "SELECT * FROM missing"], env=env)
    assert result.exit_code == 1 and "no object 'missing'" in result.output
    # the two-argument form still reads one state file
    result = runner.invoke(main, ["query", state, "SELECT count(*) AS n FROM orders_recent",
                                  "--format", "csv"])
    assert result.exit_code == 0 and "500" in result.output
    assert os.path.exists(catalog)


def test_engine_qualified_names_and_no_accidental_splits(split_orders, pg_url: str) -> None:
    """A table of the same name in two engines (a replica) is not made a split object by
    discovery; either copy is reachable as ENGINE.TABLE; a table created in the engine after
    it was attached is found when first named."""
    ps, engine, _rows = split_orders
    engine.execute("CREATE TABLE customer AS SELECT 1 AS c_id, 'replica' AS c_name")
    ps.discover("stream")
    assert [f.engine for f in ps.catalog.lookup("customer").fragments] == ["pg"]
    assert ps.query("SELECT c_name FROM stream.customer").to_pylist() == [{"c_name": "replica"}]
    assert ps.query("SELECT count(*) AS n FROM pg.public.customer").to_pylist() == [{"n": 3000}]
    engine.execute("CREATE TABLE fresh_table AS SELECT 42 AS answer")
    assert ps.query("SELECT answer FROM fresh_table").to_pylist() == [{"answer": 42}]


def test_a_join_across_engines_casts_the_smaller_side(tmp_path, pg_url: str) -> None:
    engine = Engine(str(tmp_path / "j.duckdb"))
    engine.execute("CREATE TABLE vip (c_id INTEGER, level VARCHAR)")
    engine.execute("INSERT INTO vip VALUES (1, 'gold'), (2, 'silver')")
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE purchases (c_id int, amount numeric(10,2))")
        con.execute("INSERT INTO purchases SELECT g % 50, g FROM generate_series(1, 20000) g")
    ps = Polystore(str(tmp_path / "c.json"), costs=CostModel())
    ps.attach_engine("stream", engine)
    ps.add_postgres("pg", pg_url)
    sql = ("SELECT level, sum(amount) AS total FROM purchases JOIN vip USING (c_id) "
           "GROUP BY level ORDER BY level")
    plans = {p.name: p for p in ps.plans(sql)}
    into_pg, into_stream = plans["migrate into pg"], plans["migrate into stream"]
    assert into_pg.steps[0].rows == 2 and into_stream.steps[0].rows == 20000
    assert into_pg.cost < into_stream.cost  # moving 2 rows beats moving 20,000
    answers = {name: ps.run_plan(p).to_pylist() for name, p in plans.items()}
    assert all(a == answers["migrate into pg"] for a in answers.values())
    assert answers["migrate into pg"][0]["level"] == "gold"
    ps.close()
    engine.close()


def test_copies_into_the_engine_survive_union_all(tmp_path) -> None:
    """Regression: DuckDB 2.0.0 returned no rows from ``empty UNION ALL copy`` when the copy
    had been created empty and filled in one transaction; the connector creates it from the
    rows instead (a copy of more than one row group, 122,880 rows, showed it)."""
    from sstore.polystore.connectors import StreamingConnector
    engine = Engine(str(tmp_path / "u.duckdb"))
    rows = orders_rows(130_000)
    create_in_engine(engine, "orders_recent", rows.slice(0, 0))
    StreamingConnector("s", engine).store("sstore_cache.copy", rows, note="a copy")
    n = engine.query("SELECT count(*) AS n FROM (SELECT o_id FROM orders_recent UNION ALL "
                     "SELECT o_id FROM sstore_cache.copy)")
    assert n.to_pylist() == [{"n": 130_000}]
    engine.close()


def test_a_table_name_with_percent_and_braces_is_planned_and_read(tmp_path, pg_url: str) -> None:
    """A PostgreSQL fragment's name is part of the planner's probe, a query with ``%s``
    placeholders: a ``%`` in it was taken for a placeholder (and braces for ``str.format``
    fields), so planning failed on a legal table name."""
    rows = orders_rows(200)
    recent, older = split_rows(rows, 0.25)
    engine = Engine(str(tmp_path / "stream.duckdb"))
    create_in_engine(engine, "orders_recent", recent)
    create_in_postgres(pg_url, "public.odd%{1}s", older)
    ps = Polystore(str(tmp_path / "catalog.json"))
    try:
        ps.attach_engine("stream", engine)
        ps.add_postgres("pg", pg_url)
        ps.split("odd", {"stream": "orders_recent", "pg": "public.odd%{1}s"})
        assert ps.query("SELECT count(*) AS n FROM odd").to_pylist() == [{"n": 200}]
    finally:
        ps.close()
        engine.close()
