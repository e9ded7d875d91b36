"""Seams of chained SQL procedures (``sstore.dataflow.fusion``) that a user can reach by mistake.

A chain skips everything ``StreamStore.append`` does for an intermediate stream: it is correct
only when that is nothing but recording the batch. Each test runs the same dataflow chained and
with ``chain_sql=False`` and wants the same rows everywhere a user can read them.
"""

from __future__ import annotations

import pytest

from sstore import Engine
from sstore.base.errors import ChainedBatchError


def event_window_dataflow(path: str, chain: bool) -> Engine:
    """raw -> parse (SQL) -> parsed -> tag (SQL) -> tagged, and an event-time window over the
    intermediate stream ``parsed`` (one window per 10 units of ``ts``)."""
    engine = Engine(path, chain_sql=chain)
    engine.stream("raw", {"id": "BIGINT", "ts": "BIGINT"})
    engine.stream("parsed", {"id": "BIGINT", "ts": "BIGINT"})
    engine.stream("tagged", {"id": "BIGINT", "ts": "BIGINT", "tag": "VARCHAR"})
    engine.sql_procedure("parse", "SELECT id, ts FROM batch WHERE id >= 0", input="raw",
                         output="parsed")
    engine.sql_procedure("tag", "SELECT id, ts, 'ok' AS tag FROM batch", input="parsed",
                         output="tagged")
    engine.event_window("per10", "parsed", time="ts", size=10)
    return engine


@pytest.mark.parametrize("fused", [True, False], ids=["ingest_and_run", "run_until_idle"])
def test_an_event_window_over_an_intermediate_stream_sees_every_batch(tmp_path,
                                                                     fused: bool) -> None:
    """The event window's only reader of ``parsed`` is not a procedure, so ``parse`` and
    ``tag`` looked chainable; chained, ``parsed``'s batches were never appended, so the window
    was never fed: every window it should have closed was lost, without an error."""
    outcomes = []
    for chain in (True, False):
        engine = event_window_dataflow(str(tmp_path / f"{chain}.duckdb"), chain)
        for b in range(1, 7):
            batch = [(b * 10 + i, b * 10 + i) for i in range(3)]
            if fused:
                engine.ingest_and_run("raw", batch, batch_id=b)
            else:
                engine.ingest("raw", batch, batch_id=b)
                engine.run_until_idle()
        outcomes.append({
            "windows": engine.query("SELECT * FROM per10 ORDER BY ALL").to_pylist(),
            "tagged": engine.latest("tagged")[1].to_pylist(),
            "parsed": engine.latest("parsed")[0],  # materialized: no ChainedBatchError
        })
        engine.close()
    chained, plain = outcomes
    assert len(plain["windows"]) == 5  # windows 10-20 .. 50-60 closed by the next batch
    assert chained == plain


def test_a_chain_that_learned_before_an_event_window_was_declared_feeds_it_after(
        tmp_path) -> None:
    """A state file run chained, then restarted with an event window over the intermediate
    stream: the window gets every batch from its declaration on."""
    path = str(tmp_path / "later.duckdb")
    engine = Engine(path)
    engine.stream("raw", {"id": "BIGINT", "ts": "BIGINT"})
    engine.stream("parsed", {"id": "BIGINT", "ts": "BIGINT"})
    engine.stream("tagged", {"id": "BIGINT", "ts": "BIGINT", "tag": "VARCHAR"})
    engine.sql_procedure("parse", "SELECT id, ts FROM batch", input="raw", output="parsed")
    engine.sql_procedure("tag", "SELECT id, ts, 'ok' AS tag FROM batch", input="parsed",
                         output="tagged")
    for b in range(1, 4):
        engine.ingest_and_run("raw", [(b, b)], batch_id=b)
    with pytest.raises(ChainedBatchError):
        engine.latest("parsed")
    engine.close()
    again = event_window_dataflow(path, chain=True)
    for b in range(4, 9):
        again.ingest_and_run("raw", [(b * 10 + i, b * 10 + i) for i in range(3)], batch_id=b)
    assert [(r["window_start"], r["rows"]) for r in again.query(
        "SELECT window_start, rows FROM per10 ORDER BY window_start").to_pylist()] == [
        (40, 3), (50, 3), (60, 3), (70, 3)]
    again.close()


def chain_dataflow(engine: Engine) -> None:
    engine.stream("raw", {"id": "BIGINT", "v": "INTEGER"})
    engine.stream("parsed", {"id": "BIGINT", "v": "INTEGER"})
    engine.stream("doubled", {"id": "BIGINT", "v": "INTEGER"})
    engine.sql_procedure("parse", "SELECT id, v FROM batch WHERE v IS NOT NULL",
                         input="raw", output="parsed")
    engine.sql_procedure("double", "SELECT id, v * 2 AS v FROM batch", input="parsed",
                         output="doubled")


def test_a_sink_declared_later_on_a_chained_stream_is_told_of_the_gap(tmp_path) -> None:
    """Batches 2-4 of ``parsed`` were chained away. A sink declared on it after a restart
    must not start at batch 1 as if the engine had them all: ``continue_from`` raises
    ``GapError`` naming batches 1..4 (batch 1 ran unchained but its one reader read it in
    the group: never stored either); from then on ``parsed`` is materialized for it."""
    from sstore.base.errors import GapError

    path = str(tmp_path / "sink.duckdb")
    engine = Engine(path)
    chain_dataflow(engine)
    for b in range(1, 5):
        engine.ingest_and_run("raw", [(b, b), (b + 100, None)], batch_id=b)
    engine.close()
    again = Engine(path)
    chain_dataflow(again)
    again.consumer("parsed", "late_sink")
    again.ingest_and_run("raw", [(5, 5)], batch_id=5)
    with pytest.raises(GapError, match=r"batches 1\.\.4 of stream 'parsed'"):
        again.continue_from("parsed", "late_sink", 0)
    assert again.batches("parsed") == [(5, 1)]
    assert again.latest("parsed")[0] == 5
    assert again.latest("doubled")[1].to_pylist() == [{"id": 5, "v": 10}]
    again.close()


