"""The status server answers only its own names, only reads, and off loopback only with a
token (issue 36, ``sstore.observe.access``).

Requests go over real sockets with ``http.client``, so that each test sets the ``Host`` header
and the method itself, the way a DNS-rebinding page or a curious neighbour would.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sstore import Engine, observe
from sstore.cli import main
from sstore.observe import live
from sstore.observe.access import TOKEN_ENV, host_name, is_loopback
from sstore.observe.server import ServeError, dashboard_html

TOKEN = "t0ken-for-tests-only-0123456789"
DATA_ROUTES = ("/status", "/metrics")


def request(port: int, path: str = "/status", host: str | None = None, method: str = "GET",
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers in lower case, body) of one request to 127.0.0.1:``port``; ``host``
    None sends ``127.0.0.1:port``, "" sends no Host header at all."""
    con = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        con.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        if host != "":
            con.putheader("Host", f"127.0.0.1:{port}" if host is None else host)
        for name, value in (headers or {}).items():
            con.putheader(name, value)
        con.endheaders()
        response = con.getresponse()
        body = b"" if method == "HEAD" else response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        con.close()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].strip("/"))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Engine, int]]:
    """An engine serving on loopback (no token in the environment)."""
    with Engine(str(tmp_path / "s.duckdb")) as engine:
        engine.stream("events", {"v": "INTEGER"})
        yield engine, port_of(observe.serve(engine, 0))


# -- Host: DNS rebinding ------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example",
                                  "localhost.evil.example:{port}", "[::2]:{port}", "", "a:b:c"])
def test_a_host_it_does_not_serve_gets_421_and_no_data(served: tuple[Engine, int],
                                                       host: str) -> None:
    engine, port = served
    for path in (*DATA_ROUTES, "/"):
        code, headers, body = request(port, path, host.format(port=port))
        assert code == 421, (host, path, code)
        assert not [h for h in headers if h.startswith("access-control-")]
        assert engine.engine_id.encode() not in body and b"events" not in body
        assert b"sstore_" not in body and b"<html" not in body.lower()


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "127.0.0.1", "localhost:{port}",
                                  "LocalHost:{port}", "localhost.:{port}", "[::1]:{port}"])
def test_loopback_names_are_answered(served: tuple[Engine, int], host: str) -> None:
    engine, port = served
    code, _, body = request(port, "/status", host.format(port=port))
    assert code == 200 and json.loads(body)["engine_id"] == engine.engine_id


def test_names_given_explicitly_are_answered(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSTORE_SERVE_NAMES", "status.internal, Other.Example")
    with Engine(str(tmp_path / "n.duckdb")) as engine:
        port = port_of(observe.serve(engine, 0, names=["by-api.local"]))
        for name in ("status.internal", "other.example", "by-api.local"):
            assert request(port, "/metrics", f"{name}:{port}")[0] == 200, name
        assert request(port, "/metrics", f"status.internal.evil:{port}")[0] == 421


# -- read-only, no CORS -------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE",
                                    "PROPFIND"])
def test_every_method_but_get_and_head_is_refused(served: tuple[Engine, int],
                                                  method: str) -> None:
    engine, port = served
    before = engine.status().to_dict()
    for path in (*DATA_ROUTES, "/"):
        code, headers, body = request(port, path, method=method,
                                      headers={"Origin": "http://evil.example",
                                               "Access-Control-Request-Method": "GET",
                                               "Content-Length": "0"})
        assert code == 405, (method, path, code)
        assert headers.get("allow") == "GET, HEAD"
        assert engine.engine_id.encode() not in body
        assert not [h for h in headers if h.startswith("access-control-")]
    assert engine.status().to_dict()["streams"] == before["streams"]


