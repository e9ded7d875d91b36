"""A sink's target dropped and created again EMPTY under its name, after the engine collected
the batches the sink had delivered into it.

The split object (an engine stream and the PostgreSQL table a sink delivers it into) reads
batches up to the sink's watermark from the table and the rest from the stream. A watermark
written for a table since dropped counts none of its batches (a new table under the name holds
none), and the sink, at its next start, finds the table replaced (or emptied) and starts its
watermark over at 0 before it refuses with ``GapError``. Either way the split object read the
stream from batch 1: the batches garbage collection had removed were in neither fragment and
missing from the answer, exit 0 (seen: 1 row of 6, ``sum`` 6 of 21, in every plan; and the same
after ``TRUNCATE`` once the sink had tried again). Now the polystore asks the engine which
batches it collected before it reads the watermark: past the batch the watermark counts, they
are lost, ``BatchesLostError`` (a ``DeliveryLostError``, terminal) names the table, the
batches and what to do. Where the engine still holds every batch, the answer is whole.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from migrators.engine_to_postgres import StreamToPostgres
from migrators.errors import IncompatibleSchemaError, MigrationError, TargetReplacedError
from sstore import Engine
from sstore.base.errors import GapError, TerminalError
from sstore.polystore import Polystore
from sstore.polystore.cost import CostModel
from sstore.polystore.delivered import (
    BatchesLostError,
    DeliveryLostError,
    TargetDroppedError,
    TargetEmptiedError,
)

SQL = "SELECT count(*) AS n, sum(o_id) AS s FROM orders"
TARGET = "public.orders_rc"
COLUMNS = "_batch_id BIGINT, o_id INTEGER, o_c_id INTEGER"  # as the sink creates it
ALL = [1, 2, 3, 4, 5, 6]
CONSUMER = f"migrator:{TARGET}"


def expected(ids: list[int]) -> dict:
    return {"n": len(ids), "s": sum(ids) if ids else None}


def answer(ps: Polystore, sql: str = SQL) -> dict:
    """The one row of ``sql``, its sum as an int (PostgreSQL's sum is numeric)."""
    row = ps.query(sql).to_pylist()[0]
    return {"n": row["n"], "s": None if row["s"] is None else int(row["s"])}


def assert_every_plan(ps: Polystore, ids: list[int]) -> None:
    """Every plan the rules propose (rewrites off: none is left out) answers ``ids``."""
    plans = ps.plans(SQL, rewrite=False)
    assert len(plans) >= 3
    for plan in plans:
        row = ps.run_plan(plan).to_pylist()[0]
        assert {"n": row["n"], "s": None if row["s"] is None else int(row["s"])} == \
            expected(ids), plan.name


def pg(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url) as con:
        cur = con.execute(sql)
        return cur.fetchall() if cur.description else []


def recreate(url: str, columns: str = COLUMNS) -> None:
    """What a user does by hand: the table dropped, an empty one made under its name."""
    with psycopg.connect(url) as con:
        con.execute(f"DROP TABLE {TARGET}")
        con.execute(f"CREATE TABLE {TARGET} ({columns})")


def sink(engine: Engine, url: str, accept_gap: bool = False) -> StreamToPostgres:
    """The split object's sink (a new one each time: as a restarted program has)."""
    return StreamToPostgres(engine, "orders_in", url, TARGET, batch_column="_batch_id",
                            accept_gap=accept_gap)


def polystore(tmp_path: Path, engine: Engine, url: str) -> Polystore:
    ps = Polystore(str(tmp_path / "catalog.json"), costs=CostModel())
    ps.attach_engine("stream", engine)
    ps.add_postgres("pg", url)
    ps.split("orders", {"stream": "orders_in", "pg": TARGET})
    return ps


@pytest.fixture
def collected(tmp_path: Path, pg_url: str) -> Iterator[tuple[Polystore, Engine]]:
    """Batches 1-2 (ids 1..5) delivered into PostgreSQL, acknowledged and collected from the
    engine; batch 3 (id 6) only in the stream. The split object answers all six rows."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    engine.stream("orders_in", {"o_id": "INTEGER", "o_c_id": "INTEGER"})
    first = sink(engine, pg_url)
    engine.ingest("orders_in", [(1, 1), (2, 2), (3, 3)], batch_id=1)
    engine.ingest("orders_in", [(4, 4), (5, 5)], batch_id=2)
    first.run_once()
    engine.collect_garbage()
    assert engine.collected_through("orders_in") == 2
    engine.ingest("orders_in", [(6, 6)], batch_id=3)
    ps = polystore(tmp_path, engine, pg_url)
    assert answer(ps) == expected(ALL)
    yield ps, engine
    ps.close()
    engine.close()


def assert_lost(ps: Polystore, batches: str = "batches 1..2") -> BatchesLostError:
    """The query and every plan refuse, naming the table, the batches and what to do."""
    with pytest.raises(BatchesLostError) as caught:
        answer(ps)
    for plan in ps.plans(SQL, rewrite=False):
        with pytest.raises(BatchesLostError):
            ps.run_plan(plan)
    message = str(caught.value)
    assert f"{batches} of stream orders_in" in message
    assert f"pg.{TARGET}" in message
    assert "--accept-gap" in message and "sstore migrate --reset" in message
    assert isinstance(caught.value, DeliveryLostError)
    assert isinstance(caught.value, TerminalError)
    return caught.value


# -- the seam -----------------------------------------------------------------------------
def test_a_target_recreated_empty_after_collection_is_a_loud_error_in_every_plan(
        collected, pg_url: str) -> None:
    """The seam: before, every plan answered {n: 1, s: 6} (batch 3 only), exit 0."""
    ps, _engine = collected
    recreate(pg_url)
    error = assert_lost(ps)
    assert "dropped and created again" in str(error)


def test_a_reused_plan_refuses_too(collected, pg_url: str) -> None:
    """The plan cache reuses the chosen plan without planning: its run checks all the same."""
    ps, _engine = collected
    replans = ps.plan_cache.replans
    recreate(pg_url)
    with pytest.raises(BatchesLostError):
        answer(ps)
    assert ps.plan_cache.replans == replans  # it was the reused plan that refused


def test_after_the_sinks_gap_error_the_split_object_still_refuses(collected,
                                                                  pg_url: str) -> None:
    """The sink's next start sees the new table, starts its watermark over at 0 (committed)
    and then refuses with ``GapError``: from then on the watermark belongs to the new table,
    so only the engine's collected mark tells the loss (before: {n: 1, s: 6}, exit 0)."""
    ps, engine = collected
    recreate(pg_url)
    with pytest.raises(GapError, match=r"batches 1\.\.2 of stream 'orders_in'"):
        sink(engine, pg_url).run_once()
    assert pg(pg_url, f"SELECT count(*) FROM {TARGET}") == [(0,)]  # nothing half-loaded
    assert pg(pg_url, "SELECT batch_id, target_oid = to_regclass('public.orders_rc')::oid "
                      "FROM sstore.watermarks") == [(0, True)]
    error = assert_lost(ps)
    assert "watermark there is at batch 0" in str(error)


def test_a_running_sink_halts_on_the_gap_and_the_split_object_refuses(collected,
                                                                      pg_url: str) -> None:
    """A continuous sink (``attach``) finds the target behind its plan at its next chunk,
    plans again, meets the gap and halts: ``flush`` raises it, ``status`` shows it."""
    ps, engine = collected
    running = sink(engine, pg_url)
    running.attach()
    try:
        assert running.flush(10)
        recreate(pg_url)
        engine.ingest("orders_in", [(7, 7)], batch_id=4)
        with pytest.raises(MigrationError, match="GapError"):
            running.flush(10)
        assert running.halted is not None
        assert pg(pg_url, f"SELECT count(*) FROM {TARGET}") == [(0,)]
        with pytest.raises(BatchesLostError, match=r"batches 1\.\.2"):
            answer(ps)
    finally:
        running.detach()


def test_accepting_the_gap_lets_the_split_object_answer_what_is_left(collected,
                                                                     pg_url: str) -> None:
    """Accepted on purpose, the gap is recorded in the engine and the watermark moves past
    it: the split object answers the batches that still exist, every row once."""
    ps, engine = collected
    recreate(pg_url)
    with pytest.raises(BatchesLostError):
        answer(ps)
    sink(engine, pg_url, accept_gap=True).run_once()
    gaps = engine.consumers()[0].gaps
    assert [(g["first_batch"], g["last_batch"]) for g in gaps] == [(1, 2)]
    assert answer(ps) == expected([6])
    assert_every_plan(ps, [6])
    engine.ingest("orders_in", [(7, 7)], batch_id=4)
    assert answer(ps) == expected([6, 7])


def test_restoring_the_rows_and_moving_the_watermark_as_the_error_says(collected,
                                                                       pg_url: str) -> None:
    """The other way out the error gives: the rows restored (here: written again by hand),
    then its one UPDATE of the watermark. The answer is whole again, and the sink goes on."""
    ps, engine = collected
    recreate(pg_url)
    error = str(assert_lost(ps))
    pg(pg_url, f"INSERT INTO {TARGET} VALUES (1, 1, 1), (1, 2, 2), (1, 3, 3), (2, 4, 4), "
               f"(2, 5, 5)")
    update = error[error.index("UPDATE sstore.watermarks"):error.index("; or accept")]
    pg(pg_url, update)
    assert answer(ps) == expected(ALL)
    engine.ingest("orders_in", [(7, 7)], batch_id=4)
    assert sink(engine, pg_url).run_once().rows == 2  # batches 3 and 4: nothing twice
    assert pg(pg_url, f"SELECT count(*), count(DISTINCT o_id) FROM {TARGET}") == [(7, 7)]
    assert answer(ps) == expected([*ALL, 7])


def test_only_the_collected_batches_are_named(tmp_path: Path, pg_url: str) -> None:
    """Batch 1 collected, batch 2 delivered but still in the engine: only batch 1 is lost."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    engine.stream("orders_in", {"o_id": "INTEGER", "o_c_id": "INTEGER"})
    engine.ingest("orders_in", [(1, 1), (2, 2), (3, 3)], batch_id=1)
    sink(engine, pg_url).run_once()
    engine.collect_garbage()
    engine.ingest("orders_in", [(4, 4), (5, 5)], batch_id=2)
    sink(engine, pg_url).run_once()
    assert engine.collected_through("orders_in") == 1
    ps = polystore(tmp_path, engine, pg_url)
    try:
        assert answer(ps) == expected([1, 2, 3, 4, 5])
        recreate(pg_url)
        with pytest.raises(BatchesLostError, match=r"^batch 1 of stream orders_in"):
            answer(ps)
    finally:
        ps.close()
        engine.close()


# -- where the data is still there, the answer is whole -----------------------------------
def delivered_none_collected(tmp_path: Path, pg_url: str) -> tuple[Engine, Polystore]:
    """Batches 1-2 delivered (nothing collected: the engine still holds them), batch 3 only
    in the stream; the engine and a polystore over it."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    engine.stream("orders_in", {"o_id": "INTEGER", "o_c_id": "INTEGER"})
    engine.ingest("orders_in", [(1, 1), (2, 2), (3, 3)], batch_id=1)
    engine.ingest("orders_in", [(4, 4), (5, 5)], batch_id=2)
    sink(engine, pg_url).run_once()
    engine.ingest("orders_in", [(6, 6)], batch_id=3)
    return engine, polystore(tmp_path, engine, pg_url)


def test_a_target_recreated_while_the_engine_holds_every_batch_answers_whole(
        tmp_path: Path, pg_url: str) -> None:
    """Nothing collected: the new table counts no batch, the stream has them all, so every
    plan answers every row once; the sink then refills the table and it still does."""
    engine, ps = delivered_none_collected(tmp_path, pg_url)
    try:
        assert answer(ps) == expected(ALL)
        recreate(pg_url)
        assert answer(ps) == expected(ALL)
        assert_every_plan(ps, ALL)
        assert sink(engine, pg_url).run_once().rows == 6
        assert answer(ps) == expected(ALL)
        assert_every_plan(ps, ALL)
    finally:
        ps.close()
        engine.close()


# -- the variants ---------------------------------------------------------------------------
def assert_dropped(ps: Polystore, lost: str | None = "Batches 1..2") -> TargetDroppedError:
    """The reused plan, a planning afresh and every plan refuse with ``TargetDroppedError``
    (before: psycopg's ``UndefinedTable``), naming the table, the sink, the lost batches and
    what to do."""
    with pytest.raises(TargetDroppedError) as caught:
        answer(ps)
    ps.plan_cache.entries.clear()
    with pytest.raises(TargetDroppedError):
        answer(ps)  # planned afresh: the probe of the table is where it fails
    message = str(caught.value)
    assert message.startswith(f"pg.{TARGET} does not exist: the table the sink of stream "
                              f"orders_in delivers into was dropped; the sink's watermark "
                              f"says batches up to 2 had been delivered into it"), message
    if lost is None:
        assert "still holds every batch" in message
    else:
        assert f"{lost} of the stream went with it" in message
        assert "--accept-gap" in message and "UPDATE sstore.watermarks" in message
    assert isinstance(caught.value, DeliveryLostError)
    assert isinstance(caught.value, TerminalError)
    assert not isinstance(caught.value, psycopg.Error)
    return caught.value


def test_a_target_dropped_and_not_recreated(collected, pg_url: str) -> None:
    """No table under the name: the split object cannot be read at all, and says so as an
    sstore error naming the lost batches (before: PostgreSQL's ``UndefinedTable``, from the
    run's emptiness check or from planning's probe). The sink creates it again, then meets
    the gap; from then on the table exists, empty, and the split object refuses with the
    lost batches."""
    ps, engine = collected
    pg(pg_url, f"DROP TABLE {TARGET}")
    assert_dropped(ps)
    with pytest.raises(TargetDroppedError):
        ps.plans(SQL, rewrite=False)  # no plan to run: planning itself refuses
    with pytest.raises(GapError, match=r"batches 1\.\.2"):
        sink(engine, pg_url).run_once()
    assert pg(pg_url, f"SELECT count(*) FROM {TARGET}") == [(0,)]  # made by the sink
    assert_lost(ps)


def test_a_target_dropped_while_the_engine_holds_every_batch(tmp_path: Path,
                                                            pg_url: str) -> None:
    """Nothing collected: nothing is lost, but the table the plan reads is gone. The error
    says so and what to do (run the sink); after the sink ran the answer is whole."""
    engine, ps = delivered_none_collected(tmp_path, pg_url)
    try:
        assert answer(ps) == expected(ALL)
        pg(pg_url, f"DROP TABLE {TARGET}")
        assert_dropped(ps, lost=None)
        assert sink(engine, pg_url).run_once().rows == 6
        assert answer(ps) == expected(ALL)
    finally:
        ps.close()
        engine.close()


def test_a_dropped_target_read_without_its_stream(collected, pg_url: str) -> None:
    """Everything delivered and collected: the plan reads the table alone and checks it
    first (``checks``). Dropped, that check refuses (before: the plan's SQL raised
    ``UndefinedTable``)."""
    ps, engine = collected
    sink(engine, pg_url).run_once()
    engine.collect_garbage()
    ps.plan_cache.entries.clear()
    assert answer(ps) == expected(ALL)
    assert [(len(p.guards), len(p.checks)) for p in ps.plans(SQL)] == [(0, 1)]
    pg(pg_url, f"DROP TABLE {TARGET}")
    with pytest.raises(TargetDroppedError, match=r"Batches 1\.\.3 of the stream went"):
        answer(ps)


def test_a_target_recreated_with_an_extra_column(collected, pg_url: str) -> None:
    """A column more (nullable): the sink could fill it, but the batches are lost all the
    same: refused like the same columns."""
    ps, engine = collected
    recreate(pg_url, COLUMNS + ", note TEXT")
    assert_lost(ps)
    with pytest.raises(GapError):
        sink(engine, pg_url).run_once()
    assert_lost(ps)


def test_a_target_recreated_without_a_column_the_stream_has(collected, pg_url: str) -> None:
    """A column fewer: the sink refuses the table by the column's name before it touches
    the watermark (so the watermark still counts the old table), also when told to accept
    the gap; the split object refuses with the lost batches, whichever columns the query
    names (the check runs before any of its SQL)."""
    ps, engine = collected
    recreate(pg_url, "_batch_id BIGINT, o_id INTEGER")
    for accept_gap in (False, True):
        with pytest.raises(IncompatibleSchemaError, match="o_c_id"):
            sink(engine, pg_url, accept_gap=accept_gap).run_once()
    assert pg(pg_url, "SELECT batch_id FROM sstore.watermarks") == [(2,)]
    assert_lost(ps)
    with pytest.raises(BatchesLostError, match=r"^batches 1\.\.2"):
        answer(ps, "SELECT count(*) AS n, sum(o_c_id) AS s FROM orders")


def test_a_truncated_target_refuses_also_after_the_sinks_gap_error(collected,
                                                                   pg_url: str) -> None:
    """The neighbouring case (tests/polystore/test_split_truncate.py): emptied in place, it is a
    ``TargetEmptiedError`` until the sink's next start resets the watermark and refuses
    with ``GapError``; after that the emptied check has nothing to see (the watermark counts
    no rows) and the split object answered batch 3 alone. Now the lost batches are named."""
    ps, engine = collected
    pg(pg_url, f"TRUNCATE {TARGET}")
    with pytest.raises(TargetEmptiedError):
        answer(ps)
    with pytest.raises(GapError):
        sink(engine, pg_url).run_once()
    assert_lost(ps)


def test_a_reset_watermark_then_the_sinks_gap_error(collected, pg_url: str) -> None:
    """``sstore migrate --reset`` forgets the watermark (after the rows, as a user who
    starts over does): the plan made with it refuses, planning finds the objects unlinked
    until a sink runs again, which writes a new watermark at 0 and refuses with the gap;
    the split object then names the lost batches."""
    from migrators import watermarks
    from sstore.polystore.delivered import UnlinkedFragmentsError
    ps, engine = collected
    pg(pg_url, f"TRUNCATE {TARGET}")  # first: a reset onto its rows is refused (appended
    with psycopg.connect(pg_url) as con:  # again, each would be there twice)
        assert watermarks.reset(con, "orders_in", TARGET) == 1
    engine.rewind(CONSUMER, 0)
    with pytest.raises(DeliveryLostError, match="is gone"):
        answer(ps)  # the reused plan
    with pytest.raises(UnlinkedFragmentsError):
        answer(ps)  # planned afresh
    with pytest.raises(GapError):
        sink(engine, pg_url).run_once()
    assert_lost(ps)


def test_batches_collected_after_the_sinks_hold_was_dropped(collected, pg_url: str) -> None:
    """Not a recreated table: the sink's hold dropped (``sstore consumers drop``) before it
    delivered batch 3, and the engine collected it (the newest, batch 4, it keeps). Batch 3
    is in neither fragment; the table keeps batches 1-2 and its watermark, which the check
    compares with."""
    ps, engine = collected
    engine.ingest("orders_in", [(7, 7)], batch_id=4)
    assert engine.drop_consumer("orders_in", CONSUMER)
    engine.collect_garbage()
    assert engine.collected_through("orders_in") == 3
    with pytest.raises(BatchesLostError, match=r"^batch 3 of stream orders_in") as e:
        answer(ps)
    assert "watermark there is at batch 2" in str(e.value)


def test_a_rebuilt_target_read_without_its_stream_is_refused_as_replaced(
        collected, pg_url: str) -> None:
    """Everything delivered and collected, so plans read the table alone (``checks``). A
    table rebuilt by copy under the name is ``TargetReplacedError`` there too, as where the
    stream is read (tests/migrators/test_rebuilt_target.py), not a loss: it holds rows, which ones
    is unknown. Recreated empty instead, the batches are lost."""
    ps, engine = collected
    sink(engine, pg_url).run_once()
    engine.collect_garbage()
    ps.plan_cache.entries.clear()  # planned anew: the stream is empty, the table read alone
    assert answer(ps) == expected(ALL)
    assert [len(p.checks) for p in ps.plans(SQL)] == [1]
    with psycopg.connect(pg_url) as con:
        con.execute(f"CREATE TABLE {TARGET}_new AS SELECT * FROM {TARGET}")
        con.execute(f"DROP TABLE {TARGET}")
        con.execute(f"ALTER TABLE {TARGET}_new RENAME TO orders_rc")
    with pytest.raises(TargetReplacedError, match="holds rows"):
        answer(ps)
    pg(pg_url, f"TRUNCATE {TARGET}")
    with pytest.raises(BatchesLostError, match=r"^batches 1\.\.3"):
        answer(ps)
    ps.plan_cache.entries.clear()
    with pytest.raises(BatchesLostError, match=r"^batches 1\.\.3"):
        answer(ps)  # planned afresh


# -- from the command line: a state file, sstore migrate, sstore query -------------------
def sstore_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-m", "sstore.cli", *args], check=False,
                          capture_output=True, text=True, env=env, timeout=120)


