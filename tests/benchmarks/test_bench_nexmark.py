"""benchmarks.nexmark's sstore side on a small run (Spark's and Flink's sides run in the
benchmark itself, each checked there against the same reference), and how the other systems'
results are read and compared."""

from __future__ import annotations

import datetime

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


def test_flink_latency_owes_each_row_to_a_file(tmp_path: object) -> None:
    """Flink's latency run: files dropped with their arrival on every line; a row is owed to
    the file of its newest input (``arrival``) or, windowed, to the file that closed its
    window (an event at or past its end + 4 s - 1 ms); a file's latency ends at its last row."""
    from benchmarks import nexmark_flink_latency as latency
    files = generator.write_files(f"{tmp_path}/parts", 3_000, 1_000,
                                  generator.NexmarkConfig(seed=1, rate=100.0))
    arrivals = latency.drop(files, f"{tmp_path}/inbox", pace_s=0.0)
    with open(f"{tmp_path}/inbox/events-00000001.csv", encoding="utf-8") as f:
        assert {line.rstrip("\n").rsplit(",", 1)[1] for line in f} == {str(arrivals[1])}
    last = [latency.last_event_ms(p) for p in files]  # 10 s of event time per file
    assert last == sorted(last) and last[1] - last[0] == 10_000
    at = [0, 60_000, 120_000]

    def stamp(ms: int) -> str:
        return str(datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=ms))

    rows = [{"arrival": str(at[1]), "emitted": stamp(at[1] + 40)},
            {"arrival": str(at[1]), "emitted": stamp(at[1] + 90)},
            {"arrival": str(at[0]), "emitted": stamp(at[0] + 7)}]
    assert latency.latencies("q3", rows, at, last) == [7.0, 90.0]
    end = last[0] - 4_000  # closed by the first file's newest event: owed to file 0
    rows = [{"window_end": stamp(end), "emitted": stamp(at[0] + 300)},
            {"window_end": stamp(end + 2), "emitted": stamp(at[1] + 5)},  # file 1 closes it
            {"window_end": stamp(last[2]), "emitted": stamp(at[2])}]  # no file closed it
    assert latency.latencies("q7", rows, at, last) == [300.0, 5.0]
