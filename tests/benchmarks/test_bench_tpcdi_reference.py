"""The TPC-DI benchmark's hand-written reference and its sstore profile, for real (SF 0.01,
Spark-built dimensions, DuckDB, PostgreSQL): the reference loads exactly the rows sstore loads,
also when it is stopped half way and run again with another chunk size (exactly once by its
watermark), and the profile attributes time to every procedure and restores what it wrapped.
And every streaming feed measures open loop (``--rates``) from each batch's due time: flooded,
the engine, the coalescing engine and the reference show their backlog in their latency."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import duckdb

from benchmarks.tpcdi_profile import GROUP_COMMIT, OUTSIDE, SINKS, TOTAL
from benchmarks.tpcdi_reference import APPLY_SQL, JUDGE_SQL, ReferenceDimTrade, run_reference
from benchmarks.tpcdi_runs import Budget, run_engine
from benchmarks.tpcdi_setup import (
    TPCDI_BATCHES,
    build_dimensions,
    fingerprint,
    fresh_warehouse,
    install_dimensions,
    make_data,
)
from sstore.execution.transaction import Transaction

PROCEDURES = ("parse_trades", "resolve_status_and_times", "resolve_security", "resolve_account",
              "apply_dimtrade")


def _feed(job: ReferenceDimTrade, data: Any, batch: int, size: int, limit: int | None = None
          ) -> int:
    """Feed what the warehouse lacks of ``batch`` in chunks of ``size``; returns chunks sent."""
    job.store_file_rejects(data.events[batch])
    lines = job.pending(data.events[batch])
    sent = 0
    for start in range(0, lines.num_rows, size):
        if limit is not None and sent == limit:
            break
        assert job.process(lines.slice(start, size))
        sent += 1
    return sent


def test_reference_loads_what_sstore_loads_exactly_once_and_the_profile_covers_it(
        spark: Any, pg_url: str, tmp_path: Path) -> None:
    data = make_data(0.01, tmp_path / "data")
    build_dimensions(spark, data, pg_url)

    sstore_sql, sstore_execute = Transaction.sql, Transaction.execute
    commit = duckdb.DuckDBPyConnection.commit
    engine_run = run_engine(data, pg_url, "run_sstore", str(tmp_path), 50, 120,
                            Budget(phase_seconds=600.0), lambda n: None, profile=True)
    assert (Transaction.sql, Transaction.execute, duckdb.DuckDBPyConnection.commit) == \
        (sstore_sql, sstore_execute, commit), "the profile left a wrapper installed"
    profile = {p["phase"]: p for p in engine_run.extra["profile"]["phases"]}
    for name in PROCEDURES:  # the five run as one group commit per batch
        assert profile[f"{name}: SQL"]["mean_ms"] > 0
        assert profile[f"{name}: outputs, stream appends"]["mean_ms"] > 0
    assert profile[GROUP_COMMIT]["mean_ms"] > 0
    assert {"ingest: append + commit records", OUTSIDE, SINKS, TOTAL} <= set(profile)
    assert "ingest: COMMIT" not in profile  # ingest_and_run: the ingest commits with its group
    assert profile[TOTAL]["batches"] == engine_run.phases[0].batches
    parts = sum(p["mean_ms"] for name, p in profile.items() if name not in (TOTAL, SINKS))
    assert abs(parts - profile[TOTAL]["mean_ms"]) < 0.01 * profile[TOTAL]["mean_ms"]

    schema = "run_reference"
    fresh_warehouse(pg_url, schema)
    install_dimensions(pg_url, schema, 1)
    first = ReferenceDimTrade(pg_url, schema)
    first.load_dimensions()
    assert _feed(first, data, 1, 97, limit=5) == 5
    first.close()  # stopped half way: its DuckDB DimTrade is gone with it

    again = ReferenceDimTrade(pg_url, schema)
    try:
        assert again.resume() > 0
        assert again.lines_done(1) == 5 * 97
        for batch in TPCDI_BATCHES:
            if batch > 1:
                install_dimensions(pg_url, schema, batch)
            again.load_dimensions()
            assert _feed(again, data, batch, 131) > 0
        everything = data.events[1].lines
        assert not again.process(everything.slice(0, 97)), "a chunk the warehouse has"
        assert again.pending(data.events[1]).num_rows == 0
    finally:
        again.close()

    want, got = fingerprint(pg_url, "run_sstore"), fingerprint(pg_url, schema)
    assert want["dimtrade_rows"] == data.trades and want["dimessages_rows"] > 0
    assert got == want

    # open loop, offered far more than any of them takes: the due times run ahead of the
    # sends, and a latency taken from the due time grows with the backlog
    flooded = Budget(phase_seconds=600.0, rate_trades=1_000_000.0)
    runs = [run_engine(data, pg_url, "rate_sstore", str(tmp_path / "a"), 20, 50, flooded,
                       lambda n: None),
            run_engine(data, pg_url, "rate_coalescing", str(tmp_path / "b"), 20, 50, flooded,
                       lambda n: None, coalesce_events=100),
            run_reference(data, pg_url, "rate_reference", 20, 50, flooded, lambda n: None)]
    for run in runs:
        latencies = run.latencies_ms[1]
        assert len(latencies) == run.phases[0].batches > 40
        half = len(latencies) // 2
        early, late = statistics.median(latencies[:half]), statistics.median(latencies[half:])
        assert late > early + 200, f"{run.system}: a backlog of ~{half} batches not seen " \
                                   f"({early:.0f} -> {late:.0f} ms)"
        assert run.result == want, f"{run.system} loaded other rows open loop"


def test_the_reference_query_chains_every_step() -> None:
    """The one query holds steps 1-4, each reading the step before; SP5's merge reads
    their result."""
    for relation in ("FROM chunk", "FROM parsed", "FROM timed", "FROM secured"):
        assert relation in JUDGE_SQL
    assert "FROM keyed" in APPLY_SQL
    assert "FROM batch" not in JUDGE_SQL and "FROM batch" not in APPLY_SQL
