"""A split object counts every row once, also while a batch is in both of its fragments.

The split object a running system has: an engine stream (fresh batches) and the PostgreSQL
table a sink (``StreamToPostgres``, ``batch_column="_batch_id"``) delivers that stream into.
Between the sink's commit and the engine's garbage collection a batch is in both fragments;
garbage collection runs on its own schedule, so a user can always query in that window. Every
plan, forced, and the planner's own choice, must count the batch once: the engine fragment
contributes only the batches above the sink's watermark. A stream and a table whose link
cannot be found are refused until the user declares them disjoint.
"""

from __future__ import annotations

import json

import psycopg
import pytest

from migrators.engine_to_postgres import StreamToPostgres
from sstore import Engine
from sstore.base.errors import DeclarationError
from sstore.polystore import Polystore
from sstore.polystore.cost import CostModel

SQL = "SELECT count(*) AS n, sum(o_id) AS s FROM orders"
PLANS = ("migrate into pg", "migrate into stream", "pull into island")


@pytest.fixture
def window(tmp_path, pg_url: str):
    """(polystore, engine, sink, ingest(rows) -> batch-id). Batches 1-2 are delivered into
    PostgreSQL and NOT yet collected from the stream (they are in both fragments); batch 3 is
    only in the stream."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    engine.stream("orders_in", {"o_id": "INTEGER", "o_c_id": "INTEGER"})
    sink = StreamToPostgres(engine, "orders_in", pg_url, "public.orders_old",
                            batch_column="_batch_id")
    next_id = iter(range(1, 10_000))

    def ingest(ids: list[int]) -> int:
        batch = next(next_id)
        engine.ingest("orders_in", [(i, i % 7) for i in ids], batch_id=batch)
        return batch

    ingest([1, 2, 3])
    ingest([4, 5])
    sink.run_once()          # delivered; garbage collection has not run yet
    ingest([6])
    ps = Polystore(str(tmp_path / "catalog.json"), costs=CostModel())
    ps.attach_engine("stream", engine)
    ps.add_postgres("pg", pg_url)
    ps.split("orders", {"stream": "orders_in", "pg": "public.orders_old"})
    yield ps, engine, sink, ingest
    ps.close()
    engine.close()


def _expected(ids: list[int]) -> dict:
    return {"n": len(ids), "s": sum(ids)}


def _by_plan(ps: Polystore) -> dict[str, dict]:
    return {p.name: ps.run_plan(p).to_pylist()[0] for p in ps.plans(SQL, rewrite=False)}


def _json_answer(output: str) -> dict:
    row = json.loads(output)[0]
    return {"n": int(row["n"]), "s": int(row["s"])}


def _stream_rows(engine: Engine) -> int:
    return engine.query("SELECT count(*) AS n FROM orders_in").to_pylist()[0]["n"]


def test_a_delivered_batch_not_yet_collected_is_counted_once(window) -> None:
    ps, engine, _sink, _ingest = window
    assert _stream_rows(engine) == 6        # batches 1-3: 1-2 are in PostgreSQL as well
    answers = _by_plan(ps)
    assert set(answers) >= set(PLANS)
    assert answers == dict.fromkeys(answers, _expected([1, 2, 3, 4, 5, 6]))
    assert ps.query(SQL).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6])
    for name in PLANS:
        assert ps.query(SQL, plan=name).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6])


def test_rows_are_counted_once_with_the_sink_running_between_warm_repetitions(window) -> None:
    """The hostile user: caches warm in both directions, then batches arrive, the sink
    delivers some of them, garbage collection runs only every other round."""
    ps, engine, sink, ingest = window
    ids = [1, 2, 3, 4, 5, 6]
    assert _by_plan(ps) == dict.fromkeys(_by_plan(ps), _expected(ids))  # caches made
    for round_ in range(4):
        new = [100 * (round_ + 1) + k for k in range(round_ + 1)]
        ingest(new)
        ids += new
        assert ps.query(SQL).to_pylist()[0] == _expected(ids)
        sink.run_once()                     # in PostgreSQL and still in the stream
        assert _stream_rows(engine) >= len(new)
        answers = _by_plan(ps)
        assert answers == dict.fromkeys(answers, _expected(ids)), round_
        assert ps.query(SQL).to_pylist()[0] == _expected(ids)
        if round_ % 2:
            engine.collect_garbage()
            answers = _by_plan(ps)
            assert answers == dict.fromkeys(answers, _expected(ids)), round_


def test_a_filter_and_a_join_over_the_window_count_once(window, pg_url: str) -> None:
    ps, _engine, _sink, _ingest = window
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE customer (c_id int, c_name text)")
        con.execute("INSERT INTO customer SELECT g, 'c' || g FROM generate_series(0, 6) g")
    ps.discover("pg")
    queries = {
        "SELECT count(*) AS n FROM orders WHERE o_id >= 2": 5,
        "SELECT count(*) AS n FROM orders JOIN customer ON o_c_id = c_id": 6,
        "SELECT count(DISTINCT o_id) AS n FROM orders": 6,
    }
    for sql, n in queries.items():
        for plan in ps.plans(sql, rewrite=False):
            assert ps.run_plan(plan).to_pylist()[0]["n"] == n, (sql, plan.name)


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("name", PLANS)
def test_a_delivery_and_collection_during_the_query_is_not_counted_twice_nor_lost(
        window, name: str, when: str) -> None:
    """The sink delivers batch 3 and garbage collection drops it while the plan runs, just
    before or just after its first read of either engine: the answer still has every row
    once (the plan runs again when a delivery committed while it ran)."""
    ps, engine, sink, _ingest = window
    plan = {p.name: p for p in ps.plans(SQL, rewrite=False)}[name]
    fired: list[str] = []
    for engine_name in ("stream", "pg"):
        connector = ps.connector(engine_name)
        real = connector.fetch

        def hooked(sql: str, _real=real, _name=engine_name, **how: object) -> object:
            first = not fired
            if first:
                fired.append(_name)
            if first and when == "before":
                sink.run_once()
                engine.collect_garbage()
            rows = _real(sql, **how)
            if first and when == "after":
                sink.run_once()
                engine.collect_garbage()
            return rows
        connector.fetch = hooked  # type: ignore[method-assign]
    assert ps.run_plan(plan).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6])
    assert fired
    assert _stream_rows(engine) == 0


def test_a_stream_and_a_table_without_a_known_sink_are_refused_until_declared(
        tmp_path, pg_url: str) -> None:
    """No watermark links the stream to the table: the polystore cannot tell whether a batch
    is in both, so it refuses loudly and says how to declare it."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    engine.stream("orders_in", {"o_id": "INTEGER"})
    engine.ingest("orders_in", [(1,), (2,)], batch_id=1)
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE orders_old (o_id int, _batch_id bigint)")
        con.execute("INSERT INTO orders_old VALUES (1, 1), (2, 1), (3, 0)")
    ps = Polystore(str(tmp_path / "catalog.json"), costs=CostModel())
    try:
        ps.attach_engine("stream", engine)
        ps.add_postgres("pg", pg_url)
        ps.split("orders", {"stream": "orders_in", "pg": "orders_old"})
        with pytest.raises(DeclarationError, match="disjoint=True"):
            ps.query("SELECT count(*) AS n FROM orders")
        ps.split("orders", {"stream": "orders_in", "pg": "orders_old"}, disjoint=True)
        assert ps.query("SELECT count(*) AS n FROM orders").to_pylist() == [{"n": 5}]
        again = Polystore(str(tmp_path / "catalog.json"), costs=CostModel(),
                          engines={"stream": engine})
        assert again.catalog.lookup("orders").disjoint   # kept in the catalog's file
        again.close()
    finally:
        ps.close()
        engine.close()


