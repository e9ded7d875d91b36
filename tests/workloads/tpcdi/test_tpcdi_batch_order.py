"""TPC-DI Batch3 before Batch2 is refused before anything is sent.

It used to go through: ``run_incremental(3)`` applied Batch3's dimension changes, streamed
Batch3's trades (its updates of trades Batch2 creates rejected as unknown) and sealed it;
``run_incremental(2)`` then found the warehouse's dimensions "applied" (rows of batch 3 count
for batch 2 too) and skipped Batch2's for good, and only its trades got a loud
``OutOfOrderBatchError`` from the engine. Stand-in dimensions in the engine (no Spark); the
warehouse gets one DimAccount row per batch whose dimension changes count as applied.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.streaming.events import batch1_events, incremental_events
from sstore.workloads.tpcdi.streaming.pipeline import BatchOrderError, StreamingDimTrade
from sstore.workloads.tpcdi.streaming.source_check import recorded
from sstore.workloads.tpcdi.warehouse import create_warehouse
from tests.workloads.tpcdi.test_tpcdi_source_check import Crash
from tests.workloads.tpcdi.test_tpcdi_streaming import stand_in_dimensions

SCHEMA = "tpcdi_order"
NO_SPARK = object()  # a refused batch must not get as far as the dimension job


def pipeline(data: Path, pg_url: str, state: Path) -> StreamingDimTrade:
    p = StreamingDimTrade(data, pg_url, str(state), SCHEMA, batch_size=5)
    stand_in_dimensions(p.engine, data)
    p.refresh_lookups = lambda: None  # type: ignore[method-assign]  # keep the stand-ins
    return p


def dimensions_of(pg_url: str, batch: int) -> None:
    """The warehouse has ``batch``'s dimension changes (``dimensions_applied``): a stand-in."""
    with psycopg.connect(pg_url) as con:
        con.execute(f"INSERT INTO {SCHEMA}.dimaccount (sk_accountid, accountid, sk_brokerid, "
                    f"sk_customerid, status, iscurrent, batchid, effectivedate, enddate) "
                    f"VALUES (%s, %s, 1, 1, 'ACTIVE', true, %s, '2017-07-08', '9999-12-31')",
                    (-batch, -batch, batch))


def warehouse_trades(pg_url: str) -> int:
    with psycopg.connect(pg_url) as con:
        row = con.execute(f"SELECT count(*) FROM {SCHEMA}.dimtrade").fetchone()
    return int(row[0]) if row else 0


def test_batch3_before_batch2_is_refused_until_batch2_is_fully_applied(
        pg_url: str, tmp_path: Path) -> None:
    create_warehouse(pg_url, SCHEMA)
    data = tmp_path / "tpcdi"
    generate(0.01, data, seed=3)
    total2 = incremental_events(data, 2).lines.num_rows
    total3 = incremental_events(data, 3).lines.num_rows

    fresh = pipeline(data, pg_url, tmp_path / "fresh.duckdb")  # would be seeded: no Batch2
    dimensions_of(pg_url, 2)
    with pytest.raises(BatchOrderError, match=r"neither this state file nor "
                                              r"tpcdi_order\.dimtrade has its trades"):
        fresh.run_incremental(3, NO_SPARK)  # type: ignore[arg-type]
    fresh.close()
    with psycopg.connect(pg_url) as con:
        con.execute(f"DELETE FROM {SCHEMA}.dimaccount")

    p = pipeline(data, pg_url, tmp_path / "state.duckdb")
    try:
        p.stream(batch1_events(data), "Batch1", migrate=False)
        with pytest.raises(BatchOrderError, match="Batch3 builds on Batch2, whose dimension "
                                                  "changes are not in tpcdi_order"):
            p.run_incremental(3, NO_SPARK)  # type: ignore[arg-type]
        dimensions_of(pg_url, 2)
        with pytest.raises(BatchOrderError, match=f"has taken 0 of {total2} event lines: "
                                                  f"nothing of Batch3 was sent; "
                                                  r"run_incremental\(2\) first"):
            p.run_incremental(3, NO_SPARK)  # type: ignore[arg-type]
        assert p.lines_ingested(3) == 0 and recorded(p.engine, 3) is None
        assert warehouse_trades(pg_url) == 0  # the sinks never ran

        def crash(_phase: str, done: int, _total: int) -> None:
            if done >= 5:
                raise Crash("Batch2 stops after its first engine batch")

        p.progress = crash
        with pytest.raises(Crash):
            p.run_incremental(2, NO_SPARK)  # type: ignore[arg-type]
        taken = p.lines_ingested(2)
        assert 0 < taken < total2
        with pytest.raises(BatchOrderError, match=f"taken {taken} of {total2} event lines"):
            p.run_incremental(3, NO_SPARK)  # type: ignore[arg-type]
        assert p.lines_ingested(3) == 0

        p.progress = None
        p.run_incremental(2, NO_SPARK)  # type: ignore[arg-type]  # resumes
        assert p.lines_ingested(2) == total2
        dimensions_of(pg_url, 3)
        p.run_incremental(3, NO_SPARK)  # type: ignore[arg-type]
        assert p.lines_ingested(3) == total3
        p.run_incremental(3, NO_SPARK)  # type: ignore[arg-type]  # again: allowed, a no-op
        assert p.lines_ingested(3) == total3 and warehouse_trades(pg_url) > 0
    finally:
        p.close()
