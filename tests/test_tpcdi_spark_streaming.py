"""``--mode spark-streaming``: the DimTrade dataflow on Spark Structured Streaming.

Its warehouse equals the engine mode's row for row (DimTrade, DImessages, the rejected lines),
and a query restarted from its checkpoint that re-runs a micro-batch the warehouse already
committed writes nothing twice (batchId in the watermark, ``migrators.delivery``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from sstore.cli import main
from sstore.workloads.tpcdi import dimensions
from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.spark_streaming.query import BATCH_STREAM
from sstore.workloads.tpcdi.spark_streaming.run import (
    ResumeMismatch,
    SparkStreamingDimTrade,
)
from sstore.workloads.tpcdi.streaming.events import batch1_events
from sstore.workloads.tpcdi.streaming.pipeline import StreamingDimTrade
from sstore.workloads.tpcdi.warehouse import TABLES, create_warehouse

BATCH_SIZE = 1500
# Batch3 lines each mode must reject: an update of a trade that never existed, an unknown
# status, an unparsable time, an unknown symbol
BAD_LINES = (
    "U|999001|99999991|2017-07-09 10:06:00|CMPT|TLB|1|AAAAAAAAAAAABEC|100|10.50|7||10.40|1|1|1",
    "I|999002|99999992|2017-07-09 10:00:00|XXXX|TLB|1|AAAAAAAAAAAABEC|100|10.50|7|Ann||||",
    "I|999003|99999993|2017-07-09 25:00:00|PNDG|TLB|1|AAAAAAAAAAAABEC|100|10.50|7|Ann||||",
    "I|999004|99999994|2017-07-09 10:00:00|PNDG|TLB|1|NO-SUCH-SYMBOL|100|10.50|7|Ann||||",
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tpcdi")
    generate(0.01, out, seed=11)
    with open(out / "Batch3" / "Trade.txt", "a", encoding="utf-8", newline="") as f:
        f.write("".join(line + "\r\n" for line in BAD_LINES))
    return out


def rows(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url) as con:
        return con.execute(sql).fetchall()


def test_spark_streaming_resumes_exactly_once_and_equals_the_engine(
        spark, data: Path, pg_url: str, tmp_path: Path) -> None:
    os.environ.pop("SSTORE_SPARK_MASTER", None)  # the mode's default, local[2], as the fixture
    for schema in ("tpcdi_engine", "tpcdi_sss"):
        create_warehouse(pg_url, schema)
    # the historical dimensions once (the same job every mode runs), copied to both schemas
    dimensions.build_historical(spark, data, pg_url, "tpcdi_engine")
    with psycopg.connect(pg_url) as con:
        for table in TABLES:
            con.execute(f"INSERT INTO tpcdi_sss.{table} OVERRIDING SYSTEM VALUE "
                        f"SELECT * FROM tpcdi_engine.{table}")
    engine = StreamingDimTrade(data, pg_url, str(tmp_path / "state.duckdb"), "tpcdi_engine",
                               batch_size=BATCH_SIZE)
    try:
        engine.refresh_lookups()
        with engine.attached():
            engine.stream(batch1_events(data), "historical (Batch1)")
        for batch in (2, 3):
            engine.run_incremental(batch, spark)
    finally:
        engine.close()

    # Batch1 only (its dimensions are there: not built again), then a crash between the
    # sink's COMMIT and the checkpoint's commit log: the last micro-batch is in PostgreSQL,
    # but Spark does not know it finished
    workdir = tmp_path / "sss"
    first = SparkStreamingDimTrade(data, pg_url, workdir, "tpcdi_sss", BATCH_SIZE, spark=spark,
                                   batches=(1,))
    try:
        report = first.run()
    finally:
        first.close()
    assert report.micro_batches >= 2 and report.replayed_batches == 0
    assert report.phases["dimensions (Spark)"] < 5  # skipped
    commits = workdir / "query" / "checkpoint" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)  # Hadoop's checksum of that file
    with psycopg.connect(pg_url) as con:
        watermark = con.execute("SELECT batch_id FROM sstore.watermarks WHERE stream = %s",
                                (BATCH_STREAM,)).fetchall()
    assert watermark == [(last + 1,)]  # Spark's batchId counts from 0, watermarks from 1

    with pytest.raises(ResumeMismatch, match="batch-size 1500"):
        SparkStreamingDimTrade(data, pg_url, workdir, "tpcdi_sss", 999, spark=spark)

    # resumed by the command: Spark re-runs the last micro-batch (skipped by its batchId),
    # the files already dropped are not dropped again, Batch2 and Batch3 follow
    result = CliRunner().invoke(main, [
        "tpcdi", "run", "--mode", "spark-streaming", "--input", str(data), "--postgres", pg_url,
        "--schema", "tpcdi_sss", "--checkpoint", str(workdir), "--batch-size", str(BATCH_SIZE),
        "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    resumed = json.loads(result.stdout[result.stdout.index("{"):])
    assert resumed["mode"] == "spark-streaming"
    assert resumed["replayed_batches"] == 1, resumed
    assert resumed["files_dropped"] == 2, resumed  # Batch2 and Batch3: one file each

    for table, columns, order in (
            ("dimtrade", "*", "tradeid"), ("dimessages", "*", "messagedata, batchid"),
            ("rejects", "source_file, batch_id, line_number, raw_line",
             "batch_id, source_file, line_number")):
        want = rows(pg_url, f"SELECT {columns} FROM tpcdi_engine.{table} ORDER BY {order}")
        got = rows(pg_url, f"SELECT {columns} FROM tpcdi_sss.{table} ORDER BY {order}")
        assert want, f"{table} is empty"
        assert got == want, f"{table} differs between the engine and Spark Structured Streaming"
    # the four bad lines, each with a reason (its wording is the engines' one difference)
    refused = rows(pg_url, "SELECT raw_line, reason FROM tpcdi_sss.rejects WHERE batch_id = 3")
    assert sorted(line for line, _ in refused) == sorted(BAD_LINES)
    assert all(reason for _, reason in refused)


def test_a_second_checkpoint_into_the_same_table_is_refused(spark, pg_url: str,
                                                            tmp_path: Path) -> None:
    """A new checkpoint numbers its micro-batches from 0 again: were it taken for the first
    one, its batches would be skipped as replays and lost. The protocol refuses it instead."""
    import pyarrow as pa

    from migrators import delivery
    from sstore.workloads.tpcdi.spark_streaming.query import (
        SOURCE,
        StreamingQueryFailed,
        StructuredStreamingDimTrade,
    )
    from sstore.workloads.tpcdi.streaming.events import LINE_SCHEMA

    create_warehouse(pg_url, "tpcdi")
    with psycopg.connect(pg_url) as con:  # a first query delivered micro-batches 1..5
        delivery.ensure_watermarks(con)
        first = delivery.SinkKey(f"{SOURCE} first-checkpoint", BATCH_STREAM, "tpcdi.dimtrade")
        delivery.deliver(con, first, 1, 5, lambda cur, _watermark: 0, after=None)
    job = StructuredStreamingDimTrade(spark, tmp_path, pg_url, "tpcdi", str(tmp_path / "q2"),
                                      "second_checkpoint")
    try:
        line = "I|1|7|2017-07-08 10:00:00|PNDG|TLB|1|SYMB|100|10.50|42|Ann||||"
        job.drop(pa.table({"line": [line], "line_no": [1], "source": ["Trade.txt"],
                           "tpcdi_batch": [2]}, schema=LINE_SCHEMA), "b2-0000000001.txt")
        with pytest.raises(StreamingQueryFailed, match="from another source"):
            job.wait_all()
    finally:
        job.close()
    assert rows(pg_url, "SELECT count(*) FROM tpcdi.dimtrade") == [(0,)]
    with psycopg.connect(pg_url) as con:  # no watermark row for the second checkpoint
        assert con.execute("SELECT count(*) FROM sstore.watermarks WHERE stream = %s",
                           (BATCH_STREAM,)).fetchone() == (1,)
