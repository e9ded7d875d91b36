"""The HTTP side: ``/metrics``, ``/status`` and the dashboard, from a thread of the engine's
process (``sstore.observe.serve(engine)``).

Lifecycle:

1. ``Server.start``: bind ``host:port`` (port 0: any free port; default host 127.0.0.1, this
   machine only), serve from a daemon thread (one more thread per request), and for a state
   file write the discovery file beside it (``sstore.observe.live``).
2. Requests read the engine through ``EngineMetrics`` and ``live_status``: counters without
   the engine's lock, the rest with a short lock timeout, so a long transaction delays an
   answer by a fraction of a second, never forever.
3. ``Server.stop`` (from ``Engine.close``, a hook of its view): stop serving, close the socket,
   remove the discovery file. A process killed before step 3 leaves the file; readers see that its
   pid is gone and ignore it.

Every request first passes ``sstore.observe.access``: a ``Host`` this server does not serve
gets 421, a method other than GET or HEAD 405, a data route (``/status``, ``/metrics``)
without the token (when there is one) 401; none of them reads the engine. The dashboard page
itself holds no data (it is a static file) and is served without the token; it sends the token
it finds in its URL fragment (``/#token=...``, never sent to the server) with its requests. No
CORS header is ever sent.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sstore.base.redact import mask_secrets
from sstore.observe import live as discovery
from sstore.observe.access import Access, ServeError
from sstore.observe.livestatus import live_status

if TYPE_CHECKING:
    from sstore.engine_view import EngineView
    from sstore.observe.metrics import EngineMetrics

log = logging.getLogger("sstore.observe")


def dashboard_html() -> bytes:
    """The dashboard page, shipped as package data (read the same way from a wheel)."""
    return resources.files("sstore.observe").joinpath("dashboard.html").read_bytes()


class Server:
    """One engine's HTTP server (see the module docstring)."""

    def __init__(self, engine: EngineView, metrics: EngineMetrics, host: str, port: int,
                 access: Access) -> None:
        self.engine = engine
        self.metrics = metrics
        self.access = access
        try:
            kind = _HTTPServer6 if ":" in host else _HTTPServer
            self.httpd = kind((host, port), _handler(self))
        except OSError as exc:
            raise ServeError(f"cannot serve status and metrics on {host}:{port}: "
                             f"{exc.strerror or exc}") from None
        self.host = host
        self.port = int(self.httpd.server_address[1])
        reach = discovery.connect_host(host)
        self.url = f"http://[{reach}]:{self.port}/" if ":" in reach else \
            f"http://{reach}:{self.port}/"
        self._thread: threading.Thread | None = None
        self._page = dashboard_html()

    def start(self) -> str:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True,
                                        name=f"sstore-serve-{self.port}")
        self._thread.start()
        if self.engine.path != ":memory:":
            discovery.write(self.engine.path, self.host, self.port, self.engine.engine_id)
        log.info("serving status, metrics and the dashboard on %s", self.url)
        return self.url

    def stop(self) -> None:
        if self.engine.path != ":memory:":
            discovery.remove(self.engine.path)
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ------------------------------------------------------------------ answers
    def refusal(self, host: str | None, authorization: str | None, local_address: str,
                path: str) -> tuple[int, str] | None:
        """(HTTP status, reason) when a GET of ``path`` must not be answered, else None."""
        if not self.access.host_allowed(host, local_address):
            return 421, "this server does not answer for that Host\n"
        route = path.split("?", 1)[0]
        if route not in DATALESS and not self.access.authorized(authorization):
            return 401, "a bearer token is required (Authorization: Bearer <token>)\n"
        return None

    def answer(self, path: str) -> tuple[int, str, bytes]:
        """(HTTP status, content type, body) for a GET of ``path``."""
        route = path.split("?", 1)[0]
        # masked on the way out: a sink's error text comes from drivers and user code
        if route == "/metrics":
            text = generate_latest(self.metrics.registry).decode()
            return 200, CONTENT_TYPE_LATEST, mask_secrets(text).encode()
        if route == "/status":
            doc = live_status(self.engine, self.metrics, self.url)
            return 200, "application/json", mask_secrets(json.dumps(doc, default=str)).encode()
        if route in ("/", "/index.html"):
            return 200, "text/html; charset=utf-8", self._page
        return 404, "text/plain; charset=utf-8", b"not found: try /, /status or /metrics\n"


#: Routes that show no engine data (the static dashboard page): served without the token.
DATALESS = frozenset({"/", "/index.html"})
PLAIN = "text/plain; charset=utf-8"


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


def _handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._serve(with_body=True)

        def do_HEAD(self) -> None:
            self._serve(with_body=False)

        def __getattr__(self, name: str) -> object:
            """Every other method (``do_POST``, ``do_OPTIONS``, ``do_FOO``...): 405, so the
            server stays read-only whatever a client tries."""
            if name.startswith("do_"):
                return self._not_allowed
            raise AttributeError(name)

        def _not_allowed(self) -> None:
            self._send(405, PLAIN, b"read-only: GET or HEAD\n", True, {"Allow": "GET, HEAD"})

        def _serve(self, with_body: bool) -> None:
            refused = server.refusal(self.headers.get("Host"), self.headers.get("Authorization"),
                                     self.connection.getsockname()[0], self.path)
            if refused is not None:
                code, reason = refused
                extra = {"WWW-Authenticate": "Bearer"} if code == 401 else {}
                self._send(code, PLAIN, reason.encode(), with_body, extra)
                return
            try:
                code, kind, body = server.answer(self.path)
            except Exception as exc:
                log.exception("serving %s failed", self.path)
                code, kind = 500, PLAIN
                body = f"{type(exc).__name__}: {mask_secrets(str(exc))}\n".encode()
            self._send(code, kind, body, with_body)

        def _send(self, code: int, kind: str, body: bytes, with_body: bool,
                  extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