def test_a_subscriber_to_an_intermediate_stream_gets_every_batch_after_it_subscribed(
        tmp_path) -> None:
    """A subscription made while the chain runs stops the chaining of that stream from the
    next batch on: the subscriber gets each batch, with its rows, and the chain's output is
    the same."""
    engine = Engine(str(tmp_path / "sub.duckdb"))
    chain_dataflow(engine)
    for b in range(1, 4):
        engine.ingest_and_run("raw", [(b, b)], batch_id=b)
    with pytest.raises(ChainedBatchError):
        engine.latest("parsed")
    seen: list[tuple[int, list[dict[str, int]]]] = []
    engine.subscribe("parsed", lambda batch_id, rows: seen.append((batch_id, rows.to_pylist())))
    for b in range(4, 7):
        engine.ingest_and_run("raw", [(b, b), (b + 100, None)], batch_id=b)
    assert seen == [(b, [{"id": b, "v": b}]) for b in range(4, 7)]
    assert engine.latest("doubled")[1].to_pylist() == [{"id": 6, "v": 12}]
    engine.close()


def nullable_dataflow(path: str, chain: bool) -> Engine:
    """``parsed.v`` is NOT NULL: a constraint the intermediate batch must be checked against."""
    engine = Engine(path, chain_sql=chain)
    engine.stream("raw", {"id": "BIGINT", "text": "VARCHAR"})
    engine.stream("parsed", {"id": "BIGINT", "v": "INTEGER NOT NULL"})
    engine.stream("doubled", {"id": "BIGINT", "v": "INTEGER"})
    engine.execute("CREATE TABLE IF NOT EXISTS kept (batch_id BIGINT, id BIGINT, v INTEGER)")
    engine.sql_procedure("parse", "SELECT id, TRY_CAST(text AS INTEGER) AS v FROM batch",
                         input="raw", output="parsed")
    engine.sql_procedure("double", "SELECT id, v * 2 AS v FROM batch", input="parsed",
                         output="doubled")

    @engine.procedure(input="doubled")
    def keep(tx, batch):
        tx.execute("INSERT INTO kept SELECT ?, * FROM batch", tx.batch_id)

    return engine


def test_empty_batches_and_a_null_the_stream_refuses_match_the_unchained_run(
        tmp_path) -> None:
    """Empty batches flow through a chain as empty batches; a NULL in a NOT NULL column of
    the intermediate stream halts ``parse`` at that batch in both runs (a constrained stream
    is never chained away, so its rows are checked), and nothing after it goes through."""
    batches = [[(1, "1")], [], [(3, "3"), (4, "4")], [], [(5, "x")], [(6, "6")]]
    outcomes = []
    for chain in (True, False):
        engine = nullable_dataflow(str(tmp_path / f"{chain}.duckdb"), chain)
        for b, rows in enumerate(batches, start=1):
            engine.ingest_and_run("raw", rows, batch_id=b)
        engine.run_until_idle()
        outcomes.append((
            engine.query("SELECT * FROM kept ORDER BY ALL").to_pylist(),
            engine.query("SELECT procedure, batch_id, action FROM sstore_sys.errors "
                         "ORDER BY ALL").to_pylist(),
            sorted(engine._runtime().scheduler.halted)))
        engine.close()
    chained, plain = outcomes
    assert chained == plain
    assert [r["id"] for r in plain[0]] == [1, 3, 4]
    assert plain[1] == [{"procedure": "parse", "batch_id": 5, "action": "halt"}]


def test_empty_batches_go_through_a_chain_as_empty_batches(tmp_path) -> None:
    """Batches with no rows, and batches whose rows the chain's first SELECT filters out
    entirely, come out as empty batches of the chain's output, chained as unchained."""
    outcomes = []
    for chain in (True, False):
        engine = Engine(str(tmp_path / f"{chain}.duckdb"), chain_sql=chain)
        chain_dataflow(engine)
        engine.execute("CREATE TABLE IF NOT EXISTS seen (batch_id BIGINT, n BIGINT)")

        @engine.procedure(input="doubled")
        def count(tx, batch):
            tx.execute("INSERT INTO seen VALUES (?, ?)", tx.batch_id, batch.num_rows)

        for b, rows in enumerate([[(1, 1)], [], [(3, None)], [(4, 4), (5, 5)], []], start=1):
            engine.ingest_and_run("raw", rows, batch_id=b)
        if chain:
            with pytest.raises(ChainedBatchError):
                engine.latest("parsed")
        outcomes.append(engine.query("SELECT * FROM seen ORDER BY ALL").to_pylist())
        engine.close()
    assert outcomes[0] == outcomes[1] == [
        {"batch_id": 1, "n": 1}, {"batch_id": 2, "n": 0}, {"batch_id": 3, "n": 0},
        {"batch_id": 4, "n": 2}, {"batch_id": 5, "n": 0}]
