"""The ``sstore-coalescing`` system of ``benchmarks.tpcdi``: the same streaming dataflow as
``sstore``, fed through a ``sstore.coalesce.Coalescer``.

Why a system of its own: with ``sstore`` every batch the source sends is one engine batch, run
before the next is sent (closed loop), so the engine pays its fixed cost per batch (DuckDB
plans every statement on every execution) however small the batches are. Here the source
offers its batches as it has them and the coalescer's thread ingests *whatever is pending* as
one engine batch, at most ``--coalesce-trades`` trades (``max_events`` events), while the
source may have at most that many events waiting (so an offer waits for at most one engine
batch ahead of it). Each offer is still a batch of ``batch_trades`` trades, and its latency is
still its own: from its offer
(arrival) to its rows visible in PostgreSQL, queueing included. The streaming DimTrade may be
coalesced because its warehouse does not depend on how its input is cut
(``tests/workloads/tpcdi/test_tpcdi_streaming.py``; every run here is checked identical to the
others).
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from benchmarks.tpcdi_feed import EngineFeed
from benchmarks.tpcdi_profile import EngineProfile
from benchmarks.tpcdi_setup import TPCDI_BATCHES
from sstore.coalesce import Coalesced, Coalescer
from sstore.workloads.tpcdi.streaming.batch_ids import engine_batch_id
from sstore.workloads.tpcdi.streaming.pipeline import INPUT_STREAM

#: at most this many trades per engine batch, by default (``--coalesce-trades``)
COALESCE_TRADES = 200


class CoalescingFeed(EngineFeed):
    """``EngineFeed`` through a coalescer (module docstring)."""

    def __init__(self, pipeline: Any, profile: EngineProfile | None, max_events: int) -> None:
        super().__init__(pipeline, profile)
        self.offered: dict[int, tuple[int, float, int]] = {}  # offer -> TPC-DI batch, at, batch
        self.service: dict[int, list[float]] = {b: [] for b in TPCDI_BATCHES}
        self._offers = 0
        self.coalescer = Coalescer(self.engine, INPUT_STREAM, self._batch_id_of,
                                   max_pending=max(1, max_events), max_rows=max_events,
                                   on_batch=self._ran).start()
        if profile is not None:  # the engine's calls run in the coalescer's thread
            assert self.coalescer.thread is not None
            profile.thread = self.coalescer.thread.ident or 0

    @staticmethod
    def _batch_id_of(rows: pa.Table) -> int:
        """The source position of the batch's last event, as ``StreamingDimTrade.stream``
        numbers its batches: a function of the rows, so the coalescer may ask again."""
        return engine_batch_id(rows["tpcdi_batch"][-1].as_py(), rows["line_no"][-1].as_py())

    def send(self, chunk: pa.Table, measured: bool, due: float | None = None) -> None:
        self._offers += 1
        at = time.perf_counter() if due is None else due
        self.coalescer.offer(chunk, token=(self._offers, self._tpcdi_batch, at, measured))

    def _ran(self, done: Coalesced) -> None:
        self._batch += 1  # engine batches run
        measured = [token for token in done.tokens if token[3]]
        for offer, tpcdi_batch, at, _ in measured:
            self.offered[offer] = (tpcdi_batch, at, done.batch_id)
        if measured:  # the engine batch, by its first offer (breakdown, profile)
            self.arrivals[done.batch_id] = (measured[0][1], measured[0][2])
            self.service[measured[0][1]].append(done.seconds * 1000)
        if self.profile is not None:
            self.profile.end_batch(done.batch_id, done.seconds)

    def finish(self) -> None:
        self.coalescer.drain()
        super().finish()

    def close(self) -> None:
        self.coalescer.close()

    def latencies_ms(self) -> dict[int, list[float]]:
        """Per offer: its arrival to its engine batch visible in PostgreSQL."""
        out: dict[int, list[float]] = {b: [] for b in TPCDI_BATCHES}
        for _, (tpcdi_batch, at, batch_id) in sorted(self.offered.items()):
            if batch_id in self.probe.visible:
                out[tpcdi_batch].append((self.probe.visible[batch_id] - at) * 1000)
        return out
