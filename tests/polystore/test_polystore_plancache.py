"""The plan cache's re-planning schedule, and the cheap questions a planning and a reuse ask.

A repeated query is re-planned less often while re-planning keeps confirming its choice, at
once when a run diverges or a fragment left out as empty gains rows; a reuse never answers
without rows a fragment gained. The planner's small questions come back as Python values
(``Engine.query_rows``) and a plain PostgreSQL table is counted in its probe's one question.
"""

from __future__ import annotations

import psycopg
import pytest

from sstore import Engine
from sstore.base.readonly import ReadOnlyQueryError
from sstore.polystore import Polystore
from sstore.polystore.connectors import PostgresConnector, StreamingConnector
from sstore.polystore.cost import CostModel
from sstore.polystore.plan import Plan, Run
from sstore.polystore.plancache import PlanCache
from sstore.storage.statefile import StateFileReader
from tests.polystore.test_polystore_freshness import SQL, _expected, live  # noqa: F401  (fixture)


def _plan(name: str, pruned: tuple[tuple[str, str], ...] = ()) -> Plan:
    return Plan(name, "rule", (), Run("island", "SELECT 1", 0, 0, 1, 1), pruned=pruned)


def _never_empty(_engine: str, _physical: str) -> bool:
    raise AssertionError("no fragment was left out")


def _runs_until_replanned(cache: PlanCache, key, name: str) -> int:
    """Plan ``name`` (put), then reuse it until ``get`` asks for a planning: the runs it
    served, the planned one included."""
    cache.put(key, _plan(name))
    runs = 1
    while cache.get(key, _never_empty) is not None:
        runs += 1
    return runs


def test_confirmed_choices_are_replanned_less_often_up_to_a_bound() -> None:
    cache = PlanCache(replan_every=3, max_backoff=4)
    key = PlanCache.key("q", 1, "catalog")
    assert cache.get(key, _never_empty) is None
    assert [_runs_until_replanned(cache, key, "a") for _ in range(5)] == [3, 6, 12, 12, 12]
    assert _runs_until_replanned(cache, key, "b") == 3      # another choice: from the start
    assert _runs_until_replanned(cache, key, "b") == 6


def test_replan_every_one_plans_every_run_afresh() -> None:
    cache = PlanCache(replan_every=1)
    key = PlanCache.key("q", 1, "catalog")
    assert [_runs_until_replanned(cache, key, "a") for _ in range(4)] == [1, 1, 1, 1]


def test_a_run_that_diverges_sends_the_next_run_to_the_planner() -> None:
    cache = PlanCache(replan_every=4)
    key = PlanCache.key("q", 1, "catalog")
    for _ in range(3):
        _runs_until_replanned(cache, key, "a")          # interval 16 now
    plan = _plan("a")
    cache.put(key, plan)
    cache.observe(plan, 0.010)
    assert cache.get(key, _never_empty) is plan
    cache.observe(plan, 0.0105)                          # noise: kept
    cache.observe(plan, 0.0019 + 2 * 0.010)              # twice its fastest and more...
    assert cache.get(key, _never_empty) is plan          # ...once: a slow moment, kept
    cache.observe(plan, 0.0105)
    cache.observe(plan, 0.0019 + 2 * 0.010)              # again, but not in a row: kept
    assert cache.get(key, _never_empty) is plan
    cache.observe(plan, 0.0019 + 2 * 0.010)              # twice in a row: due
    assert cache.get(key, _never_empty) is None
    assert _runs_until_replanned(cache, key, "a") == 8  # confirmed again: doubles from 4


def test_a_fragment_that_gained_rows_restarts_the_schedule() -> None:
    cache = PlanCache(replan_every=2)
    key = PlanCache.key("q", 1, "catalog")
    for _ in range(3):
        _runs_until_replanned(cache, key, "a")
    pruned = _plan("a", pruned=(("pg", "t"),))
    cache.put(key, pruned)
    assert cache.get(key, lambda _e, _p: True) is pruned
    assert cache.get(key, lambda _e, _p: False) is None  # rows arrived: plan afresh
    assert _runs_until_replanned(cache, key, "a") == 2


