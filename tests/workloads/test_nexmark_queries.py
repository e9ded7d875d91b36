"""Nexmark q0-q8 as sstore dataflows: each query's result, streamed through the engine in
batches, equals the plain DuckDB reference computed over all the events at once
(``sstore.workloads.nexmark.reference``, written from the nexmark project's Flink SQL)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sstore.engine import Engine
from sstore.workloads.nexmark import generator as g
from sstore.workloads.nexmark import queries, reference

EVENTS = 40_000
CONFIG = g.NexmarkConfig(seed=7, rate=1_000.0)  # 40 s of event time: windows close


@pytest.fixture(scope="module")
def events() -> pa.Table:
    return g.events(0, EVENTS, CONFIG)


def _run(query: str, batch_events: int, path: str = ":memory:") -> pa.Table:
    engine = Engine(path)
    queries.declare(engine, query)
    for batch in g.batches(EVENTS, batch_events, CONFIG):
        engine.ingest_and_run(queries.EVENTS, batch)
    try:
        return queries.result(engine, query)
    finally:
        engine.close()


@pytest.mark.parametrize("query", sorted(queries.QUERIES))
def test_query_equals_the_reference(query: str, events: pa.Table) -> None:
    expected = reference.reference(events, query)
    got = _run(query, 1_000)
    assert expected.num_rows > 0, "the input must give the query something to find"
    assert got.column_names == expected.column_names
    assert reference.same_rows(expected, got), (query, got.num_rows, expected.num_rows)


@pytest.mark.parametrize("query", ["q3", "q4", "q5", "q6", "q7", "q8"])
def test_stateful_queries_do_not_depend_on_the_batches(query: str, events: pa.Table,
                                                       tmp_path: object) -> None:
    """Odd batch sizes cut windows, auctions and the same millisecond apart; a file-backed
    engine keeps the state on disk: the same result."""
    expected = reference.reference(events, query)
    got = _run(query, 3_331, str(tmp_path) + "/q.duckdb")  # type: ignore[operator]
    assert reference.same_rows(expected, got)


def test_same_rows_tells_a_difference(events: pa.Table) -> None:
    rows = reference.reference(events, "q2")
    assert reference.same_rows(rows, rows)
    assert not reference.same_rows(rows, rows.slice(1))
    changed = rows.set_column(1, "price", pa.array([1] * rows.num_rows, pa.int64()))
    assert not reference.same_rows(rows, changed)
