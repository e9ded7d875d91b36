"""The engine's side of ``benchmarks.nexmark``: one query, one fresh state file, the events fed
batch by batch with ``ingest_and_run`` (full durability: every batch's commit is on disk),
results kept in the engine, or also delivered exactly once into PostgreSQL.

- **sstore**: latency of a batch = from calling ``ingest_and_run`` to its return (the batch and
  every result it caused committed in the engine).
- **sstore-postgres**: the query's output stream has a continuous sink
  (``migrators.StreamToPostgres``: append, or merge by the key for q4's upsert stream) into
  ``nexmark.<query>`` of a fresh database; latency of a batch = from sending it to the
  PostgreSQL COMMIT that delivered it (or a later batch); the run ends when the sink has
  flushed everything.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
import pyarrow as pa

from benchmarks.peak_rss import PeakRss
from migrators.engine_to_postgres import Delivered, StreamToPostgres
from sstore.engine import Engine
from sstore.workloads.nexmark import queries


def _feed(engine: Engine, batches: list[pa.Table]) -> tuple[float, dict[int, float],
                                                             list[float]]:
    """Send every batch; the seconds, when each was sent, how long each ``ingest_and_run``
    took (ms)."""
    sent, took = {}, []
    began = time.perf_counter()
    for i, batch in enumerate(batches, 1):
        sent[i] = time.perf_counter()
        engine.ingest_and_run(queries.EVENTS, batch, batch_id=i)
        took.append((time.perf_counter() - sent[i]) * 1000)
    engine.run_until_idle()
    return time.perf_counter() - began, sent, took


def run_engine(query: str, batches: list[pa.Table], workdir: str) -> dict[str, Any]:
    """The query with its results kept in the engine."""
    engine = Engine(os.path.join(workdir, f"{query}.duckdb"))
    queries.declare(engine, query)
    rss = PeakRss()
    rss.start()
    seconds, _, took = _feed(engine, batches)
    memory = rss.stop()
    result = queries.result(engine, query)
    engine.close()
    return {"seconds": seconds, "latencies_ms": took, "result": result,
            "peak_rss_mb": memory["peak_rss_mb"]}


def run_postgres(query: str, batches: list[pa.Table], workdir: str, url: str
                 ) -> dict[str, Any]:
    """The query with its results delivered exactly once into PostgreSQL as they commit."""
    engine = Engine(os.path.join(workdir, f"{query}-pg.duckdb"))
    queries.declare(engine, query)
    key = queries.QUERIES[query].key
    delivered: list[tuple[int, float]] = []

    def on_delivered(d: Delivered) -> None:
        delivered.append((d.last, d.committed_at))

    with psycopg.connect(url, autocommit=True) as con:
        con.execute("CREATE SCHEMA IF NOT EXISTS nexmark")
        con.execute(f"DROP TABLE IF EXISTS nexmark.{query}")
    sink = StreamToPostgres(engine, queries.output(query), url, f"nexmark.{query}",
                            mode="merge" if key else "append", key=key, ack_every=0.2,
                            on_delivered=on_delivered)
    rss = PeakRss()
    rss.start()
    began = time.perf_counter()
    sink.attach()
    _, sent, _ = _feed(engine, batches)
    if not sink.flush(timeout=900):
        raise RuntimeError(f"the {query} sink did not catch up: {sink.last_error}")
    seconds = time.perf_counter() - began
    memory = rss.stop()
    sink.detach()
    schema = queries.result(engine, query).schema  # the result's columns, empty or not
    engine.close()
    latencies = []
    for batch_id, at in sent.items():
        done = next((t for last, t in delivered if last >= batch_id), None)
        if done is not None:
            latencies.append((done - at) * 1000)
    with psycopg.connect(url) as con:
        cur = con.execute(f"SELECT * FROM nexmark.{query}")
        names = [c.name for c in cur.description or ()]
        rows = cur.fetchall()
    result = pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows],
                                  schema=schema)
    return {"seconds": seconds, "latencies_ms": latencies, "result": result,
            "peak_rss_mb": memory["peak_rss_mb"]}