def test_a_long_reused_plan_still_sees_a_fragment_it_left_out_gain_rows(live) -> None:  # noqa: F811
    ps, engine, sink, ingest = live
    ps.plan_cache.replan_every = 2
    sink.run_once()
    engine.collect_garbage()                          # the stream's part is empty now
    for _ in range(20):                               # re-planning confirms "in pg" again and again
        assert ps.query(SQL).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6])
    entry = next(iter(ps.plan_cache.entries.values()))
    assert entry.plan.name == "in pg" and entry.interval > 2
    ingest([7])
    assert ps.query(SQL).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6, 7])
    assert next(iter(ps.plan_cache.entries.values())).interval == 2


def test_is_empty_reads_at_most_a_row(live, pg_url: str) -> None:  # noqa: F811
    ps, engine, _sink, _ingest = live
    pg, st = ps.connector("pg"), ps.connector("stream")
    assert not pg.is_empty("public.orders_old") and not st.is_empty("orders_in")
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("CREATE TABLE public.nothing (x int)")
    engine.execute("CREATE TABLE nothing (x INTEGER)")
    assert pg.is_empty("public.nothing") and st.is_empty("nothing")


def test_query_rows_answers_as_query_does(tmp_path) -> None:
    with Engine(str(tmp_path / "e.duckdb")) as engine:
        engine.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
        engine.execute("INSERT INTO t VALUES (1, 'x'), (2, NULL)")
        sql = "SELECT a, b, {'k': a} AS s FROM t WHERE a >= ? ORDER BY a"
        names, rows = engine.query_rows(sql, 1)
        table = engine.query(sql, 1)
        assert names == table.column_names
        assert [dict(zip(names, r)) for r in rows] == table.to_pylist()
        with pytest.raises(ReadOnlyQueryError):
            engine.query_rows("DELETE FROM t")
    reader = StateFileReader(str(tmp_path / "e.duckdb"))  # the engine's file, opened read-only
    try:
        assert reader.query_rows(sql, 1) == (names, rows)
        with pytest.raises(ReadOnlyQueryError):
            reader.query_rows("DELETE FROM t")
        probed = StreamingConnector("file", reader).probe("t", "a", [1])
        assert (probed.columns, probed.rows, probed.growths[1].new) == (["a", "b"], 2, 1)
        assert StreamingConnector("file", reader).is_empty("t") is False
    finally:
        reader.close()


class _Counting(PostgresConnector):
    """A real connector that counts its round trips."""

    asked = 0

    def _execute(self, sql, params=()):
        self.asked += 1
        return super()._execute(sql, params)


def test_a_plain_postgres_table_is_counted_in_its_probes_question(live, pg_url) -> None:  # noqa: F811
    """A table no sink feeds is priced by its row count, asked in the probe's one question
    (it was a second round trip); a sink-fed table is still not scanned."""
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("CREATE TABLE public.dim AS SELECT g AS id FROM generate_series(1, 37) g")
    pg = _Counting("pg", pg_url)
    try:
        pg.probe("public.dim", "_batch_id")             # sees sstore.watermarks exist
        pg.asked = 0
        found = pg.probe("public.dim", "_batch_id")
        assert (found.rows, pg.asked) == (37, 1)
        fed = pg.probe("public.orders_old", "_batch_id")
        assert fed.growth is not None and fed.rows == fed.growth.total == 5
        assert pg.asked == 2
    finally:
        pg.close()


def test_a_polystore_answers_through_the_cheap_questions(tmp_path, pg_url: str) -> None:
    """End to end with a plain dimension: the counted rows price the same plans."""
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("CREATE TABLE public.dim AS SELECT g AS id FROM generate_series(1, 37) g")
    with Engine(str(tmp_path / "s.duckdb")) as engine:
        engine.execute("CREATE TABLE facts (id INTEGER)")
        engine.execute("INSERT INTO facts SELECT range % 40 FROM range(100)")
        with Polystore(str(tmp_path / "c.json"), costs=CostModel()) as ps:
            ps.attach_engine("stream", engine)
            ps.add_postgres("pg", pg_url)
            sql = "SELECT count(*) AS n FROM facts JOIN dim ON facts.id = dim.id"
            expected = sum(1 for i in range(100) if 1 <= i % 40 <= 37)
            for plan in ps.plans(sql):
                assert ps.run_plan(plan).to_pylist() == [{"n": expected}], plan.name
            assert ps.query(sql).to_pylist() == [{"n": expected}]
