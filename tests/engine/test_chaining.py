"""Chained SQL procedures (``sstore.dataflow.fusion``): one statement per chain, the same rows out.

Every test runs the same dataflow twice, chained and with ``chain_sql=False``, and compares
everything downstream; the ways a user can break a chain (a bad row in the middle of it, a
halted reader, a second reader, a type the SQL does not return exactly) must give the outcome
of the unchained run, blamed on the same procedure.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from sstore import Engine
from sstore.base.errors import ChainedBatchError, DeclarationError
from sstore.execution.runtime import CommitEvent

PARSE = "SELECT id, CAST(text AS INTEGER) AS v FROM batch"
DOUBLE = """
-- a comment before the query, and a WITH of its own
WITH t AS (SELECT id, v FROM batch) SELECT id, v * 2 AS v, 100 // v AS inverse FROM t"""
LABEL = "SELECT id, v, inverse, 'v=' || v AS label FROM batch ORDER BY id"


def declare(engine: Engine, *, on_error: str = "halt") -> None:
    engine.stream("raw", {"id": "BIGINT", "text": "VARCHAR"})
    engine.stream("parsed", {"id": "BIGINT", "v": "INTEGER"})
    engine.stream("doubled", {"id": "BIGINT", "v": "INTEGER", "inverse": "INTEGER"})
    engine.stream("labelled", {"id": "BIGINT", "v": "INTEGER", "inverse": "INTEGER",
                               "label": "VARCHAR"})
    engine.execute("CREATE TABLE IF NOT EXISTS sink (batch_id BIGINT, id BIGINT, v INTEGER, "
                   "inverse INTEGER, label VARCHAR)")
    engine.sql_procedure("parse", PARSE, input="raw", output="parsed", on_error=on_error)
    engine.sql_procedure("double", DOUBLE, input="parsed", output="doubled", on_error=on_error)
    engine.sql_procedure("label", LABEL, input="doubled", output="labelled", on_error=on_error)

    @engine.procedure(input="labelled")
    def keep(tx, batch):
        tx.execute("INSERT INTO sink SELECT ?, * FROM batch", tx.batch_id)


def rows(batch: int, n: int = 5, bad: str | None = None) -> list[tuple[int, str]]:
    out = [(batch * 100 + i, str(batch + i)) for i in range(n)]
    if bad is not None:
        out[2] = (out[2][0], bad)
    return out


def run(path: str, batches: list[list[tuple[int, str]]], *, chain: bool, fused: bool = True,
        on_error: str = "halt") -> tuple[Engine, list[CommitEvent]]:
    engine = Engine(path, chain_sql=chain)
    declare(engine, on_error=on_error)
    events: list[CommitEvent] = []
    engine.observe(events.append)
    for batch_id, batch in enumerate(batches, start=1):
        if fused:
            engine.ingest_and_run("raw", batch, batch_id=batch_id)
        else:
            engine.ingest("raw", batch, batch_id=batch_id)
            engine.run_until_idle()
    engine.run_until_idle()
    return engine, events


def state(engine: Engine) -> dict[str, object]:
    return {
        "sink": engine.query("SELECT * FROM sink ORDER BY ALL").to_pylist(),
        "errors": engine.query("SELECT procedure, batch_id, action FROM sstore_sys.errors "
                               "ORDER BY ALL").to_pylist(),
        "halted": sorted(engine._runtime().scheduler.halted),
    }


def chained_members(events: list[CommitEvent]) -> set[tuple[str, int]]:
    """TEs that ran chained: they report 0 rows out of a non-empty input batch... or are the
    chain's first procedures, which report 0 rows and 0 seconds of SQL."""
    return {(e.node, e.batch_id) for e in events if e.kind == "te" and e.rows == 0
            and e.node in ("parse", "double")}


@pytest.mark.parametrize("fused", [True, False], ids=["ingest_and_run", "run_until_idle"])
def test_a_chain_gives_the_rows_of_the_unchained_run(tmp_path, fused: bool) -> None:
    batches = [rows(b) for b in range(1, 8)]
    chained, events = run(str(tmp_path / "c.duckdb"), batches, chain=True, fused=fused)
    plain, plain_events = run(str(tmp_path / "p.duckdb"), batches, chain=False, fused=fused)
    assert state(chained) == state(plain)
    assert len(state(chained)["sink"]) == 35
    # batch 1 ran unchained (the engine learns that the SELECTs return their streams'
    # schemas exactly); every later batch ran parse and double chained into label
    assert chained_members(events) == {(n, b) for n in ("parse", "double") for b in range(2, 8)}
    assert not chained_members(plain_events)
    # the chained batches were never materialized: recorded as collected, and latest says so
    with pytest.raises(ChainedBatchError, match="never materialized"):
        chained.latest("parsed")
    assert chained.latest("labelled") == plain.latest("labelled")
    collected = "SELECT stream, through FROM sstore_sys.collected ORDER BY ALL"
    assert {"stream": "doubled", "through": 7} in chained.query(collected).to_pylist()
    chained.close()
    plain.close()


