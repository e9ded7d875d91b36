"""benchmarks.icu's engine side on a small run (Spark's side runs in the benchmark itself,
whose every run checks both systems against the ground truth and each other)."""

from __future__ import annotations

import datetime
import itertools
import os

import psycopg
from rich.console import Console

from benchmarks import icu as bench
from sstore.base.sql import ident
from sstore.workloads import icu


def test_engine_side_measures_and_checks_alerts(pg_url: str) -> None:
    base = pg_url.rsplit("/", 1)[0] + "/postgres"
    name = f"sstore_bench_icu_test_{os.getpid()}"
    try:
        record = bench.measure(12, 360, base, None, Console(quiet=True), database=name)
    finally:
        with psycopg.connect(base, autocommit=True) as con:
            con.execute(f"DROP DATABASE IF EXISTS {ident(name)} WITH (FORCE)")
    eng = record["sstore"]
    assert eng["ground_truth_ok"] and eng["alerts"] == record["episodes"] > 0
    assert eng["readings_per_s"] > 0 and 0 < eng["p50_ms"] <= eng["p99_ms"]
    assert eng["counts"]["rows_in"] == record["readings"]


def test_closing_batch_is_the_first_whose_watermark_passes_the_window() -> None:
    gen = icu.generate(2, 300, seed=0, batch_seconds=5)
    marks = bench.closing_batches(gen, 65)
    assert all(a is None or b >= a for a, b in itertools.pairwise(marks))
    end = icu.generator.START + datetime.timedelta(seconds=120)
    k = bench.first_batch_past(marks, end)
    assert marks[k - 1] >= end and (k == 1 or marks[k - 2] is None or marks[k - 2] < end)
