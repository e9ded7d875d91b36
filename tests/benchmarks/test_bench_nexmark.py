"""benchmarks.nexmark's sstore side on a small run (Spark's and Flink's sides run in the
benchmark itself, each checked there against the same reference), and how the other systems'
results are read and compared."""

from __future__ import annotations

import pyarrow as pa
from rich.console import Console

from benchmarks import nexmark as bench
from sstore.workloads.nexmark import generator, reference

EVENTS = 30_000


def _events() -> pa.Table:
    return generator.events(0, EVENTS, generator.NexmarkConfig(seed=bench.SEED, rate=1_000.0))


def test_sstore_side_records_in_the_issue_shape(pg_url: str, monkeypatch: object) -> None:
    monkeypatch.setattr(bench, "RATE", 1_000.0)  # type: ignore[attr-defined]
    events = _events()
    records = []
    for query in ("q2", "q4", "q7"):
        expected = reference.reference(events, query)
        records += bench.run_sstore(query, events, expected, [5_000], pg_url,
                                    Console(quiet=True))
    assert [(r["system"], r["query"]) for r in records] == [
        (s, q) for q in ("q2", "q4", "q7") for s in ("sstore", "sstore-postgres")]
    for r in records:
        assert r["results_equal"] is True, r
        assert r["batch_events"] == 5_000 and r["events"] == EVENTS and r["cores"] >= 1
        assert r["events_per_s_per_core"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["peak_rss_mb"] > 0


def test_a_wrong_result_is_not_equal() -> None:
    events = _events()
    expected = reference.reference(events, "q3")
    assert bench._equal(events, "q3", expected, expected)
    assert not bench._equal(events, "q3", expected, expected.slice(1))


def test_flushed_windows_are_left_out_and_check_files_read_typed(tmp_path: object) -> None:
    events = _events()
    expected = reference.reference(events, "q8")
    newest = events["date_time"][-1].as_py()
    flushed = pa.table({"id": [1], "name": ["x"], "starttime": pa.array([newest],
                                                                        pa.timestamp("ms"))})
    extended = pa.concat_tables([expected, flushed.cast(expected.schema)])
    assert bench._equal(events, "q8", expected, extended)  # Flink flushes the open window
    path = f"{tmp_path}/q8.csv"
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{r['id']},{r['name']},{r['starttime'].isoformat(sep=' ')}\n"
                     for r in expected.to_pylist())
    read = bench._read_check(path, expected)
    assert read.schema.types == expected.schema.types
    assert bench._equal(events, "q8", expected, read)