def test_a_bad_row_in_the_middle_of_a_chain_is_blamed_on_its_procedure(tmp_path) -> None:
    """Batch 4 has a row ``double`` divides by zero: unchained, ``double`` halts at batch 4 and
    ``parse`` has run it. Chained, the one statement fails; the group runs again unchained and
    ends the same way."""
    batches = [rows(b) for b in range(1, 4)] + [rows(4, bad="0")] + [rows(5)]
    chained, _ = run(str(tmp_path / "c.duckdb"), batches, chain=True)
    plain, _ = run(str(tmp_path / "p.duckdb"), batches, chain=False)
    assert state(chained) == state(plain)
    assert state(chained)["halted"] == ["double"]
    assert state(chained)["errors"] == [{"procedure": "double", "batch_id": 4, "action": "halt"}]
    assert len(state(chained)["sink"]) == 15  # batches 1-3: nothing of 4 or 5 went through
    # the halted reader's input is stored for it: nothing chained away that it needs
    assert chained.query("SELECT count(*) AS n FROM parsed WHERE _batch_id >= 4"
                         ).to_pylist() == [{"n": 10}]
    chained.close()
    plain.close()


def test_a_dead_lettered_batch_in_a_chain_matches_the_unchained_run(tmp_path) -> None:
    batches = [rows(b) for b in range(1, 4)] + [rows(4, bad="zero")] + [rows(5), rows(6)]
    chained, _ = run(str(tmp_path / "c.duckdb"), batches, chain=True, on_error="dead_letter")
    plain, _ = run(str(tmp_path / "p.duckdb"), batches, chain=False, on_error="dead_letter")
    assert state(chained) == state(plain)
    assert state(chained)["errors"] == [{"procedure": "parse", "batch_id": 4,
                                         "action": "dead_letter"}]
    dead = "SELECT _batch_id, id, text FROM raw__dead_letter ORDER BY ALL"
    assert chained.query(dead).to_pylist() == plain.query(dead).to_pylist()
    assert len(chained.query(dead).to_pylist()) == 5
    assert len(state(chained)["sink"]) == 25
    chained.close()
    plain.close()