def test_no_cors_header_is_ever_sent(served: tuple[Engine, int]) -> None:
    _, port = served
    for path in (*DATA_ROUTES, "/", "/nowhere"):
        for method in ("GET", "HEAD"):
            code, headers, _ = request(port, path, method=method,
                                       headers={"Origin": "http://evil.example"})
            assert code in (200, 404)
            assert not [h for h in headers if h.startswith("access-control-")], (path, headers)


def test_head_answers_without_a_body(served: tuple[Engine, int]) -> None:
    _, port = served
    code, headers, _ = request(port, "/status", method="HEAD")
    assert code == 200 and int(headers["content-length"]) > 0


# -- a token off loopback -----------------------------------------------------------------------
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "status.example"])
def test_off_loopback_it_refuses_to_start_without_a_token(tmp_path: Path, host: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with Engine(str(tmp_path / "t.duckdb")) as engine:
        with pytest.raises(ServeError, match=f"needs a token: set {TOKEN_ENV}"):
            observe.serve(engine, 0, host)
        assert observe.serving_url(engine) is None
        monkeypatch.setenv(TOKEN_ENV, "short")
        with pytest.raises(ServeError, match="too short"):
            observe.serve(engine, 0, host)


def test_off_loopback_the_data_needs_the_bearer_token(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    state = str(tmp_path / "w.duckdb")
    with Engine(state) as engine:
        engine.stream("events", {"v": "INTEGER"})
        port = port_of(observe.serve(engine, 0, "0.0.0.0"))
        for path in DATA_ROUTES:
            for auth in (None, "Bearer wrong-token-of-enough-length", f"Basic {TOKEN}",
                         f"Bearer {TOKEN}x", "Bearer"):
                code, headers, body = request(port, path, headers={"Authorization": auth}
                                              if auth else None)
                assert code == 401, (path, auth)
                assert headers["www-authenticate"] == "Bearer"
                assert engine.engine_id.encode() not in body and b"events" not in body
            code, _, body = request(port, path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert code == 200 and engine.engine_id.encode() in body
        # the page holds no data: it is the static file, served without the token
        assert request(port, "/")[2] == dashboard_html()
        # every address: the machine's name and the address a client used are its own names
        assert request(port, "/metrics", f"{socket.gethostname()}:{port}",
                       headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert request(port, "/metrics", f"evil.example:{port}",
                       headers={"Authorization": f"Bearer {TOKEN}"})[0] == 421
        # `sstore status` sends the token from the environment, and says what is missing
        found = live.find(state)
        assert found is not None
        assert live.fetch_status(found)["engine_id"] == engine.engine_id
        monkeypatch.delenv(TOKEN_ENV)
        with pytest.raises(live.LiveStatusError, match=f"HTTP 401 .*set {TOKEN_ENV}"):
            live.fetch_status(found)


def test_the_command_line_refuses_and_says_why(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    result = CliRunner().invoke(main, ["demo", "--votes", "100", "--state",
                                       str(tmp_path / "v.duckdb"), "--serve", "0",
                                       "--serve-host", "0.0.0.0"])
    assert result.exit_code != 0
    assert f"needs a token: set {TOKEN_ENV}" in result.output
    help_text = " ".join(CliRunner().invoke(main, ["demo", "--help"]).output.split())
    assert TOKEN_ENV in help_text and "Bearer" in help_text and "SSTORE_SERVE_NAMES" in help_text


# -- the rules themselves -----------------------------------------------------------------------
@pytest.mark.parametrize(("header", "name"), [
    ("localhost:8080", "localhost"), ("LOCALHOST", "localhost"), ("[::1]:80", "::1"),
    ("[::1]", "::1"), ("example.org.", "example.org"), ("10.0.0.1:9", "10.0.0.1"),
    ("", None), (None, None), ("a:b", None), ("::1", None), ("[::1]x", None), ("[::1", None),
])
def test_host_names_are_read_strictly(header: str | None, name: str | None) -> None:
    assert host_name(header) == name


def test_what_counts_as_loopback() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "", "192.0.2.1", "localhost.evil"]))
