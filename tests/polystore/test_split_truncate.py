"""A split object whose PostgreSQL target was emptied by hand is not read as if it were whole.

The split object a running system has: an engine stream and the PostgreSQL table a sink
(``StreamToPostgres``) delivers it into; batches up to the sink's watermark are read from the
table, the rest from the stream. A user who empties the table by hand (``TRUNCATE``,
``DELETE FROM`` without WHERE) while the watermark still says batches 1..N were delivered used
to get only the stream's batches above the watermark, with no error, until the sink's next
delivery noticed the emptied table (``migrators.delivery._emptied``). The polystore now
checks, in the watermark questions it already asks, that a target whose watermark counts
delivered rows still has one: an emptied one is a ``TargetEmptiedError`` (a
``DeliveryLostError``) naming the table, the watermark and what to do.
"""

from __future__ import annotations

import psycopg
import pytest

from migrators.engine_to_postgres import StreamToPostgres
from sstore import Engine
from sstore.base.errors import GapError, TerminalError
from sstore.polystore import Polystore
from sstore.polystore.cost import CostModel
from sstore.polystore.delivered import DeliveryLostError, TargetEmptiedError

SQL = "SELECT count(*) AS n, sum(o_id) AS s FROM orders"
TARGET = "public.orders_tr"
EMPTY_BY_HAND = {"truncate": f"TRUNCATE {TARGET}", "delete": f"DELETE FROM {TARGET}"}


def _expected(ids: list[int]) -> dict:
    return {"n": len(ids), "s": sum(ids) if ids else None}


def _pg(url: str, sql: str) -> None:
    with psycopg.connect(url) as con:
        con.execute(sql)


