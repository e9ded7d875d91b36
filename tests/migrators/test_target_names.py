"""One watermark per table, whatever the target's spelling.

The delivery protocol keyed its watermark row on the target string as given. A sink that had
delivered batches 1-2 into ``orders_rc`` (recorded bare) and then ``sstore migrate --table
public.orders_rc`` started a second watermark and delivered batches 1-2 again into the same
table, exit 0: ``[(1, 4), (2, 2), (3, 1)]`` for (batch, rows). Now the target is resolved in
PostgreSQL to one canonical ``schema.table`` (the table's own schema and name, or for a table
not created yet the first schema of ``search_path``); a row recorded under another spelling of
the same table is adopted (rewritten to the canonical name), and two live rows for one table
are refused, naming both.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from migrators import delivery, watermarks
from migrators.delivery import SinkKey
from migrators.engine_to_postgres import StreamToPostgres
from migrators.errors import TargetNamesConflictError
from sstore import Engine
from sstore.cli.app import main
from sstore.polystore import Polystore
from sstore.polystore.cost import CostModel

STREAM = "orders_in"


def pg(url: str, sql: str, *params: object) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as con:
        cur = con.execute(sql, params or None)
        return cur.fetchall() if cur.description else []


def new_engine(state: str) -> Engine:
    engine = Engine(state)
    engine.stream(STREAM, {"o_id": "INTEGER"})
    return engine


def batches(url: str, table: str) -> list[tuple]:
    """(batch id, rows) in ``table`` (already quoted as SQL)."""
    return pg(url, f"SELECT _batch_id, count(*) FROM {table} GROUP BY 1 ORDER BY 1")


def marks(url: str) -> list[tuple]:
    return pg(url, "SELECT target, batch_id FROM sstore.watermarks WHERE stream = %s "
                   "ORDER BY target", STREAM)


def migrate(state: str, url: str, table: str) -> object:
    return CliRunner().invoke(main, ["migrate", state, "--stream", STREAM, "--table", table,
                                     "--postgres", url])


def sink_delivers_two(tmp_path: Path, url: str, table: str) -> str:
    """A program's sink (into ``table`` as spelt) delivers batches 1-2; batch 3 commits after
    it; the program stops. Returns the state file."""
    state = str(tmp_path / "s.duckdb")
    engine = new_engine(state)
    StreamToPostgres(engine, STREAM, url, table, batch_column="_batch_id")
    engine.ingest(STREAM, [(1,), (2,)], batch_id=1)
    engine.ingest(STREAM, [(3,)], batch_id=2)
    StreamToPostgres(engine, STREAM, url, table, batch_column="_batch_id").run_once()
    engine.ingest(STREAM, [(4,)], batch_id=3)
    engine.close()
    return state


@pytest.mark.parametrize("first, then", [("orders_rc", "public.orders_rc"),
                                         ("public.orders_rc", "orders_rc"),
                                         ("orders_rc", '"public"."orders_rc"')])
def test_a_sink_then_sstore_migrate_under_another_spelling_delivers_each_batch_once(
        tmp_path: Path, pg_url: str, first: str, then: str) -> None:
    """The seam: before, the second spelling started its own watermark at 0 and delivered
    batches 1-2 again: [(1, 4), (2, 2), (3, 1)], exit 0."""
    state = sink_delivers_two(tmp_path, pg_url, first)
    result = migrate(state, pg_url, then)
    assert result.exit_code == 0, result.output
    assert batches(pg_url, "public.orders_rc") == [(1, 2), (2, 1), (3, 1)]
    assert marks(pg_url) == [("public.orders_rc", 3)]


def test_sstore_migrate_then_a_sink_under_another_spelling(tmp_path: Path,
                                                           pg_url: str) -> None:
    state = str(tmp_path / "s.duckdb")
    engine = new_engine(state)
    engine.ingest(STREAM, [(1,), (2,)], batch_id=1)
    engine.ingest(STREAM, [(3,)], batch_id=2)
    engine.close()
    result = CliRunner().invoke(main, ["migrate", state, "--stream", STREAM, "--table",
                                       "public.orders_rc", "--batch-column", "_batch_id",
                                       "--postgres", pg_url])
    assert result.exit_code == 0, result.output
    engine = Engine.open_existing(state)
    try:
        engine.ingest(STREAM, [(4,)], batch_id=3)
        StreamToPostgres(engine, STREAM, pg_url, "orders_rc", batch_column="_batch_id",
                         accept_gap=False).run_once()
    finally:
        engine.close()
    assert batches(pg_url, "public.orders_rc") == [(1, 2), (2, 1), (3, 1)]
    assert marks(pg_url) == [("public.orders_rc", 3)]


def test_a_mixed_case_name_quoted_or_not_is_one_table(tmp_path: Path, pg_url: str) -> None:
    """Unquoted parts are taken as they are written (sstore never folds case), quoted parts
    are unquoted: ``Orders_RC`` and ``"public"."Orders_RC"`` are the same table."""
    state = sink_delivers_two(tmp_path, pg_url, "Orders_RC")
    result = migrate(state, pg_url, '"public"."Orders_RC"')
    assert result.exit_code == 0, result.output
    assert batches(pg_url, '"public"."Orders_RC"') == [(1, 2), (2, 1), (3, 1)]
    assert marks(pg_url) == [("public.Orders_RC", 3)]
    assert pg(pg_url, "SELECT to_regclass('public.orders_rc')") == [(None,)]


def test_a_bare_name_in_a_schema_of_the_search_path(tmp_path: Path, pg_url: str) -> None:
    """A bare target is the table of that name the search path finds; one not created yet
    is made in the search path's first schema, and keyed by it."""
    db = pg(pg_url, "SELECT current_database()")[0][0]
    pg(pg_url, "CREATE SCHEMA wh")
    pg(pg_url, f'ALTER DATABASE "{db}" SET search_path = wh, public')
    state = sink_delivers_two(tmp_path, pg_url, "orders_rc")
    assert marks(pg_url) == [("wh.orders_rc", 2)]
    result = migrate(state, pg_url, "wh.orders_rc")
    assert result.exit_code == 0, result.output
    assert batches(pg_url, "wh.orders_rc") == [(1, 2), (2, 1), (3, 1)]
    assert marks(pg_url) == [("wh.orders_rc", 3)]
    assert pg(pg_url, "SELECT to_regclass('public.orders_rc')") == [(None,)]


