"""The TPC-DI benchmark's smallest configuration, run for real: SF 0.01, one batch size, every
system into PostgreSQL; the record has the promised shape and the systems load the same rows.
The hand-written reference runs beside them (its own tests: test_bench_tpcdi_reference.py).
Plus the parts whose failure would silently skew the numbers: the same-rows check and the
Spark Structured Streaming parser rejecting exactly the lines the engine's SP1 rejects."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from rich.console import Console

from benchmarks.tpcdi import SYSTEMS, Plan, run_benchmark
from benchmarks.tpcdi_report import check_same_rows
from benchmarks.tpcdi_runs import Budget
from sstore.workloads.tpcdi.streaming.parse import PARSE_SQL

RECORD_KEYS = {"system", "scale_factor", "batch_trades", "batch_events", "trades", "events",
               "events_per_trade", "seconds", "trades_per_s", "p50_ms", "p99_ms",
               "hist_rows_per_s", "incr_rows_per_s", "capped", "phases", "result", "matches"}


def test_smallest_configuration_runs_and_the_systems_agree(spark: Any, pg_url: str,
                                                           tmp_path: Path) -> None:
    plan = Plan((0.01,), (10_000,), Budget(phase_seconds=300.0), warm_up=False,
                coalesce_trades=20_000)  # sstore-coalescing runs below its bound only
    report = run_benchmark(plan, spark, str(tmp_path), Console(file=io.StringIO()),
                           database=lambda sf: pg_url, release=lambda sf: None)
    json.dumps(report, default=str)  # what write_results will do
    assert {"machine", "plan", "definitions", "setup", "records", "ratios"} <= set(report)
    assert len(report["machine"]["loadavg_at_start"]) == 3
    records = report["records"]
    assert sorted(r["system"] for r in records) == sorted(SYSTEMS)
    trades = report["setup"]["0.01"]["trades"]
    for r in records:
        assert RECORD_KEYS <= set(r), f"{r['system']}: missing {RECORD_KEYS - set(r)}"
        assert not r["capped"], f"{r['system']} ran out of its time budget"
        assert r["matches"], f"{r['system']} loaded other rows: {r['result']}"
        assert r["result"]["dimtrade_rows"] == trades
        assert r["result"]["dimessages_rows"] > 0
        assert r["trades_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert [p["tpcdi_batch"] for p in r["phases"]] == [1, 2, 3]
        assert sum(p["events"] for p in r["phases"]) == r["events"]
    streaming = [r for r in records if r["system"] != "spark-bulk"]
    assert all(r["batch_trades"] == 10_000 and r["batches"] >= 3 for r in streaming)
    for r in records:
        assert r["latency_samples"] == r["phases"][0]["batches"]
        assert len(r["incr_latency_ms"]) == sum(p["batches"] for p in r["phases"][1:])
    rejects = {r["result"]["rejects_rows"] for r in streaming}
    assert len(rejects) == 1, f"the streaming systems rejected different lines: {rejects}"
    (ratio,) = report["ratios"]
    assert ratio["sstore_over_sss_trades_per_s"] and ratio["sstore_over_bulk_trades_per_s"]
    assert ratio["sstore_over_reference_trades_per_s"] and ratio["sstore_over_reference_p50"]
    assert ratio["coalescing_over_reference_trades_per_s"]
    assert ratio["coalescing_over_reference_p50"]
    for r in records:
        assert r["peak_rss_mb"] > 0, f"{r['system']}: no peak RSS"
    for r in streaming:
        assert len(r["service_series_ms"]) == min(r["phases"][0]["batches"], 400)


def _record(system: str, md5: str) -> dict[str, Any]:
    return {"system": system, "result": {"dimtrade_rows": 3, "dimtrade_md5": md5,
                                         "dimessages_rows": 1, "dimessages_md5": "m"}}


def test_same_rows_check_catches_a_different_table() -> None:
    records = [_record("sstore", "a"), _record("spark-sss", "a"), _record("spark-bulk", "b")]
    check_same_rows(records)
    assert [r["matches"] for r in records] == [True, True, False]
    assert all(r["rows_match"] for r in records)  # same counts, other contents


LINES = [
    "I|1|7|2017-07-08 10:00:00|PNDG|TLB|1|SYMB|100|10.50|42|Ann||||",     # fine
    "U|2|7|2017-07-08 10:05:00|CMPT|TLB|1|SYMB|100|10.50|42|Ann|10.40|1.00|2.00|0.50",  # fine
    "I|3|8|2017-07-08 10:00:00|PNDG|TLB|1|SYMB|100|10.50|42|Ann|||",      # 15 fields
    "I|4|9|2017-07-08 25:00:00|PNDG|TLB|1|SYMB|100|10.50|42|Ann||||",     # bad time
    "X|5|9|2017-07-08 10:00:00|PNDG|TLB|1|SYMB|100|10.50|42|Ann||||",     # bad flag
    "I|6|9|2017-07-08 10:00:00|PNDG|TLB|2|SYMB|100|10.50|42|Ann||||",     # bad cash flag
    "I|7|9|2017-07-08 10:00:00|PNDG|TLB|1|SYMB|1x0|10.50|42|Ann||||",     # bad quantity
    "I|8||2017-07-08 10:00:00|PNDG|TLB|1|SYMB|100|10.50|42|Ann||||",      # missing T_ID
    "U|9|7|2017-07-08 10:06:00|CMPT|TLB|1|SYMB|100|10.50|42||abc|||",     # bad price
]


def test_spark_streaming_parser_rejects_what_the_engine_rejects(spark: Any) -> None:
    from benchmarks.tpcdi_sss import parse_lines

    batch = pa.table({"line": LINES, "line_no": list(range(1, len(LINES) + 1)),
                      "source": ["Trade.txt"] * len(LINES), "tpcdi_batch": [2] * len(LINES)})
    con = duckdb.connect()
    con.register("batch", batch)
    engine = con.sql(f"SELECT * FROM ({PARSE_SQL}) ORDER BY line_no").to_arrow_table()
    values = [f"{n}|2|{line}" for n, line in enumerate(LINES, 1)]
    parsed = parse_lines(spark.createDataFrame([(v,) for v in values], "value string")) \
        .orderBy("eid").toArrow()
    want = [reason is None for reason in engine["reason"].to_pylist()]
    assert want == [True, True] + [False] * (len(LINES) - 2)
    assert [reason is None for reason in parsed["reason"].to_pylist()] == want
    assert parsed["t_id"].to_pylist()[:2] == [7, 7]
    assert str(parsed["t_trade_price"][1]) == "10.40"
