"""Seams of chained SQL procedures (``sstore.fusion``) that a user can reach by mistake.

A chain skips everything ``StreamStore.append`` does for an intermediate stream: it is correct
only when that is nothing but recording the batch. Each test runs the same dataflow chained and
with ``chain_sql=False`` and wants the same rows everywhere a user can read them.
"""

from __future__ import annotations

import pytest

from sstore import Engine
from sstore.errors import ChainedBatchError


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