def test_a_second_reader_or_a_sink_keeps_a_stream_materialized(tmp_path) -> None:
    """A stream with two readers, or one a consumer holds, is never chained away."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    declare(engine)
    engine.execute("CREATE TABLE IF NOT EXISTS audit (batch_id BIGINT, n BIGINT)")

    @engine.procedure(input="parsed")
    def count_parsed(tx, batch):
        tx.execute("INSERT INTO audit SELECT ?, count(*) FROM batch", tx.batch_id)

    engine.consumer("doubled", "a_sink")
    for b in range(1, 5):
        engine.ingest_and_run("raw", rows(b), batch_id=b)
    assert engine.query("SELECT sum(n) AS n FROM audit").to_pylist() == [{"n": 20}]
    assert engine.latest("parsed")[0] == 4
    assert engine.latest("doubled")[0] == 4
    assert engine.query("SELECT count(*) AS n FROM doubled").to_pylist() == [{"n": 20}]
    assert engine.query("SELECT count(*) AS n FROM sink").to_pylist() == [{"n": 20}]
    engine.close()


def test_a_select_that_does_not_return_its_streams_types_is_never_chained(tmp_path) -> None:
    """``100 // v`` of an INTEGER is BIGINT in DuckDB: the stream casts it to INTEGER; a chain
    would hand the reader the uncast value, so the engine does not chain it."""
    engine = Engine(str(tmp_path / "t.duckdb"))
    engine.stream("raw", {"id": "BIGINT", "v": "INTEGER"})
    engine.stream("wide", {"id": "BIGINT", "v": "INTEGER"})
    engine.stream("out", {"id": "BIGINT", "v": "INTEGER", "t": "VARCHAR"})
    engine.sql_procedure("widen", "SELECT id, v::BIGINT * 3 AS v FROM batch", input="raw",
                         output="wide")
    engine.sql_procedure("name", "SELECT id, v, typeof(v) AS t FROM batch", input="wide",
                         output="out")
    for b in range(1, 4):
        engine.ingest_and_run("raw", [(b, b)], batch_id=b)
    assert engine.latest("out")[1].to_pylist() == [{"id": 3, "v": 9, "t": "INTEGER"}]
    assert engine.latest("wide")[0] == 3  # materialized every time
    engine.close()


def test_a_procedure_that_is_not_one_select_is_refused() -> None:
    engine = Engine()
    engine.stream("raw", {"id": "BIGINT"})
    for sql in ("INSERT INTO t SELECT * FROM batch", "SELECT 1; SELECT 2",
                "WITH RECURSIVE r AS (SELECT 1 AS n) SELECT * FROM r", "SELEC id FROM batch"):
        with pytest.raises(DeclarationError, match="procedure 'p'"):
            engine.sql_procedure("p", sql, input="raw", output="out")
    engine.close()


def test_chained_members_keep_their_commit_records_across_a_restart(tmp_path) -> None:
    path = str(tmp_path / "r.duckdb")
    engine, _ = run(path, [rows(b) for b in range(1, 5)], chain=True)
    engine.close()
    again = Engine(path)
    declare(again)
    for b in range(1, 5):  # a client re-sending everything: every batch is a duplicate
        assert again.ingest_and_run("raw", rows(b), batch_id=b).duplicate
    again.ingest_and_run("raw", rows(5), batch_id=5)
    assert again.query("SELECT count(*) AS n, count(DISTINCT batch_id) AS b FROM sink"
                       ).to_pylist() == [{"n": 25, "b": 5}]
    again.close()


def test_arrow_batches_of_many_columns_chain_too(tmp_path) -> None:
    engine = Engine(str(tmp_path / "a.duckdb"))
    columns = {f"c{i}": "DOUBLE" for i in range(30)}
    engine.stream("wide_in", columns)
    engine.stream("mid", columns)
    engine.stream("last", columns)
    body = ", ".join(f"c{i} + 1 AS c{i}" for i in range(30))
    engine.sql_procedure("one", f"SELECT {body} FROM batch", input="wide_in", output="mid")
    engine.sql_procedure("two", f"SELECT {body} FROM batch", input="mid", output="last")
    table = pa.table({f"c{i}": [float(i)] * 3 for i in range(30)})
    for b in range(1, 4):
        engine.ingest_and_run("wide_in", table, batch_id=b)
    assert engine.latest("last")[1] == pa.table({f"c{i}": [float(i) + 2] * 3 for i in range(30)})
    with pytest.raises(ChainedBatchError):
        engine.latest("mid")
    engine.close()


@pytest.mark.parametrize("chain", [True, False], ids=["chained", "held back"])
def test_a_reader_declared_later_never_gets_a_collected_batch_as_empty(tmp_path,
                                                                        chain: bool) -> None:
    """Batches 1-4 of ``parsed`` were never stored (chained away, or held back in memory by
    group commit: their one reader of the time read them in the group). A procedure declared
    on ``parsed`` after a restart starts at batch 5, as after batches GC removed; it used to
    be handed batches 1-4 as empty batches, saying they had no rows."""
    path = str(tmp_path / "later.duckdb")
    engine, _ = run(path, [rows(b) for b in range(1, 5)], chain=chain)
    engine.close()
    again = Engine(path, chain_sql=chain)
    declare(again)
    again.execute("CREATE TABLE IF NOT EXISTS seen (batch_id BIGINT, n BIGINT)")

    @again.procedure(input="parsed")
    def count_parsed(tx, batch):
        tx.execute("INSERT INTO seen VALUES (?, ?)", tx.batch_id, batch.num_rows)

    again.ingest_and_run("raw", rows(5), batch_id=5)
    again.run_until_idle()
    assert again.query("SELECT * FROM seen ORDER BY ALL").to_pylist() == [
        {"batch_id": 5, "n": 5}]
    assert again.query("SELECT count(*) AS n FROM sink").to_pylist() == [{"n": 25}]
    again.close()


@pytest.mark.parametrize("ending", [";", " -- parsed\n", "; -- parsed", ";\n/* end */ ;  \n"])
def test_a_select_ending_in_a_semicolon_or_a_comment_still_chains(tmp_path, ending: str) -> None:
    """Nested in the next procedure's query, a trailing ``;`` or ``-- comment`` of the first
    SELECT broke the composed statement: every batch's group rolled back and ran again
    unchained (the right rows, at twice the cost, with nothing said)."""
    engine = Engine(str(tmp_path / "end.duckdb"))
    engine.stream("raw", {"id": "BIGINT", "text": "VARCHAR"})
    engine.stream("parsed", {"id": "BIGINT", "v": "INTEGER"})
    engine.stream("doubled", {"id": "BIGINT", "v": "INTEGER"})
    engine.sql_procedure("parse", PARSE + ending, input="raw", output="parsed")
    engine.sql_procedure("double", "SELECT id, v * 2 AS v FROM batch" + ending,
                         input="parsed", output="doubled")
    events: list[CommitEvent] = []
    engine.observe(events.append)
    for batch_id in range(1, 5):
        engine.ingest_and_run("raw", rows(batch_id), batch_id=batch_id)
    assert chained_members(events) == {("parse", b) for b in range(2, 5)}
    assert engine.latest("doubled")[1].column("v").to_pylist() == [2 * (4 + i) for i in range(5)]
    assert not engine.query("SELECT * FROM sstore_sys.errors").num_rows
    engine.close()
