"""The Spark DimTrade pipeline end to end: the bulk alternative to the streaming dataflow.

Batch1 (the historical load) builds every dimension and then DimTrade and DImessages in PySpark;
then, for Batch2 and Batch3, the dimension changes and the trade CDC rows are applied in turn.
The dimension code is shared with the streaming pipeline, so both warehouses are comparable row
for row.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass
class SparkReport:
    phases: dict[str, float] = field(default_factory=dict)
    trade_reports: list[object] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(self.phases.values())


def run_spark(data_dir: str | Path, url: str, schema: str = "tpcdi",
              progress: Progress | None = None) -> SparkReport:
    from migrators.spark_session import get_spark
    from sstore.workloads.tpcdi import dimensions, dimtrade_spark

    spark = get_spark()
    report = SparkReport()
    steps: list[tuple[str, Callable[[], object]]] = [
        ("dimensions (Spark)", lambda: dimensions.build_historical(spark, data_dir, url, schema)),
        ("historical (Batch1)", lambda: dimtrade_spark.load_historical(spark, data_dir, url,
                                                                       schema)),
    ]
    for batch in (2, 3):
        steps.append((f"dimensions Batch{batch}", functools.partial(
            dimensions.apply_batch, spark, data_dir, url, schema, batch)))
        steps.append((f"incremental (Batch{batch})", functools.partial(
            dimtrade_spark.apply_batch, spark, data_dir, url, schema, batch)))
    for done, (phase, step) in enumerate(steps, start=1):
        t0 = time.perf_counter()
        result = step()
        report.phases[phase] = time.perf_counter() - t0
        if "Batch" in phase and "dimensions" not in phase:
            report.trade_reports.append(result)
        if progress is not None:
            progress(phase, done, len(steps))
    return report
