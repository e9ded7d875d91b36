"""``sstore tpcdi run --mode spark-streaming``: the whole DimTrade load on Structured Streaming.

The same order as the engine mode (``streaming.pipeline.StreamingDimTrade.run``):

1. the historical dimensions (PySpark, ``dimensions.build_historical``, shared with every mode;
   skipped when the warehouse has dimension rows: a resumed run, or dimensions loaded before);
2. Batch1's trades as time-ordered CDC lines (``streaming.events.batch1_events``, the lines the
   engine ingests), cut into files of ``batch_size`` events dropped into the query's watched
   directory, then wait until the query has committed them all in PostgreSQL;
3. per incremental batch: its dimension changes (skipped when the warehouse has them), then
   its Trade.txt lines the same way.

Resuming: everything lives under ``workdir`` (inbox, checkpoint, sink id). File names are
derived from the data (``b<batch>-<last line>.txt``), so a second run drops only the files the
first did not; the checkpoint knows which files were processed, and a micro-batch that the
warehouse committed but the checkpoint did not is re-run by Spark and skipped by its batchId
watermark: nothing twice. The batch size must stay the same across a resume (else the files
overlap): a different one is refused.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sstore.base.errors import TerminalError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sstore.workloads.tpcdi.spark_streaming.query import StructuredStreamingDimTrade
    from sstore.workloads.tpcdi.streaming.events import BatchEvents

Progress = Callable[[str, int, int], None]  # (phase, done, total)

#: The master when neither the caller nor ``SSTORE_SPARK_MASTER`` names one.
DEFAULT_MASTER = "local[2]"
QUERY_NAME = "tpcdi_dimtrade"


class ResumeMismatch(TerminalError):
    """The work directory holds a run with another batch size: its files would overlap."""


@dataclass
class SparkStreamingReport:
    batch_size: int
    events: int = 0
    micro_batches: int = 0      # delivered by this process
    replayed_batches: int = 0   # re-run by Spark after a restart, skipped by the watermark
    files_dropped: int = 0
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return sum(self.phases.values())


def spark_master() -> str:
    """``SSTORE_SPARK_MASTER``, else ``local[2]``."""
    return os.environ.get("SSTORE_SPARK_MASTER") or DEFAULT_MASTER


def event_source(data_dir: Path, tpcdi_batch: int) -> str:
    """The file a TPC-DI batch's refused events name (as the engine mode's rejects do)."""
    name = "TradeHistory.txt" if tpcdi_batch == 1 else "Trade.txt"
    return str(data_dir / f"Batch{tpcdi_batch}" / name)


class SparkStreamingDimTrade:
    """One run over a data set into one warehouse schema, resumable from ``workdir``."""

    def __init__(self, data_dir: str | Path, url: str, workdir: str | Path,
                 schema: str = "tpcdi", batch_size: int = 1000,
                 progress: Progress | None = None, spark: SparkSession | None = None,
                 batches: tuple[int, ...] = (1, 2, 3)) -> None:
        from migrators.spark_session import get_spark

        self.data_dir, self.url, self.schema = Path(data_dir), url, schema
        self.workdir, self.batch_size, self.progress = str(workdir), batch_size, progress
        self.batches = batches
        self.spark = spark if spark is not None else get_spark(spark_master())
        self.report = SparkStreamingReport(batch_size)
        os.makedirs(self.workdir, exist_ok=True)
        self._check_batch_size()
        self.job: StructuredStreamingDimTrade | None = None

    def _check_batch_size(self) -> None:
        path = os.path.join(self.workdir, "batch-size")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                before = int(f.read().strip())
            if before != self.batch_size:
                raise ResumeMismatch(f"{self.workdir} holds a run with --batch-size {before}; "
                                     f"resume it with that batch size, or use another work "
                                     f"directory (and a fresh warehouse schema)")
            return
        with open(path, "w", encoding="utf-8") as f:
            f.write(str(self.batch_size))

    def start(self) -> StructuredStreamingDimTrade:
        """Start (or resume) the streaming query; pending files are processed at once."""
        from sstore.workloads.tpcdi.spark_streaming.query import (
            StructuredStreamingDimTrade,
        )

        if self.job is None:
            sources = {b: event_source(self.data_dir, b) for b in self.batches}
            self.job = StructuredStreamingDimTrade(
                self.spark, self.data_dir, self.url, self.schema,
                os.path.join(self.workdir, "query"), QUERY_NAME, sources)
        return self.job

    def run(self) -> SparkStreamingReport:
        """Dimensions, then every TPC-DI batch (see the module docstring)."""
        from sstore.workloads.tpcdi import dimensions
        from sstore.workloads.tpcdi.streaming.events import (
            batch1_events,
            incremental_events,
        )
        from sstore.workloads.tpcdi.warehouse import dimensions_applied

        for batch in self.batches:
            t0 = time.perf_counter()
            if batch == 1:
                if not dimensions_applied(self.url, self.schema, 1):  # else: a resumed run
                    dimensions.build_historical(self.spark, self.data_dir, self.url,
                                                self.schema)
                self.report.phases["dimensions (Spark)"] = time.perf_counter() - t0
                self.stream(batch1_events(self.data_dir), "historical (Batch1)")
            else:
                if not dimensions_applied(self.url, self.schema, batch):
                    dimensions.apply_batch(self.spark, self.data_dir, self.url, self.schema,
                                           batch)
                self.report.phases[f"dimensions Batch{batch}"] = time.perf_counter() - t0
                self.stream(incremental_events(self.data_dir, batch),
                            f"incremental (Batch{batch})")
        return self.report

    def stream(self, events: BatchEvents, phase: str) -> None:
        """One TPC-DI batch: its file rejects, its event lines as files, then wait until the
        warehouse has every one; then seal the batch (``backfill.seal_batch``: a backfill may
        replace it from now on)."""
        from sstore.workloads.tpcdi.backfill import seal_batch

        began = time.perf_counter()
        job = self.start()
        batch = events.tpcdi_batch
        job.store_file_rejects(events.rejects, batch, event_source(self.data_dir, batch))
        lines, total = events.lines, events.lines.num_rows
        for start in range(0, total, self.batch_size):
            chunk = lines.slice(start, self.batch_size)
            last = chunk["line_no"][-1].as_py()
            if job.drop(chunk, f"b{batch}-{last:010d}.txt"):
                self.report.files_dropped += 1
            if self.progress is not None:
                self.progress(phase, start + chunk.num_rows, total)
        job.wait_all()
        seal_batch(self.url, self.schema, batch)
        self.report.events += total
        self.report.micro_batches = job.delivered
        self.report.replayed_batches = job.replays
        self.report.phases[phase] = time.perf_counter() - began

    def close(self) -> None:
        if self.job is not None:
            self.job.close()
            self.job = None
