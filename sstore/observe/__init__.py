"""A running engine is not a black box: live status, Prometheus metrics and a dashboard.

Nothing here runs unless asked: ``sstore.observe.serve(engine, port, host)`` (or ``--serve
PORT`` on the commands that run a dataflow) starts a small HTTP server in the engine's process:

- ``/metrics``: Prometheus text (``prometheus_client``, one registry per engine);
- ``/status``: ``Engine.status().to_dict()`` plus live numbers (rates, lags, sinks) as JSON;
- ``/``: a dashboard page (one file, no external assets) that draws the dataflow.

This package reads the engine only through its read-only view (``Engine.view()``,
``sstore.engine_view``); the engine never imports it (``tests/project/test_layers.py``).

Modules: ``serving`` (``serve``, ``metrics_of``, ``serving_url``: one engine's metrics and
server), ``sinks`` (what a sink shows the engine, kept in the core: ``sstore.execution.sink_view``),
``rates`` (rates over a sliding window),
``metrics`` (the commit observer and the live snapshot), ``prometheus`` (the snapshot as
metric families), ``livestatus`` (the ``/status`` document), ``server`` (HTTP), ``access``
(who may read it: the Host check, the bearer token off loopback, read-only), ``live``
(the discovery file beside the state file, and the client ``sstore status`` uses when the
file is locked by a serving engine).
"""

from typing import TYPE_CHECKING, Any

from sstore.observe.sinks import ObservableSink, SinkSnapshot

if TYPE_CHECKING:
    from sstore.observe.serving import metrics_of, serve, serving_url

__all__ = ["ObservableSink", "SinkSnapshot", "metrics_of", "serve", "serving_url"]

_SERVING = ("metrics_of", "serve", "serving_url")


def __getattr__(name: str) -> Any:
    """``serve``, ``serving_url`` and ``metrics_of``, loaded on first use: they bring
    ``prometheus_client`` and ``http.server``, which a command that only reads a state file
    (``sstore status``, ``sstore --help``) has no use for."""
    if name in _SERVING:
        from sstore.observe import serving
        return getattr(serving, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