def test_the_spark_plan_counts_a_delivered_batch_once(window, spark) -> None:
    ps, _engine, _sink, _ingest = window
    ps.add_spark("spark")
    plan = {p.name: p for p in ps.plans(SQL, rewrite=False)}["in spark"]
    assert ps.run_plan(plan).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6])


def test_an_empty_table_a_sink_feeds_is_not_left_out(tmp_path, pg_url: str) -> None:
    """Nothing delivered yet: PostgreSQL's part is empty when the plan is made. The sink
    delivers and garbage collection runs before the plan runs: a plan that read the stream
    alone (the empty part left out) would answer with no rows."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    engine.stream("orders_in", {"o_id": "INTEGER", "o_c_id": "INTEGER"})
    sink = StreamToPostgres(engine, "orders_in", pg_url, "public.orders_old",
                            batch_column="_batch_id")
    engine.ingest("orders_in", [], batch_id=1)
    sink.run_once()                          # the table and its watermark, no rows
    engine.collect_garbage()
    engine.ingest("orders_in", [(1, 1), (2, 2), (3, 3)], batch_id=2)
    ps = Polystore(str(tmp_path / "catalog.json"), costs=CostModel())
    try:
        ps.attach_engine("stream", engine)
        ps.add_postgres("pg", pg_url)
        ps.split("orders", {"stream": "orders_in", "pg": "public.orders_old"})
        plans = ps.plans(SQL)
        assert all(p.pruned == () for p in plans)
        sink.run_once()
        engine.collect_garbage()
        assert _stream_rows(engine) == 0
        for plan in plans:
            assert ps.run_plan(plan).to_pylist()[0] == _expected([1, 2, 3]), plan.name
    finally:
        ps.close()
        engine.close()


def test_a_sink_delivering_during_every_run_is_a_loud_error(window) -> None:
    """Each run of the plan sees a delivery commit: after a few runs the query fails with a
    transient error instead of answering."""
    from sstore.polystore.delivered import ATTEMPTS, DeliveryRaced
    ps, _engine, sink, ingest = window
    plan = {p.name: p for p in ps.plans(SQL, rewrite=False)}["pull into island"]
    connector = ps.connector("pg")
    real = connector.fetch
    runs: list[int] = []

    def hooked(sql: str, **how: object) -> object:
        runs.append(ingest([1000 + len(runs)]))
        sink.run_once()
        return real(sql, **how)
    connector.fetch = hooked  # type: ignore[method-assign]
    with pytest.raises(DeliveryRaced, match="run the query again"):
        ps.run_plan(plan)
    assert len(runs) == ATTEMPTS


def test_a_sink_reset_after_planning_is_a_loud_error(window, pg_url: str) -> None:
    from migrators import watermarks
    from sstore.polystore.delivered import DeliveryLostError
    ps, _engine, _sink, _ingest = window
    plan = {p.name: p for p in ps.plans(SQL, rewrite=False)}["migrate into pg"]
    with psycopg.connect(pg_url) as con:  # emptied first: a reset over rows is refused
        con.execute("TRUNCATE public.orders_old")
        con.commit()
        assert watermarks.reset(con, "orders_in", "public.orders_old") == 1
    with pytest.raises(DeliveryLostError, match="is gone"):
        ps.run_plan(plan)
    with pytest.raises(DeclarationError, match="disjoint=True"):
        ps.plans(SQL)   # planned again: nothing links them any more


def test_sstore_query_over_a_state_file_finds_the_sink_and_refuses_an_unlinked_table(
        tmp_path, pg_url: str) -> None:
    """Another process (``sstore query``) opens the state file read-only: the engine's
    identity comes from the file, the sink's watermark from PostgreSQL. A table no sink
    links is refused until ``split --disjoint``."""
    from click.testing import CliRunner

    from sstore.cli import main
    state = str(tmp_path / "cli.duckdb")
    with Engine(state) as engine:
        engine.stream("orders_in", {"o_id": "INTEGER", "o_c_id": "INTEGER"})
        sink = StreamToPostgres(engine, "orders_in", pg_url, "public.orders_old",
                                batch_column="_batch_id")
        engine.ingest("orders_in", [(1, 1), (2, 2)], batch_id=1)
        sink.run_once()                      # delivered, not collected
        engine.ingest("orders_in", [(3, 3)], batch_id=2)
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE other (o_id int, o_c_id int)")
        con.execute("INSERT INTO other VALUES (10, 1)")
    runner = CliRunner()
    env = {"SSTORE_CATALOG": str(tmp_path / "cat.json")}
    for args in (["polystore", "add-postgres", "pg", pg_url],
                 ["polystore", "add-engine", "stream", state],
                 ["polystore", "split", "orders", "stream=orders_in", "pg=public.orders_old"],
                 ["polystore", "split", "mixed", "stream=orders_in", "pg=public.other"]):
        result = runner.invoke(main, args, env=env)
        assert result.exit_code == 0, result.output
    sql = "SELECT count(*) AS n, sum(o_id) AS s FROM {}"
    result = runner.invoke(main, ["query", sql.format("orders"), "--format", "json"], env=env)
    assert result.exit_code == 0, result.output
    assert _json_answer(result.output) == _expected([1, 2, 3])
    result = runner.invoke(main, ["query", sql.format("mixed"), "--format", "json"], env=env)
    assert result.exit_code != 0 and "disjoint" in result.output
    result = runner.invoke(main, ["polystore", "split", "--disjoint", "mixed",
                                  "stream=orders_in", "pg=public.other"], env=env)
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["query", sql.format("mixed"), "--format", "json"], env=env)
    assert result.exit_code == 0, result.output
    assert _json_answer(result.output) == _expected([1, 2, 3, 10])
