"""Cached moves stay fresh: checked by what changed, topped up by batch, never served stale.

The split object is the one a running system has: an engine stream holds the fresh batches, a
sink (``StreamToPostgres`` with ``batch_column="_batch_id"``) has moved the older ones into
PostgreSQL and garbage collection has dropped them from the stream. Both directions of
"migrate then run" keep a cached copy: the stream's part in PostgreSQL, PostgreSQL's part in
the engine. A hostile user ingests between queries, runs the sink, truncates by hand.
"""

from __future__ import annotations

import psycopg
import pytest

from migrators.engine_to_postgres import StreamToPostgres
from sstore import Engine
from sstore.polystore import Polystore, cache
from sstore.polystore.connectors import CacheMoved
from sstore.polystore.cost import CostModel
from sstore.polystore.delivered import TargetEmptiedError
from sstore.polystore.plan import Move

SQL = "SELECT count(*) AS n, sum(o_id) AS s FROM orders"
PLANS = ("migrate into pg", "migrate into stream", "pull into island")


@pytest.fixture
def live(tmp_path, pg_url: str):
    """(polystore, engine, sink, ingest(rows) -> batch-id). Batches 1-2 are in PostgreSQL
    (moved by the sink, collected from the stream), batch 3 in the stream."""
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
    sink.run_once()
    engine.collect_garbage()
    ingest([6])
    ps = Polystore(str(tmp_path / "catalog.json"), costs=CostModel())
    ps.attach_engine("stream", engine)
    ps.add_postgres("pg", pg_url)
    ps.split("orders", {"stream": "orders_in", "pg": "public.orders_old"})
    yield ps, engine, sink, ingest
    ps.close()
    engine.close()


def _plan(ps: Polystore, name: str):
    return {p.name: p for p in ps.plans(SQL, rewrite=False)}[name]


def _collect_by_hand(engine: Engine, where: str = "") -> None:
    """Remove ``orders_in``'s rows as garbage collection would (after a move). Not with
    ``engine.execute``: SQL may not write a stream's table (``sstore.dataflow.stream_writes``)."""
    with engine.lock:
        engine.connection.execute(f"DELETE FROM orders_in {where}")


def _answer(ps: Polystore, name: str) -> dict:
    return ps.run_plan(_plan(ps, name)).to_pylist()[0]


def _expected(ids: list[int]) -> dict:
    return {"n": len(ids), "s": sum(ids)}


def _moves(ps: Polystore, name: str) -> list[tuple[str, object]]:
    refreshes: list = []
    ps.run_plan(_plan(ps, name), refreshes=refreshes)
    return refreshes


def _copy(pg_url: str, ps: Polystore, engine: Engine, name: str) -> list[tuple]:
    move = next(s for s in _plan(ps, name).steps if isinstance(s, Move))
    if move.target == "pg":
        with psycopg.connect(pg_url) as con:
            rows = con.execute(f'SELECT o_id, o_c_id, _batch_id FROM sstore_cache."'
                               f'{move.table.split(".")[1]}"').fetchall()
    else:
        rows = [tuple(r.values()) for r in engine.query(
            f'SELECT o_id, o_c_id, _batch_id FROM {move.table}').to_pylist()]
    return sorted(rows)


def test_a_sink_fed_table_is_a_growing_source(live) -> None:
    ps, _engine, _sink, _ingest = live
    moves = {p.name: [s for s in p.steps if isinstance(s, Move)]
             for p in ps.plans(SQL, rewrite=False)}
    assert moves["migrate into stream"][0].incremental_by == "_batch_id"  # PostgreSQL's part
    assert moves["migrate into pg"][0].incremental_by == "_batch_id"      # the stream's part


@pytest.mark.parametrize("name", PLANS)
def test_ingest_between_two_queries_is_seen(live, name: str) -> None:
    """The hostile user: every plan, forced, and the planner's own choice, see a batch that
    arrived between two queries, also when the plan was made before it arrived."""
    ps, _engine, sink, ingest = live
    assert _answer(ps, name) == _expected([1, 2, 3, 4, 5, 6])
    ingest([7, 8])
    assert _answer(ps, name) == _expected([1, 2, 3, 4, 5, 6, 7, 8])
    stale_plan = _plan(ps, name)              # planned now ...
    ingest([9])                               # ... a batch arrives ...
    assert ps.run_plan(stale_plan).to_pylist()[0] == _expected(list(range(1, 10)))
    assert ps.query(SQL).to_pylist()[0] == _expected(list(range(1, 10)))
    sink.run_once()                           # the sink moves 6..9 into PostgreSQL
    live[1].collect_garbage()
    ingest([10])
    assert _answer(ps, name) == _expected(list(range(1, 11)))
    assert ps.query(SQL).to_pylist()[0] == _expected(list(range(1, 11)))


