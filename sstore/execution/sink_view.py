"""What a sink shows the engine: a small snapshot, taken without any lock.

A sink (``migrators.StreamToPostgres``, or any object with ``metrics_snapshot``) registers
itself with ``Engine.register_sink``. The engine reads it for backpressure (``sstore.
backpressure``: is the sink running, on a thread of its own, halted?), and ``sstore.observe``
reads it for metrics and ``/status`` when someone asks. The protocol lives in the core so that
the dependency points one way: sinks and ``sstore.observe`` import this module, the engine
never imports a sink nor ``sstore.observe``.

What the engine adds from its own ledger: the lag (committed batches of the stream above the
watermark, and how long ago the oldest of them committed) and the rows per second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class SinkSnapshot:
    """One sink as it is now. ``name`` is the consumer name it holds its stream under
    (``Engine.consumer``), ``target`` where it writes. ``watermark`` is the last batch the
    target has committed, or None when the sink has not read it yet (the engine then uses the
    consumer's acknowledgement). ``rows`` and ``batches`` count what this process delivered;
    ``retries`` the transient failures it retried. ``halted`` is the terminal error that
    stopped it; ``last_error`` the latest error, even one a retry got past. ``running``: it
    moves batches as they commit (attached), rather than only when called. ``background``:
    it moves them on a thread of its own, so an ingest may wait for it (``sstore.
    backpressure``); a sink that runs only when called, or in the committing thread, cannot
    catch up while an ingest waits, and the ingest is refused instead."""

    name: str
    stream: str
    target: str
    watermark: int | None
    rows: int
    batches: int
    retries: int
    last_error: str | None
    halted: str | None
    running: bool
    background: bool = False


@runtime_checkable
class ObservableSink(Protocol):
    """Anything the engine can show (and wait for) as a sink."""

    def metrics_snapshot(self) -> SinkSnapshot:
        """The sink's numbers now; quick, no I/O, no engine call (it runs while a metrics
        reader or an ingest may hold the engine's lock)."""
        ...
