"""Sinks in the engine's metrics: watermark, lag in batches and seconds, rows, retries, halts.

A real ``StreamToPostgres`` into a real PostgreSQL database; the numbers are read from the
engine's ``/metrics`` and ``/status`` and checked against PostgreSQL and the commit ledger.
"""

from __future__ import annotations

import json
import socket
import time

import psycopg
import pytest

from migrators import MigrationError, StreamToPostgres
from migrators.postgres import RetryPolicy
from sstore import Engine, observe
from sstore.base.errors import SStoreError
from tests.observe.test_observe import get, sample, scrape
from tests.observe_flow import ROWS_PER_BATCH, declare_flow, feed

SINK = {"sink": "migrator:public.enriched", "stream": "k_enriched",
        "target": "public.enriched"}


def committed_at(eng: Engine, node: str, batch_id: int) -> float:
    return eng.query("SELECT epoch(committed_at) AS t FROM sstore_sys.commits WHERE node = ? "
                     "AND batch_id = ?", node, batch_id).column("t")[0].as_py()


def test_watermark_lag_rows_and_halt_of_a_sink(state_path: str, pg_url: str) -> None:
    eng = Engine(state_path)
    declare_flow(eng)
    sink = StreamToPostgres(eng, "k_enriched", pg_url, "public.enriched")
    url = observe.serve(eng, 0)
    feed(eng, 4)
    first_commit = committed_at(eng, "k_enriched", 1)
    time.sleep(0.5)
    before = time.time()
    m = scrape(url)
    after = time.time()
    assert sample(m, "sstore_sink_watermark", **SINK) == 0
    assert sample(m, "sstore_sink_lag_batches", **SINK) == 4
    lag = sample(m, "sstore_sink_lag_seconds", **SINK)
    assert before - first_commit - 0.5 <= lag <= after - first_commit + 0.5
    assert lag >= 0.5
    assert sample(m, "sstore_sink_running", **SINK) == 0

    sink.attach()
    assert sink.flush(timeout=30)
    m = scrape(url)
    rows = 4 * (ROWS_PER_BATCH - 1)
    assert sample(m, "sstore_sink_watermark", **SINK) == 4
    assert sample(m, "sstore_sink_lag_batches", **SINK) == 0
    assert sample(m, "sstore_sink_lag_seconds", **SINK) == 0
    assert sample(m, "sstore_sink_rows_total", **SINK) == rows
    assert sample(m, "sstore_sink_rows_per_second", **SINK) >= 0
    assert sample(m, "sstore_sink_running", **SINK) == 1
    assert sample(m, "sstore_sink_halted", **SINK) == 0
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT count(*) FROM public.enriched").fetchone() == (rows,)

    with psycopg.connect(pg_url) as con:  # the target stops taking rows: a terminal error
        con.execute("ALTER TABLE public.enriched ADD CONSTRAINT small CHECK (amount < 0) "
                    "NOT VALID")
    feed(eng, 1, first=5)
    with pytest.raises(MigrationError, match="halted"):
        sink.flush(timeout=30)
    m = scrape(url)
    assert sample(m, "sstore_sink_halted", **SINK) == 1
    assert sample(m, "sstore_sink_watermark", **SINK) == 4
    assert sample(m, "sstore_sink_lag_batches", **SINK) == 1
    errors = [dict(k[1])["error"] for k in m if k[0] == "sstore_sink_last_error_info"]
    assert len(errors) == 1 and "small" in errors[0]
    doc = json.loads(get(url + "status"))
    shown = doc["live"]["sinks"][0]
    assert shown["name"] == SINK["sink"] and "small" in shown["halted"]
    flow = [n["name"] for n in doc["live"]["dataflow"]]
    assert flow.index(SINK["sink"]) == flow.index("k_enriched") + 1  # right after its stream
    sink.detach()
    eng.close()


def test_lag_of_batches_committed_before_this_process(state_path: str, pg_url: str) -> None:
    eng = Engine(state_path)
    declare_flow(eng)
    StreamToPostgres(eng, "k_enriched", pg_url, "public.enriched")  # declared, never run
    feed(eng, 3)
    first_commit = committed_at(eng, "k_enriched", 1)
    eng.close()
    time.sleep(0.3)
    with Engine(state_path) as eng:  # a new process would see the same: nothing in memory
        declare_flow(eng)
        StreamToPostgres(eng, "k_enriched", pg_url, "public.enriched")
        url = observe.serve(eng, 0)
        eng.run_until_idle()
        m = scrape(url)
        assert sample(m, "sstore_sink_lag_batches", **SINK) == 3
        lag = sample(m, "sstore_sink_lag_seconds", **SINK)
        assert time.time() - first_commit - 1 <= lag <= time.time() - first_commit + 0.5
        assert sample(m, "sstore_sink_rows_total", **SINK) == 0


def test_retries_are_counted(state_path: str) -> None:
    with socket.socket() as probe:  # a port where nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with Engine(state_path) as eng:
        declare_flow(eng)
        sink = StreamToPostgres(eng, "k_enriched", f"postgresql://postgres@127.0.0.1:{port}/x",
                                "public.enriched",
                                retry=RetryPolicy(attempts=3, first_delay=0.01, max_delay=0.01))
        url = observe.serve(eng, 0)
        feed(eng, 1)
        with pytest.raises(SStoreError):
            sink.run_pending()
        m = scrape(url)
        assert sample(m, "sstore_sink_retries_total", **SINK) == 2
        assert sample(m, "sstore_sink_lag_batches", **SINK) == 1