def test_refresh_moves_only_new_batches_and_equals_a_rebuild(live, pg_url: str) -> None:
    ps, engine, sink, ingest = live
    first = _moves(ps, "migrate into pg") + _moves(ps, "migrate into stream")
    assert all(done.rebuilt for _table, done in first)
    assert [done.copied for _t, done in _moves(ps, "migrate into pg")] == [0]   # unchanged
    assert [done.copied for _t, done in _moves(ps, "migrate into stream")] == [0]
    ingest([7, 8, 9])
    done = _moves(ps, "migrate into pg")
    assert [(d.copied, d.rebuilt) for _t, d in done] == [(3, False)]  # only the new batch
    sink.run_once()                          # batches 3 and 4 (ids 6..9) reach PostgreSQL
    engine.collect_garbage()
    ingest([10])
    done = _moves(ps, "migrate into stream")
    assert [(d.copied, d.rebuilt) for _t, d in done] == [(4, False)]  # only what the sink added
    done = _moves(ps, "migrate into pg")
    assert [(d.copied, d.rebuilt) for _t, d in done] == [(1, False)]  # 10; 6..9 left the copy
    for name in ("migrate into pg", "migrate into stream"):
        topped_up = _copy(pg_url, ps, engine, name)
        move = next(s for s in _plan(ps, name).steps if isinstance(s, Move))
        ps.connector(move.target).drop(move.table)
        assert [d.rebuilt for _t, d in _moves(ps, name)] == [True]
        assert _copy(pg_url, ps, engine, name) == topped_up          # same rows as a rebuild
        assert _answer(ps, name) == _expected(list(range(1, 11)))


def test_truncated_or_hand_edited_sources_are_not_served_from_the_copy(live, pg_url) -> None:
    """A TRUNCATE of the sink's target: the split object is refused while the watermark
    counts rows the table lost (it used to answer batch 3 alone, exit 0); once the sink
    starts over (the engine collected batches 1-2: a gap, accepted), no plan serves the
    cached copy of the old table's rows."""
    ps, engine, _sink, ingest = live
    assert _answer(ps, "migrate into stream") == _expected([1, 2, 3, 4, 5, 6])
    with psycopg.connect(pg_url) as con:
        con.execute("TRUNCATE public.orders_old")   # a new relfilenode: the copy is not it
    for name in PLANS:
        with pytest.raises(TargetEmptiedError, match="public.orders_old"):
            _answer(ps, name)
    StreamToPostgres(engine, "orders_in", pg_url, "public.orders_old",
                     batch_column="_batch_id", accept_gap=True).run_once()  # batch 3 again
    assert _answer(ps, "migrate into stream") == _expected([6])     # not the copy's 1..5
    assert _answer(ps, "pull into island") == _expected([6])
    _collect_by_hand(engine)                         # as garbage collection would
    ingest([11])
    assert _answer(ps, "migrate into pg") == _expected([6, 11])


def test_freshness_is_priced_by_what_changed(live) -> None:
    """A warm copy of a sink-fed table costs a watermark read whatever its size; new
    batches add their rows' cost, not a scan of the rest."""
    ps, _engine, _sink, ingest = live
    ps.run_plan(_plan(ps, "migrate into stream"))
    ps.run_plan(_plan(ps, "migrate into pg"))
    model = CostModel()
    warm = _plan(ps, "migrate into stream")
    move = next(s for s in warm.steps if isinstance(s, Move))
    assert move.cached_rows == move.rows == 5
    kinds = {"stream": "streaming", "pg": "postgres", "island": "island"}
    check = model._sum(model._move(move, kinds, 1))
    assert check == pytest.approx(model.fixed["postgres"] + model.fixed["streaming"])
    big = Move(move.source, move.sql, move.target, move.table, 10_000_000, move.columns,
               move.cache_key, 10_000_000, move.incremental_by)
    # not a scan of the source
    assert model._sum(model._move(big, kinds, 1)) == pytest.approx(check)
    ingest([7, 8])
    stream_move = next(s for s in _plan(ps, "migrate into pg").steps if isinstance(s, Move))
    assert stream_move.rows - stream_move.cached_rows == 2


def test_an_empty_source_with_an_empty_copy_is_not_copied_again(live) -> None:
    ps, engine, _sink, _ingest = live
    _collect_by_hand(engine)                         # every batch migrated and collected
    assert [d.rebuilt for _t, d in _moves(ps, "migrate into pg")] == [True]   # emptied
    assert [(d.copied, d.rebuilt) for _t, d in _moves(ps, "migrate into pg")] == [(0, False)]
    assert _answer(ps, "migrate into pg") == _expected([1, 2, 3, 4, 5])


def test_a_reused_plan_sees_rows_in_a_fragment_it_left_out_as_empty(live) -> None:
    """The plan cache: a repeated query reuses its plan, but a fragment that was left out as
    empty and has rows now sends it back to the planner."""
    ps, engine, sink, ingest = live
    sink.run_once()
    engine.collect_garbage()                       # the stream's part is empty now
    assert ps.query(SQL).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6])
    assert ps.choose(SQL).name == "in pg"           # reused from the cache
    assert ps.choose(SQL).pruned == (("stream", "orders_in"),)
    ingest([7])
    assert ps.query(SQL).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6, 7])
    assert ps.choose(SQL).name != "in pg"


