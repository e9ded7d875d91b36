"""The issue's promise: the Spark pipeline and the streaming pipeline build identical
``dimtrade`` and ``dimessages`` tables from the same data set, and both pass the audit."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from sstore.workloads.tpcdi.audit import run_audit
from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.spark_pipeline import run_spark
from sstore.workloads.tpcdi.streaming.pipeline import StreamingDimTrade
from sstore.workloads.tpcdi.warehouse import create_warehouse


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tpcdi")
    generate(0.01, out, seed=11)
    return out


def rows(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url) as con:
        return con.execute(sql).fetchall()


def test_spark_and_streaming_warehouses_are_identical_and_pass_the_audit(
        spark, data: Path, pg_url: str, tmp_path: Path) -> None:
    for schema in ("tpcdi_spark", "tpcdi_stream"):
        create_warehouse(pg_url, schema)
    run_spark(data, pg_url, "tpcdi_spark")
    streaming = StreamingDimTrade(data, pg_url, str(tmp_path / "state.duckdb"), "tpcdi_stream",
                                  batch_size=200)
    try:
        report = streaming.run()
    finally:
        streaming.close()
    assert report.engine_batches > 3
    for table, order in (("dimtrade", "tradeid"), ("dimessages", "messagedata, batchid")):
        spark_rows = rows(pg_url, f"SELECT * FROM tpcdi_spark.{table} ORDER BY {order}")
        stream_rows = rows(pg_url, f"SELECT * FROM tpcdi_stream.{table} ORDER BY {order}")
        assert spark_rows, f"{table} is empty"
        assert spark_rows == stream_rows, f"{table} differs between the pipelines"
    for schema in ("tpcdi_spark", "tpcdi_stream"):
        audit = run_audit(pg_url, schema, data)
        assert audit.ok, f"{schema}: {[(c.name, c.observed, c.expected) for c in audit.failed]}"
    # running the streaming pipeline again on the same state changes nothing
    again = StreamingDimTrade(data, pg_url, str(tmp_path / "state.duckdb"), "tpcdi_stream",
                              batch_size=200)
    try:
        again.run()
    finally:
        again.close()
    assert rows(pg_url, "SELECT count(*) FROM tpcdi_stream.dimtrade") == \
        rows(pg_url, "SELECT count(*) FROM tpcdi_spark.dimtrade")
    assert rows(pg_url, "SELECT count(*) FROM tpcdi_stream.dimessages") == \
        rows(pg_url, "SELECT count(*) FROM tpcdi_spark.dimessages")
