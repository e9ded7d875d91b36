"""A read-only view of one engine, for code layered above the core (``sstore.observe``).

Metrics, ``/status`` and the dashboard need to read a running engine (its identity, graph,
ledger, sinks, backpressure) and to be told of three things (each commit, each sink
registered, the engine closing). They get exactly that here, and nothing that writes: no
ingest, no transaction, no SQL connection of their own. The dependency points one way:
``sstore.observe`` imports this module, the engine never imports ``sstore.observe``
(``tests/project/test_layers.py`` checks it), so the engine works, and is tested, without it.

``Engine.view()`` returns the engine's one view (the same object on every call), so a
package above may key per-engine state on it (``sstore.observe.serving`` does, weakly).

The hooks run where the engine runs them: ``observe`` observers and ``on_sink`` listeners
under the engine's lock (keep them quick, no call back into the engine); ``on_close`` hooks
first in ``Engine.close``, before it takes its lock (a hook may stop a thread that waits for
that lock, as the HTTP server's readers do).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from sstore.storage.status import EngineStatus, read_status

if TYPE_CHECKING:
    from sstore.dataflow.graph import Graph
    from sstore.engine import Engine
    from sstore.execution.backpressure import PressureReport
    from sstore.execution.runtime import CommitEvent, Runtime
    from sstore.execution.sink_view import ObservableSink


class EngineView:
    """What may be read of one engine (see the module docstring). Made by the engine."""

    def __init__(self, engine: Engine, sink_listeners: list[Callable[[ObservableSink], None]],
                 close_hooks: list[Callable[[], None]]) -> None:
        self._engine = engine
        self._sink_listeners = sink_listeners  # the engine's own lists: it calls them
        self._close_hooks = close_hooks

    # ------------------------------------------------------------------ identity
    @property
    def path(self) -> str:
        return self._engine.path

    @property
    def durability(self) -> str:
        return self._engine.durability

    @property
    def engine_id(self) -> str:
        return self._engine.engine_id

    @property
    def closed(self) -> bool:
        return self._engine.closed

    @property
    def graph(self) -> Graph:
        return self._engine.graph

    @property
    def lock(self) -> threading.RLock:
        """The engine's lock: read ``runtime`` under it (take it with a timeout, so that a
        reader never waits behind a long transaction)."""
        return self._engine.lock

    @property
    def runtime(self) -> Runtime | None:
        """The started engine's shared state, None before the first ingest, run or query.
        To be read only, under ``lock``."""
        return self._engine.runtime

    # ------------------------------------------------------------------ reads
    def status(self) -> EngineStatus:
        """``Engine.status()``, or before the engine starts what the state file says so far
        (reading status must not start the engine: its program may still be declaring)."""
        engine = self._engine
        with engine.lock:
            if engine.runtime is None:
                return read_status(engine.connection, durability=engine.durability,
                                   path=engine.path)
            return engine.status()

    def sinks(self) -> list[ObservableSink]:
        """The registered sinks (``Engine.register_sink``), in registration order."""
        return self._engine.sinks()

    def pressure(self, rt: Runtime) -> PressureReport:
        """Readers' lag against their bounds (``sstore.execution.backpressure``); caller holds
        ``lock``."""
        return self._engine.backpressure.report(rt)

    # ------------------------------------------------------------------ being told
    def observe(self, observer: Callable[[CommitEvent], None]) -> None:
        """``Engine.observe``: ``observer(event)`` after every commit, under the lock."""
        self._engine.observe(observer)

    def on_sink(self, listener: Callable[[ObservableSink], None]) -> None:
        """``listener(sink)`` on each later ``Engine.register_sink``, under the lock."""
        with self._engine.lock:
            self._sink_listeners.append(listener)

    def on_close(self, hook: Callable[[], None]) -> None:
        """``hook()`` once, first thing in ``Engine.close``, before it takes its lock."""
        with self._engine.lock:
            self._close_hooks.append(hook)