def test_a_repeated_query_is_planned_afresh_every_few_runs(live) -> None:
    ps, _engine, _sink, _ingest = live
    ps.plan_cache.replan_every = 3
    first = ps.choose(SQL)
    assert ps.choose(SQL) is first and ps.choose(SQL) is first
    assert ps.choose(SQL) is not first            # the fourth run plans again
    ps.split("orders", {"stream": "orders_in"})   # another catalog: another key
    assert ps.choose(SQL).name == "in stream"


class _RacingSource:
    """A source connector through which another refresh of the same cache runs (as another
    process would) while this refresh is reading the new batches."""

    def __init__(self, real, move, target) -> None:
        self.real, self.move, self.target, self.raced = real, move, target, False

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def fetch(self, sql: str):
        rows = self.real.fetch(sql)
        if '"_batch_id" >' in sql and not self.raced:
            self.raced = True
            cache.refresh(self.move, self.real, self.target)   # the other one wins the race
        return rows


@pytest.mark.parametrize("name", ["migrate into pg", "migrate into stream"])
def test_two_refreshes_racing_do_not_append_a_batch_twice(live, pg_url: str, name: str) -> None:
    ps, engine, sink, ingest = live
    ps.run_plan(_plan(ps, name))
    ingest([7, 8])
    if name == "migrate into stream":
        sink.run_once()
        engine.collect_garbage()
        ingest([9])
    move = next(s for s in _plan(ps, name).steps if isinstance(s, Move))
    source, target = ps.connector(move.source), ps.connector(move.target)
    racing = _RacingSource(source, move, target)
    cache.refresh(move, racing, target)
    assert racing.raced
    copied = _copy(pg_url, ps, engine, name)
    assert len(copied) == len(set(copied))           # no row twice
    target.drop(move.table)
    cache.refresh(move, source, target)
    assert _copy(pg_url, ps, engine, name) == copied  # what a rebuild holds


def test_a_conditional_append_refuses_a_changed_copy(live) -> None:
    ps, _engine, _sink, _ingest = live
    ps.run_plan(_plan(ps, "migrate into pg"))
    move = next(s for s in _plan(ps, "migrate into pg").steps if isinstance(s, Move))
    target = ps.connector("pg")
    rows = ps.connector("stream").fetch(move.sql)
    with pytest.raises(CacheMoved):
        target.store(move.table, rows, mode="append", note="x", expect_note="not the note")
    assert target.row_count(move.table) == rows.num_rows      # nothing appended


def test_a_repeated_planning_reuses_its_proposals_and_plans_as_afresh(live) -> None:
    """The rules run once per query shape; a later planning re-stamps their proposals with
    the new row counts: the same plans, costs and cached rows as planning from scratch."""
    ps, _engine, _sink, ingest = live
    first = [p.describe() for p in ps.plans(SQL)]
    ingest([7, 8, 9])
    again = ps.plans(SQL)
    assert ps.proposals.hits == 1
    ps.proposals.clear()
    fresh = ps.plans(SQL)
    assert [p.describe() for p in again] == [p.describe() for p in fresh]
    assert [p.describe() for p in again] != first  # three more rows in the stream


def test_a_fragment_is_probed_in_one_question_with_its_engines_notes(live, pg_url) -> None:
    """``probe`` answers what the separate questions answer: columns, rows, a sink-fed
    table's growth (its watermark in the same question once seen), every copy's note."""
    ps, _engine, _sink, _ingest = live
    for name in ("migrate into pg", "migrate into stream"):
        ps.query(SQL, plan=name)  # both copies exist
    pg, st = ps.connector("pg"), ps.connector("stream")
    first = pg.probe("public.orders_old", "_batch_id")
    second = pg.probe("public.orders_old", "_batch_id")
    assert first == second and first.growth is not None
    assert first.growth == pg.growth_since('SELECT "_batch_id" FROM "public"."orders_old"',
                                           "_batch_id", None)
    assert first.columns == pg.columns("public.orders_old")
    assert first.notes and first.notes == {t: pg.cache_note(t) for t in first.notes}
    probed = st.probe("orders_in", "_batch_id")
    assert probed.columns == st.columns("orders_in")
    assert probed.rows == st.row_count("orders_in")
    assert probed.notes and probed.notes == {t: st.cache_note(t) for t in probed.notes}
    stream_sql = 'SELECT "o_id", "o_c_id", "_batch_id" FROM "orders_in"'
    with_growth = st.probe("orders_in", "_batch_id", [1, 3])
    assert with_growth.columns == probed.columns and with_growth.rows == probed.rows
    assert with_growth.growths == {a: st.growth_since(stream_sql, "_batch_id", a) for a in (1, 3)}
    no_column = st.probe("orders_in", "no_such_column", [1])  # asked again without it
    assert no_column.columns == probed.columns and no_column.growths == {}
    with psycopg.connect(pg_url, autocommit=True) as con:  # the watermarks went away
        con.execute("DROP TABLE sstore.watermarks")
    gone = pg.probe("public.orders_old", "_batch_id")
    assert gone.growth is None and gone.columns == first.columns
