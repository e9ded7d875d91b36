"""Serving one engine: ``metrics_of(engine)``, ``serve(engine, port, host)``,
``serving_url(engine)``.

These were ``Engine`` methods; they live here so that the engine never imports
``sstore.observe`` (the dependency points one way, ``tests/project/test_layers.py``). They read the
engine only through its read-only view (``Engine.view()``), and keep what they made for it (the
metrics, the server) in a table keyed weakly by that view: an engine that is dropped takes its
entry along, and ``Engine.close`` stops the server through a hook of the view, first, before
it takes the lock the server's readers need.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sstore.base.errors import DeclarationError, SStoreError
from sstore.observe.access import policy
from sstore.observe.metrics import EngineMetrics
from sstore.observe.server import Server

if TYPE_CHECKING:
    from sstore.engine import Engine
    from sstore.engine_view import EngineView


@dataclass
class _Served:
    metrics: EngineMetrics
    server: Server | None = None


_served: weakref.WeakKeyDictionary[EngineView, _Served] = weakref.WeakKeyDictionary()
_table_lock = threading.Lock()  # the table itself; each engine's entry under its own lock


def _entry(view: EngineView) -> _Served:
    """``view``'s entry, made (with its metrics) on the first call; caller holds
    ``view.lock``."""
    with _table_lock:
        served = _served.get(view)
    if served is None:
        served = _Served(EngineMetrics(view))
        with _table_lock:
            _served[view] = served
    return served


def metrics_of(engine: Engine) -> EngineMetrics:
    """``engine``'s live metrics, made on the first call: from then on every commit updates a
    few counters and a latency histogram (no SQL). Nothing is counted until something asks;
    ``serve`` does."""
    view = engine.view()
    with view.lock:
        return _entry(view).metrics


def serve(engine: Engine, port: int = 0, host: str = "127.0.0.1",
          names: Sequence[str] = ()) -> str:
    """Serve ``engine``'s live status, Prometheus metrics and a dashboard over HTTP from this
    process, until ``engine.close()``; return the URL (``/`` the dashboard, ``/status`` JSON,
    ``/metrics``).

    ``port`` 0 takes any free port. ``host`` 127.0.0.1 (the default) answers this machine
    only. Any other ``host`` needs a bearer token in ``SSTORE_SERVE_TOKEN`` (``ServeError``
    without one), which clients then send. Requests are answered only when their ``Host``
    header names this server: ``host``, the loopback names on loopback, ``names`` and
    ``SSTORE_SERVE_NAMES`` (``sstore.observe.access``). A state file
    gets ``STATE.live.json`` beside it, so that ``sstore status STATE`` reaches this process
    while it holds the file. Serving again returns the same URL; another port or host than
    the one it serves on is refused (``DeclarationError``)."""
    view = engine.view()
    if view.closed:
        raise SStoreError("the engine is closed")
    with view.lock:
        served = _entry(view)
        if served.server is not None:
            if port not in (0, served.server.port) or host != served.server.host:
                raise DeclarationError(f"this engine already serves at {served.server.url}")
            return served.server.url
        server = Server(view, served.metrics, host, port, policy(host, names))
        served.server = server
        view.on_close(lambda: _stop(view))
    return server.start()


def serving_url(engine: Engine) -> str | None:
    """The URL ``serve`` answers on for ``engine``, or None when it does not serve."""
    with _table_lock:
        served = _served.get(engine.view())
    return served.server.url if served is not None and served.server is not None else None


def _stop(view: EngineView) -> None:
    """The close hook: stop serving (the discovery file goes too)."""
    with _table_lock:
        served = _served.get(view)
    if served is not None and served.server is not None:
        server, served.server = served.server, None
        server.stop()