def test_sstore_query_over_a_state_file_exits_with_the_error(tmp_path: Path,
                                                             pg_url: str) -> None:
    """The user's path: `sstore migrate` delivered batches 1-2, the program collected them
    and stopped; the table is recreated by hand. `sstore query` over the state file used to
    print 1 row of 6 and exit 0; now it exits 1 with the error. `sstore migrate` refuses
    with the gap, and with `--accept-gap` the query answers what is left."""
    state = str(tmp_path / "s.duckdb")
    catalog = str(tmp_path / "catalog.json")
    engine = Engine(state)
    engine.stream("orders_in", {"o_id": "INTEGER", "o_c_id": "INTEGER"})
    engine.ingest("orders_in", [(1, 1), (2, 2), (3, 3)], batch_id=1)
    engine.ingest("orders_in", [(4, 4), (5, 5)], batch_id=2)
    engine.close()
    migrate = ["migrate", state, "--stream", "orders_in", "--table", TARGET,
               "--postgres", pg_url]
    done = sstore_cli(*migrate)
    assert done.returncode == 0, done.stderr
    with Engine.open_existing(state) as again:
        again.collect_garbage()
        assert again.collected_through("orders_in") == 2
        again.ingest("orders_in", [(6, 6)], batch_id=3)
    with Polystore(catalog) as ps:
        ps.add_state_file("stream", state)
        ps.add_postgres("pg", pg_url)
        ps.split("orders", {"stream": "orders_in", "pg": TARGET})
    query = ["query", "--catalog", catalog, SQL, "--format", "json"]
    asked = sstore_cli(*query)
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)[0]["n"] == 6
    pg(pg_url, f"DROP TABLE {TARGET}")
    asked = sstore_cli(*query)  # dropped, not created again: an sstore error, not psycopg's
    assert asked.returncode == 1, asked.stdout
    assert f"pg.{TARGET} does not exist" in asked.stderr
    assert "Batches 1..2 of the stream went with it" in asked.stderr
    assert "Traceback" not in asked.stderr and asked.stdout == ""
    pg(pg_url, f"CREATE TABLE {TARGET} (o_id INTEGER, o_c_id INTEGER)")  # as migrate made it
    asked = sstore_cli(*query)
    assert asked.returncode == 1, asked.stdout
    assert "batches 1..2 of stream orders_in" in asked.stderr and asked.stdout == ""
    refused = sstore_cli(*migrate)
    assert refused.returncode == 1 and "batches 1..2" in refused.stderr
    assert sstore_cli(*query).returncode == 1
    accepted = sstore_cli(*migrate, "--accept-gap")
    assert accepted.returncode == 0, accepted.stderr
    asked = sstore_cli(*query)
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)[0]["n"] == 1