@pytest.fixture
def split(tmp_path, pg_url: str):
    """(polystore, engine, sink). Batches 1-2 (ids 1..5) delivered into PostgreSQL and not
    yet collected from the stream; batch 3 (id 6) only in the stream."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    engine.stream("orders_in", {"o_id": "INTEGER", "o_c_id": "INTEGER"})
    sink = StreamToPostgres(engine, "orders_in", pg_url, TARGET, batch_column="_batch_id")
    engine.ingest("orders_in", [(1, 1), (2, 2), (3, 3)], batch_id=1)
    engine.ingest("orders_in", [(4, 4), (5, 5)], batch_id=2)
    sink.run_once()
    engine.ingest("orders_in", [(6, 6)], batch_id=3)
    ps = Polystore(str(tmp_path / "catalog.json"), costs=CostModel())
    ps.attach_engine("stream", engine)
    ps.add_postgres("pg", pg_url)
    ps.split("orders", {"stream": "orders_in", "pg": TARGET})
    yield ps, engine, sink
    ps.close()
    engine.close()


@pytest.mark.parametrize("how", sorted(EMPTY_BY_HAND))
def test_a_target_emptied_by_hand_is_a_loud_error_in_every_plan(split, pg_url: str,
                                                                how: str) -> None:
    """The seam: before, ``ps.query`` answered {n: 1, s: 6} (batch 3 only), exit 0."""
    ps, _engine, _sink = split
    assert ps.query(SQL).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6])
    _pg(pg_url, EMPTY_BY_HAND[how])
    with pytest.raises(TargetEmptiedError) as caught:
        ps.query(SQL)
    message = str(caught.value)
    assert TARGET in message and "batch 2" in message and "5 rows" in message
    assert "sstore migrate --reset" in message
    assert isinstance(caught.value, DeliveryLostError)
    assert isinstance(caught.value, TerminalError)


@pytest.mark.parametrize("how", sorted(EMPTY_BY_HAND))
def test_a_plan_made_before_the_target_was_emptied_refuses_to_run(split, pg_url: str,
                                                                 how: str) -> None:
    """Planned while the table was whole (caches warm), emptied before the run: every plan's
    run checks it with the watermark it reads anyway."""
    ps, _engine, _sink = split
    plans = ps.plans(SQL, rewrite=False)
    assert len(plans) >= 3
    for plan in plans:
        assert ps.run_plan(plan).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6]), plan.name
    _pg(pg_url, EMPTY_BY_HAND[how])
    for plan in plans:
        with pytest.raises(TargetEmptiedError, match=TARGET):
            ps.run_plan(plan)


def test_a_reused_plan_refuses_to_run(split, pg_url: str) -> None:
    """The plan cache reuses the chosen plan without planning: its run still checks."""
    ps, _engine, _sink = split
    assert ps.query(SQL).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6])
    replans = ps.plan_cache.replans
    _pg(pg_url, f"TRUNCATE {TARGET}")
    with pytest.raises(TargetEmptiedError):
        ps.query(SQL)
    assert ps.plan_cache.replans == replans  # it was the reused plan that refused


def test_the_target_emptied_during_the_run_is_caught_by_the_second_read(split,
                                                                       pg_url: str) -> None:
    ps, _engine, _sink = split
    plan = {p.name: p for p in ps.plans(SQL, rewrite=False)}["pull into island"]
    connector = ps.connector("pg")
    real = connector.fetch
    emptied: list[bool] = []

    def hooked(sql: str) -> object:
        answer = real(sql)
        if not emptied:
            _pg(pg_url, f"TRUNCATE {TARGET}")
            emptied.append(True)
        return answer
    connector.fetch = hooked  # type: ignore[method-assign]
    with pytest.raises(TargetEmptiedError):
        ps.run_plan(plan)


def test_the_sinks_next_delivery_makes_it_whole_again(split, pg_url: str) -> None:
    """The engine still holds batches 1-2: the sink notices the emptied table, delivers them
    again, and the split object answers every row once."""
    ps, engine, sink = split
    _pg(pg_url, f"TRUNCATE {TARGET}")
    with pytest.raises(TargetEmptiedError):
        ps.query(SQL)
    engine.ingest("orders_in", [(7, 7)], batch_id=4)
    sink.run_once()
    assert ps.query(SQL).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6, 7])
    for plan in ps.plans(SQL, rewrite=False):
        assert ps.run_plan(plan).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6, 7]), plan.name


def test_an_emptied_target_whose_batches_were_collected_is_refused_until_the_gap_is_accepted(
        split, pg_url: str) -> None:
    """Batches 1-2 are gone from the engine too: the rows are lost. The polystore says so
    (at planning now: the stream is empty, so no plan reads it), and so does the sink
    (``GapError``) until the gap is accepted; then the watermark starts over and the
    split object answers what is left."""
    ps, engine, sink = split
    sink.run_once()
    engine.collect_garbage()               # batches 1-3 delivered and collected
    assert ps.query(SQL).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6])
    assert [len(p.checks) for p in ps.plans(SQL)] == [1]  # the table alone, checked
    _pg(pg_url, f"TRUNCATE {TARGET}")
    with pytest.raises(TargetEmptiedError, match="batch 3"):
        ps.query(SQL)                       # the reused plan reads the table alone
    ps.plan_cache.entries.clear()
    with pytest.raises(TargetEmptiedError, match="batch 3"):
        ps.query(SQL)                       # planned afresh
    engine.ingest("orders_in", [(7, 7)], batch_id=4)
    with pytest.raises(GapError):
        sink.run_once()
    StreamToPostgres(engine, "orders_in", pg_url, TARGET, batch_column="_batch_id",
                     accept_gap=True).run_once()
    assert ps.query(SQL).to_pylist()[0] == _expected([7])


def test_a_watermark_that_counts_no_rows_over_an_empty_table_is_fine(tmp_path,
                                                                     pg_url: str) -> None:
    """A sink that delivered only empty batches: the table is empty and nothing was lost."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    engine.stream("orders_in", {"o_id": "INTEGER", "o_c_id": "INTEGER"})
    sink = StreamToPostgres(engine, "orders_in", pg_url, TARGET, batch_column="_batch_id")
    engine.ingest("orders_in", [], batch_id=1)
    sink.run_once()
    engine.ingest("orders_in", [(1, 1), (2, 2)], batch_id=2)
    ps = Polystore(str(tmp_path / "catalog.json"), costs=CostModel())
    try:
        ps.attach_engine("stream", engine)
        ps.add_postgres("pg", pg_url)
        ps.split("orders", {"stream": "orders_in", "pg": TARGET})
        assert ps.query(SQL).to_pylist()[0] == _expected([1, 2])
        for plan in ps.plans(SQL, rewrite=False):
            assert ps.run_plan(plan).to_pylist()[0] == _expected([1, 2]), plan.name
    finally:
        ps.close()
        engine.close()


def test_a_partial_delete_is_not_detected(split, pg_url: str) -> None:
    """What is NOT detected (docs/polystore.md): the watermark records how many rows the sink
    wrote, not which are still there; telling a partly emptied table from a whole one takes a
    count of the table on every query. The answer then lacks the deleted rows."""
    ps, _engine, _sink = split
    _pg(pg_url, f"DELETE FROM {TARGET} WHERE o_id <= 3")
    assert ps.query(SQL).to_pylist()[0] == _expected([4, 5, 6])


def test_the_check_of_a_plan_reading_the_table_alone_needs_no_watermark(split,
                                                                        pg_url: str) -> None:
    """Its SQL does not depend on the watermark: a watermark gone is not its error (deleted
    by hand here: ``watermarks.reset`` refuses to forget it while the appended rows are
    there)."""
    ps, engine, sink = split
    sink.run_once()
    engine.collect_garbage()
    assert ps.query(SQL).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6])
    with psycopg.connect(pg_url) as con:
        assert con.execute("DELETE FROM sstore.watermarks WHERE stream = 'orders_in'"
                           ).rowcount == 1
    assert ps.query(SQL).to_pylist()[0] == _expected([1, 2, 3, 4, 5, 6])  # the reused plan
