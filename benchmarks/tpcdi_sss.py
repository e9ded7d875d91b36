"""DimTrade on Spark Structured Streaming, the baseline ``benchmarks.tpcdi`` measures.

The job itself is a product mode now (``sstore tpcdi run --mode spark-streaming``) and lives
in the library: ``sstore.workloads.tpcdi.spark_streaming`` (``parse``: step 1; ``query``: the
streaming query, foreachBatch running the shared DimTrade rules, exactly once into PostgreSQL
by batchId through ``migrators.delivery``). The benchmark drives it closed loop: ``send``
drops one file and returns when its micro-batch has committed; latency is from just before
the file is written to just after that COMMIT.
"""

from sstore.workloads.tpcdi.spark_streaming.parse import parse_lines, trade_events
from sstore.workloads.tpcdi.spark_streaming.query import (
    SOURCE,
    WAIT_SECONDS,
    BatchTimes,
    StructuredStreamingDimTrade,
)

__all__ = ["SOURCE", "WAIT_SECONDS", "BatchTimes", "StructuredStreamingDimTrade", "parse_lines",
           "trade_events"]
