"""The ``sstore`` system's feed of ``benchmarks.tpcdi``: the streaming DimTrade dataflow fed batch
after batch (``Engine.ingest_and_run``), every batch timed from its arrival to its rows visible
in PostgreSQL (``CommitProbe``). ``benchmarks.tpcdi_coalescing`` feeds the same dataflow
through a coalescer; ``benchmarks.tpcdi_runs`` runs either.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa

from benchmarks.common import percentile
from benchmarks.tpcdi_profile import EngineProfile
from benchmarks.tpcdi_setup import TPCDI_BATCHES
from migrators.engine_to_postgres import Delivered
from sstore.workloads.tpcdi.streaming.events import BatchEvents


class CommitProbe:
    """When each engine batch became visible in PostgreSQL (see the module docstring)."""

    def __init__(self, sinks: list[Any]) -> None:
        self.visible: dict[int, float] = {}
        self._lock = threading.Lock()
        for sink in sinks:
            sink.on_delivered = self._delivered

    def _delivered(self, chunk: Delivered) -> None:
        with self._lock:
            for batch_id in chunk.batch_ids:
                self.visible[batch_id] = max(self.visible.get(batch_id, 0.0), chunk.committed_at)


class EngineFeed:
    """Feeds the streaming DimTrade dataflow as ``StreamingDimTrade.stream`` does
    (``Engine.ingest_and_run``: the batch and its five TEs in one transaction; the sinks,
    one group, catch up in their thread), timing every batch."""

    def __init__(self, pipeline: Any, profile: EngineProfile | None = None) -> None:
        self.pipeline = pipeline
        self.profile = profile
        self.engine = pipeline.engine
        self.probe = CommitProbe(pipeline.sinks)
        self.arrivals: dict[int, tuple[int, float]] = {}  # engine batch -> TPC-DI batch, time
        self.last_te: dict[int, float] = {}
        self.te_ms: dict[str, list[float]] = {}
        self._mark = 0.0
        self._batch = 0
        self._tpcdi_batch = 0
        self.engine.observe(self._observe)
        if profile is not None:
            self.engine.observe(profile.observe)

    def _observe(self, event: Any) -> None:
        """Each commit's time per node: its own BEGIN-to-COMMIT time when the engine reports it
        (a group commit gives its members one commit time, so gaps between commits would put
        the whole group on its first member), else the time since the previous commit."""
        took = event.seconds if event.seconds else event.at - self._mark
        self.te_ms.setdefault(event.node, []).append(took * 1000)
        self._mark = event.at
        if event.kind == "te":
            self.last_te[event.batch_id] = event.at

    def begin(self, events: BatchEvents) -> None:
        self._tpcdi_batch = events.tpcdi_batch
        self.pipeline.store_file_rejects(events)  # as StreamingDimTrade.stream does

    def send(self, chunk: pa.Table, measured: bool, due: float | None = None) -> None:
        self._batch += 1
        self._mark = t0 = time.perf_counter()
        self.engine.ingest_and_run("trade_lines", chunk, batch_id=self._batch)
        if self.profile is not None:
            self.profile.end_batch(self._batch, time.perf_counter() - t0)
        if measured:
            self.arrivals[self._batch] = (self._tpcdi_batch, t0 if due is None else due)

    def close(self) -> None:
        """End the feed (nothing to end here; a coalescing feed stops its thread)."""

    def finish(self) -> None:
        for sink in self.pipeline.sinks:
            if not sink.flush(timeout=900):
                raise TimeoutError(f"sink to {sink.table} did not catch up: {sink.last_error}")

    def latencies_ms(self) -> dict[int, list[float]]:
        out: dict[int, list[float]] = {b: [] for b in TPCDI_BATCHES}
        for batch, (tpcdi_batch, t) in sorted(self.arrivals.items()):
            if batch in self.probe.visible:
                out[tpcdi_batch].append((self.probe.visible[batch] - t) * 1000)
        return out

    def breakdown(self) -> dict[str, float]:
        """Median ms per batch: each procedure's TE (and the ingest), and the wait from the
        last TE's commit to the batch being visible in PostgreSQL (the sinks)."""
        out = {f"TE {node}" if node != "trade_lines" else "ingest": round(percentile(v, 0.5), 1)
               for node, v in self.te_ms.items()}
        waits = [(self.probe.visible[b] - self.last_te[b]) * 1000 for b in self.arrivals
                 if b in self.probe.visible and b in self.last_te]
        out["last TE commit -> visible in PostgreSQL (sinks)"] = round(percentile(waits, 0.5), 1)
        return out

    def profile_summary(self) -> dict[str, Any]:
        """The profile (``tpcdi_profile``) over the historical phase's measured batches."""
        assert self.profile is not None
        hist = sorted(b for b, (tpcdi_batch, _) in self.arrivals.items() if tpcdi_batch == 1)
        waits = {b: self.probe.visible[b] - self.last_te[b] for b in hist
                 if b in self.probe.visible and b in self.last_te}
        return self.profile.summary(hist, waits)
