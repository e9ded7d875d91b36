"""``--serve PORT`` and ``--serve-host`` for the commands that run a dataflow (``sstore
demo``, ``sstore tpcdi run``, ``sstore tpcdi demo``): one definition, so they read alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from sstore.engine import Engine

F = TypeVar("F", bound=Callable[..., Any])


def serve_options(command: F) -> F:
    """Add ``--serve PORT`` (``serve``) and ``--serve-host HOST`` (``serve_host``)."""
    command = click.option(
        "--serve-host", default="127.0.0.1", show_default=True,
        help="Address --serve binds. Anything but loopback needs a bearer token: set "
             "SSTORE_SERVE_TOKEN (16+ characters) or it refuses to start; clients send "
             "'Authorization: Bearer <token>'. Requests must name this host (Host header); "
             "add other names in SSTORE_SERVE_NAMES (comma-separated).")(command)
    return click.option(
        "--serve", "serve", type=click.IntRange(min=0, max=65535), default=None,
        metavar="PORT",
        help="While it runs, serve live status (/status), Prometheus metrics (/metrics) and a "
             "dashboard (/) on this port (0: any free port); `sstore status STATE` then "
             "answers from the running process.")(command)


def start_serving(engine: Engine, port: int | None, host: str,
                  say: Callable[[str], None]) -> str | None:
    """Serve ``engine`` if ``port`` was given; tell the user where."""
    if port is None:
        return None
    from sstore.observe.serving import serve

    url = serve(engine, port, host)
    say(f"Live status, metrics and dashboard: {url} (/status, /metrics)")
    return url
