"""The live snapshot as Prometheus metric families (``/metrics``).

A custom collector: each scrape takes one ``EngineMetrics.snapshot()`` and turns it into
families, so the numbers of one scrape belong together. The TE latency histogram is a
``prometheus_client.Histogram`` in the same per-engine registry, observed on each commit.
What each metric means is listed in docs/operations.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sstore.base import allocator

if TYPE_CHECKING:
    from sstore.observe.metrics import EngineMetrics, Live


class EngineCollector(Collector):
    def __init__(self, metrics: EngineMetrics) -> None:
        self.metrics = metrics
        self.malloc = allocator.in_use()  # fixed for the process's life

    def describe(self) -> list[Metric]:
        return []  # families are made per scrape; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        live = self.metrics.snapshot()
        engine = self.metrics.engine
        info = GaugeMetricFamily("sstore_engine_info", "The engine this process serves "
                                 "(value 1); malloc: the process's allocator (jemalloc or the "
                                 "C library's, sstore.base.allocator)",
                                 labels=["engine_id", "path", "durability", "malloc"])
        info.add_metric([engine.engine_id, engine.path, engine.durability, self.malloc], 1)
        yield info
        yield _gauge("sstore_engine_started", "1 once the engine has started (graph fixed)",
                     [], [([], int(live.started))])
        yield _gauge("sstore_engine_stale", "1 when the engine's lock was busy (a long "
                     "transaction) and ledger numbers are from an earlier read",
                     [], [([], int(live.stale))])
        yield from _procedures(live)
        yield from _streams(live)
        yield from _sinks(live)
        if live.backpressure is not None:
            yield from _backpressure(live.backpressure)
        rt = engine.runtime
        checkpoints = rt.checkpoints if rt is not None else None
        if checkpoints is not None:  # a file-backed engine's own checkpoints
            yield _counter("sstore_checkpoints", "DuckDB checkpoints the engine ran (after a "
                           "commit once the WAL reached its limit, or idle)", [],
                           [([], checkpoints.count)])
            yield _counter("sstore_checkpoint_seconds", "Time spent in those checkpoints", [],
                           [([], round(checkpoints.seconds, 6))])
            yield _gauge("sstore_wal_bytes", "Size of the DuckDB write-ahead log now", [],
                         [([], checkpoints.wal_bytes())])


def _family(kind: type[Metric], name: str, doc: str, labels: list[str],
            samples: list[tuple[list[str], float]]) -> Metric:
    family = kind(name, doc, labels=labels)  # type: ignore[call-arg]
    for values, value in samples:
        family.add_metric(values, value)  # type: ignore[attr-defined]
    return family


def _gauge(name: str, doc: str, labels: list[str],
           samples: list[tuple[list[str], float]]) -> Metric:
    return _family(GaugeMetricFamily, name, doc, labels, samples)


def _counter(name: str, doc: str, labels: list[str],
             samples: list[tuple[list[str], float]]) -> Metric:
    return _family(CounterMetricFamily, name, doc, labels, samples)


def _procedures(live: Live) -> Iterator[Metric]:
    ps, label = live.procedures, ["procedure"]
    yield _counter("sstore_procedure_batches_committed", "Transaction executions this "
                   "process committed", label, [([p.name], p.batches_committed) for p in ps])
    yield _gauge("sstore_procedure_last_batch", "Last batch-id the procedure committed",
                 label, [([p.name], p.last_batch) for p in ps])
    yield _gauge("sstore_procedure_pending_batches", "Input batches waiting for the "
                 "procedure", label, [([p.name], p.pending) for p in ps])
    yield _gauge("sstore_procedure_halted", "1 when the procedure is halted on an error",
                 label, [([p.name], int(p.halted is not None)) for p in ps])
    yield _counter("sstore_procedure_rows_in", "Input rows the procedure read (this "
                   "process)", label, [([p.name], p.rows_in) for p in ps])
    yield _counter("sstore_procedure_rows_out", "Output rows the procedure wrote (this "
                   "process)", label, [([p.name], p.rows_out) for p in ps])


def _streams(live: Live) -> Iterator[Metric]:
    ss, label = live.streams, ["stream", "kind"]
    yield _gauge("sstore_stream_last_batch", "Batch-id through which the stream is complete",
                 label, [([s.name, s.kind], s.last_batch) for s in ss])
    yield _gauge("sstore_stream_retained_batches", "Batches the engine still keeps", label,
                 [([s.name, s.kind], s.retained_batches) for s in ss])
    yield _gauge("sstore_stream_retained_rows", "Rows the engine still keeps (streams; "
                 "windows are counted by /status)", label,
                 [([s.name, s.kind], s.retained_rows) for s in ss if s.retained_rows is not None])
    yield _gauge("sstore_stream_holders", "Readers the stream keeps batches for (procedures "
                 "and external consumers)", label,
                 [([s.name, s.kind], len(s.holders)) for s in ss])
    border = [s for s in ss if s.kind == "border"]
    yield _counter("sstore_stream_batches_ingested", "Batches this process ingested", label,
                   [([s.name, s.kind], s.batches_ingested) for s in border])


def _sinks(live: Live) -> Iterator[Metric]:
    ks, label = live.sinks, ["sink", "stream", "target"]

    def values(k: object) -> list[str]:
        return [k.name, k.stream, k.target]  # type: ignore[attr-defined]

    yield _gauge("sstore_sink_watermark", "Last batch the target has committed", label,
                 [(values(k), k.watermark) for k in ks])
    yield _gauge("sstore_sink_lag_batches", "Committed batches of the stream the target "
                 "does not have yet", label, [(values(k), k.lag_batches) for k in ks])
    yield _gauge("sstore_sink_lag_seconds", "Seconds since the oldest batch the target does "
                 "not have committed (0: none waiting)", label,
                 [(values(k), k.lag_seconds) for k in ks if k.lag_seconds is not None])
    yield _gauge("sstore_sink_rows_per_second", "Rows delivered per second over the last "
                 "seconds", label, [(values(k), k.rows_per_s) for k in ks])
    yield _counter("sstore_sink_rows", "Rows this process delivered", label,
                   [(values(k), k.rows) for k in ks])
    yield _counter("sstore_sink_retries", "Transient failures retried", label,
                   [(values(k), k.retries) for k in ks])
    yield _gauge("sstore_sink_halted", "1 when the sink stopped on a terminal error", label,
                 [(values(k), int(k.halted is not None)) for k in ks])
    yield _gauge("sstore_sink_running", "1 when the sink is attached (moves batches as they "
                 "commit)", label, [(values(k), int(k.running)) for k in ks])
    yield _gauge("sstore_sink_last_error_info", "The sink's latest error (value 1; absent "
                 "when there is none)", label + ["error"],
                 [(values(k) + [k.last_error], 1) for k in ks if k.last_error])


def _backpressure(report: Mapping[str, Any]) -> Iterator[Metric]:
    """Readers' lag against their bounds, and ingests waiting on them
    (``sstore.execution.backpressure``)."""
    cs, label = report["consumers"], ["consumer", "kind", "streams"]

    def values(c: Mapping[str, Any]) -> list[str]:
        return [c["consumer"], c["kind"], ",".join(c["streams"])]

    yield _gauge("sstore_backpressure_lag_batches", "Batches the reader leaves retained (stored "
                 "above what it took, plus on their way to it)", label,
                 [(values(c), c["lag_batches"]) for c in cs])
    yield _gauge("sstore_backpressure_lag_rows", "Rows stored above what the reader took",
                 label, [(values(c), c["lag_rows"]) for c in cs])
    yield _gauge("sstore_backpressure_lag_bytes", "Estimated bytes of those rows (Arrow size)",
                 label, [(values(c), c["lag_bytes"]) for c in cs])
    yield _gauge("sstore_backpressure_bound_batches", "The reader's bound in batches (absent: "
                 "none)", label, [(values(c), c["bound_batches"]) for c in cs
                                  if c["bound_batches"] is not None])
    yield _gauge("sstore_backpressure_bound_bytes", "The reader's bound in bytes (absent: "
                 "none)", label, [(values(c), c["bound_bytes"]) for c in cs
                                  if c["bound_bytes"] is not None])
    yield _gauge("sstore_backpressure_over_bound", "1 when the reader is at or past its bound: "
                 "ingests upstream wait or are refused", label,
                 [(values(c), int(c["over"])) for c in cs])
    yield _gauge("sstore_backpressure_waiting_ingests", "Ingests waiting for the reader now",
                 label, [(values(c), c["waiting_ingests"]) for c in cs])
    yield _counter("sstore_backpressure_blocked_seconds", "Ingest time spent waiting for the "
                   "reader", label, [(values(c), c["blocked_seconds"]) for c in cs])
    yield _counter("sstore_backpressure_refused", "Ingests refused because of the reader",
                   label, [(values(c), c["refused"]) for c in cs])
    yield _gauge("sstore_ingest_blocked", "Ingests waiting for readers past their bound now "
                 "(0: ingest flows)", [], [([], report["waiting_ingests"])])
    yield _counter("sstore_ingest_blocked_seconds", "Total time ingests spent waiting for "
                   "readers past their bound", [], [([], report["blocked_seconds"])])
    yield _counter("sstore_ingest_refused", "Ingests refused: timeout (IngestTimeoutError, a "
                   "running reader too slow) or stalled (ConsumerStalledError, a reader that "
                   "cannot progress)", ["reason"],
                   [(["timeout"], report["timeouts"]), (["stalled"], report["stalls"])])