# -- the UPDATE the error prints, run as printed ------------------------------------------
@pytest.mark.parametrize(("sink_target", "catalog_target"), [
    ("public.orders_rc", "public.orders_rc"), ("orders_rc", "orders_rc"),
    ("orders_rc", "public.orders_rc"), ("public.orders_rc", "orders_rc")])
def test_the_printed_update_moves_the_sinks_watermark_row(tmp_path: Path, pg_url: str,
                                                         sink_target: str,
                                                         catalog_target: str) -> None:
    """A sink given a bare name records the table's canonical name (``public.orders_rc``)
    in ``sstore.watermarks`` (an older sstore recorded it bare), and the catalog may spell the
    table either way (the polystore matches both). Before, the printed UPDATE
    matched the catalog's spelling only: with the other one it moved no row (UPDATE 0) and
    the split object then refused the restored table as replaced. Run as printed, it moves
    exactly the sink's row (not a watermark of the same stream into another schema's table
    of the same name), and the sink goes on from it."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    engine.stream("orders_in", {"o_id": "INTEGER", "o_c_id": "INTEGER"})
    engine.ingest("orders_in", [(1, 1), (2, 2), (3, 3)], batch_id=1)
    engine.ingest("orders_in", [(4, 4), (5, 5)], batch_id=2)
    StreamToPostgres(engine, "orders_in", pg_url, sink_target,
                     batch_column="_batch_id").run_once()
    engine.collect_garbage()
    engine.ingest("orders_in", [(6, 6)], batch_id=3)
    pg(pg_url, "INSERT INTO sstore.watermarks (source, stream, target, batch_id) VALUES "
               "('another', 'orders_in', 'shadow.orders_rc', 1)")  # must not move
    ps = Polystore(str(tmp_path / "catalog.json"), costs=CostModel())
    try:
        ps.attach_engine("stream", engine)
        ps.add_postgres("pg", pg_url)
        ps.split("orders", {"stream": "orders_in", "pg": catalog_target})
        assert answer(ps) == expected(ALL)
        recreate(pg_url)
        with pytest.raises(BatchesLostError) as caught:
            answer(ps)
        error = str(caught.value)
        pg(pg_url, f"INSERT INTO {TARGET} VALUES (1, 1, 1), (1, 2, 2), (1, 3, 3), "
                   f"(2, 4, 4), (2, 5, 5)")
        update = error[error.index("UPDATE sstore.watermarks"):error.index("; or accept")]
        with psycopg.connect(pg_url) as con:
            assert con.execute(update).rowcount == 1, update
        assert pg(pg_url, "SELECT target, batch_id, rows_total, target_oid = "
                          "to_regclass('public.orders_rc')::oid FROM sstore.watermarks "
                          "WHERE source <> 'another'") == [(TARGET, 2, 5, True)]
        assert pg(pg_url, "SELECT batch_id, target_oid FROM sstore.watermarks WHERE "
                          "source = 'another'") == [(1, None)]
        assert answer(ps) == expected(ALL)
        assert StreamToPostgres(engine, "orders_in", pg_url, sink_target,
                                batch_column="_batch_id").run_once().rows == 1  # batch 3
        assert pg(pg_url, f"SELECT count(*), count(DISTINCT o_id) FROM {TARGET}") == [(6, 6)]
        assert answer(ps) == expected(ALL)
    finally:
        ps.close()
        engine.close()


def test_the_printed_update_after_the_sinks_gap_error_counts_the_restored_rows(
        collected, pg_url: str) -> None:
    """After the sink's failed start the watermark counts no rows (it started over). The
    printed UPDATE sets the rows the restored table holds, so emptying it again later is
    noticed (``TargetEmptiedError``) instead of the split object answering batch 3 alone."""
    ps, engine = collected
    recreate(pg_url)
    with pytest.raises(GapError):
        sink(engine, pg_url).run_once()
    error = str(assert_lost(ps))
    pg(pg_url, f"INSERT INTO {TARGET} VALUES (1, 1, 1), (1, 2, 2), (1, 3, 3), (2, 4, 4), "
               f"(2, 5, 5)")
    pg(pg_url, error[error.index("UPDATE sstore.watermarks"):error.index("; or accept")])
    assert pg(pg_url, "SELECT batch_id, rows_total FROM sstore.watermarks") == [(2, 5)]
    assert answer(ps) == expected(ALL)
    pg(pg_url, f"TRUNCATE {TARGET}")
    with pytest.raises(TargetEmptiedError):
        answer(ps)


# -- what a failed start says ----------------------------------------------------------------
@pytest.mark.parametrize("how", ["recreated", "truncated"])
def test_every_failed_start_names_the_batch_delivered_before_the_reset(
        collected, pg_url: str, caplog: pytest.LogCaptureFixture, how: str) -> None:
    """The sink's first start after the target lost its rows commits its watermark's reset
    to 0, then refuses with ``GapError``; PostgreSQL no longer knows that batches up to 2
    had been delivered. Before, a later start's ``GapError`` gave only the generic reasons,
    and a start after the table was recreated once more logged "dropped or recreated since
    batch 0 was delivered". Now every start's error names batch 2 (the engine's
    acknowledgement keeps it: a failed start never moves it back), and no line says batch 0
    was delivered. The reset itself is unchanged: the watermark is 0, for the new table."""
    _ps, engine = collected
    if how == "recreated":
        recreate(pg_url)
    else:
        pg(pg_url, f"TRUNCATE {TARGET}")
    caplog.set_level(logging.INFO, logger="sstore.migrators")
    messages = []
    for again in ("the same", "recreated again", "the same"):
        with pytest.raises(GapError, match=r"batches 1\.\.2 of stream 'orders_in'") as gap:
            sink(engine, pg_url).run_once()
        messages.append(str(gap.value))
        assert pg(pg_url, "SELECT batch_id, rows_total, target_oid = "
                          "to_regclass('public.orders_rc')::oid FROM sstore.watermarks") == \
            [(0, 0, True)]
        if again == "recreated again":
            recreate(pg_url)
    assert engine.acknowledged(CONSUMER) == 2
    for message in messages:
        assert f"delivered into {TARGET} up to batch 2" in message, message
        assert "holds batches up to 0 only" in message, message
    logged = [r.getMessage() for r in caplog.records]
    assert not [line for line in logged if "since batch 0" in line], logged
    assert any("since batch 2 was delivered" in line for line in logged), logged


def test_a_running_sink_behind_a_reset_target_names_no_batch_0(
        collected, pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A sink that planned from batch 2, while another start reset the watermark to 0 and
    the table was then recreated once more: its delivery finds the target behind its plan
    (``TargetBehind``, logged, then it plans again and refuses with the gap). Before, that
    line said "dropped or recreated since batch 0 was delivered"."""
    _ps, engine = collected
    running = sink(engine, pg_url)
    assert running.start() == 2
    recreate(pg_url)
    with pytest.raises(GapError):
        sink(engine, pg_url).run_once()  # the reset to 0, committed
    recreate(pg_url)
    caplog.set_level(logging.INFO, logger="sstore.migrators")
    with pytest.raises(GapError, match=f"delivered into {TARGET} up to batch 2"):
        running.run_pending()
    logged = [r.getMessage() for r in caplog.records]
    assert any("started over already" in line and "planning again" in line
               for line in logged), logged
    assert not [line for line in logged if "since batch 0" in line], logged