def test_a_row_recorded_under_another_spelling_is_adopted(tmp_path: Path,
                                                          pg_url: str) -> None:
    """A row an older sstore recorded bare (``orders_rc``) is found by the table it was
    written for and rewritten to the canonical name, not started anew beside it."""
    state = sink_delivers_two(tmp_path, pg_url, "public.orders_rc")
    pg(pg_url, "UPDATE sstore.watermarks SET target = 'orders_rc'")  # as an older sstore did
    result = migrate(state, pg_url, "public.orders_rc")
    assert result.exit_code == 0, result.output
    assert batches(pg_url, "public.orders_rc") == [(1, 2), (2, 1), (3, 1)]
    assert marks(pg_url) == [("public.orders_rc", 3)]


def test_three_spellings_claim_one_watermark(pg_url: str) -> None:
    """``delivery.claim`` itself: the key it returns is canonical, and one row results."""
    pg(pg_url, "CREATE TABLE public.x (a int)")
    seen = set()
    with psycopg.connect(pg_url) as con:
        watermarks.ensure_watermarks(con)
        for spelling in ("x", "public.x", '"public"."x"'):
            watermark = delivery.claim(con, SinkKey("src", "s", spelling))
            seen.add(watermark.target)
    assert seen == {"public.x"}
    assert pg(pg_url, "SELECT target FROM sstore.watermarks") == [("public.x",)]


def test_two_live_rows_for_one_table_are_refused_naming_both(tmp_path: Path,
                                                             pg_url: str) -> None:
    """Two spellings both recorded, both for the table now under the name: which one counts
    cannot be known, so nothing is merged or delivered."""
    state = sink_delivers_two(tmp_path, pg_url, "public.orders_rc")
    pg(pg_url, "INSERT INTO sstore.watermarks (source, stream, target, batch_id, target_oid, "
               "rows_total) SELECT source, stream, 'orders_rc', 1, target_oid, 2 "
               "FROM sstore.watermarks")
    result = migrate(state, pg_url, "orders_rc")
    assert result.exit_code != 0
    assert "public.orders_rc" in result.output and "'orders_rc'" in result.output
    assert batches(pg_url, "public.orders_rc") == [(1, 2), (2, 1)]
    with psycopg.connect(pg_url) as con, pytest.raises(TargetNamesConflictError):
        delivery.claim(con, SinkKey(_source(pg_url), STREAM, "orders_rc"))


