"""The Structured Streaming baselines' ``BatchBoard`` lives in the library now
(``sstore.workloads.tpcdi.spark_streaming.board``); re-exported for ``benchmarks.engine_spark``."""

from sstore.workloads.tpcdi.spark_streaming.board import BatchBoard

__all__ = ["BatchBoard"]