def _source(url: str) -> str:
    return pg(url, "SELECT DISTINCT source FROM sstore.watermarks")[0][0]


# -- the polystore finds the link whichever spelling the sink used -------------------------
SPLIT_SQL = "SELECT count(*) AS n, sum(o_id) AS s FROM orders"


def split_answer(tmp_path: Path, state: str, url: str, physical: str) -> dict:
    """A split object over the stream and ``physical``, every plan's answer (one row)."""
    engine = Engine.open_existing(state)
    ps = Polystore(str(tmp_path / "catalog.json"), costs=CostModel())
    try:
        ps.attach_engine("stream", engine)
        ps.add_postgres("pg", url)
        ps.split("orders", {"stream": STREAM, "pg": physical})
        answers = []
        for plan in ps.plans(SPLIT_SQL, rewrite=False):
            row = ps.run_plan(plan).to_pylist()[0]
            answers.append({"n": row["n"], "s": int(row["s"])})
        assert answers and all(a == answers[0] for a in answers), answers
        return answers[0]
    finally:
        ps.close()
        engine.close()


def collected_after_two(tmp_path: Path, url: str, table: str) -> str:
    """Batches 1-2 delivered into ``table`` as spelt and collected from the engine; batch 3
    only in the stream."""
    state = sink_delivers_two(tmp_path, url, table)
    engine = Engine.open_existing(state)
    engine.collect_garbage()
    assert engine.collected_through(STREAM) == 2
    engine.close()
    return state


def test_a_split_object_finds_a_quoted_sinks_watermark_by_the_bare_name(tmp_path: Path,
                                                                        pg_url: str) -> None:
    state = collected_after_two(tmp_path, pg_url, '"public"."orders_rc"')
    assert split_answer(tmp_path, state, pg_url, "orders_rc") == {"n": 4, "s": 10}


def test_a_split_object_finds_an_old_row_recorded_bare_in_a_search_path_schema(
        tmp_path: Path, pg_url: str) -> None:
    """An older sstore recorded ``orders_rc`` for the table ``wh.orders_rc`` (found through
    search_path); the catalog names it ``wh.orders_rc``: the row is the table's by its OID.
    Before, no watermark linked them (``UnlinkedFragmentsError``)."""
    db = pg(pg_url, "SELECT current_database()")[0][0]
    pg(pg_url, "CREATE SCHEMA wh")
    pg(pg_url, f'ALTER DATABASE "{db}" SET search_path = wh, public')
    state = collected_after_two(tmp_path, pg_url, "orders_rc")
    pg(pg_url, "UPDATE sstore.watermarks SET target = 'orders_rc'")  # as an older sstore did
    assert split_answer(tmp_path, state, pg_url, "wh.orders_rc") == {"n": 4, "s": 10}


def test_reset_forgets_the_watermark_under_another_spelling(tmp_path: Path,
                                                            pg_url: str) -> None:
    """``sstore migrate --reset --table public.orders_rc`` forgets the row an older sstore
    recorded as ``orders_rc`` (before, it looked for that exact string and forgot none)."""
    state = sink_delivers_two(tmp_path, pg_url, "orders_rc")
    pg(pg_url, "UPDATE sstore.watermarks SET target = 'orders_rc'")  # as an older sstore did
    pg(pg_url, "TRUNCATE public.orders_rc")
    result = CliRunner().invoke(main, ["migrate", state, "--stream", STREAM, "--table",
                                       "public.orders_rc", "--reset", "--postgres", pg_url])
    assert result.exit_code == 0, result.output
    assert "forgot 1 watermark" in result.output
    assert batches(pg_url, "public.orders_rc") == [(1, 2), (2, 1), (3, 1)]
    assert marks(pg_url) == [("public.orders_rc", 3)]
