"""Who may read the status server, decided before any engine data is touched.

Why each rule (issue 36):

- **Host check (DNS rebinding).** A web page the user visits can point its own name at
  127.0.0.1 and then read ``http://its-name:PORT/status`` from the user's browser: the browser
  sends ``Host: its-name``. So a request is answered only when its ``Host`` names this server:
  the address it binds, the loopback names when it binds loopback, this machine's names and the
  address the connection arrived on when it binds every address, and the names given
  explicitly (``SSTORE_SERVE_NAMES``, or ``serve(..., names=...)``). Anything else gets 421 and
  no data.
- **A token off loopback.** Bound to anything but loopback, the server is reachable by other
  machines, so it refuses to start without a bearer token from ``SSTORE_SERVE_TOKEN`` (at least
  ``MIN_TOKEN_CHARS`` characters) and then answers its data routes only to
  ``Authorization: Bearer <token>`` (else 401). A token set in the environment is required on
  loopback too: setting it is asking for it.
- **Read-only, no CORS.** Only GET and HEAD are served (405 for every other method, OPTIONS
  included) and no ``Access-Control-*`` header is ever sent, so no other origin is invited to
  read or to write.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sstore.base.errors import TerminalError
from sstore.observe.live import TOKEN_ENV

__all__ = ["TOKEN_ENV", "Access", "ServeError", "host_name", "is_loopback", "policy"]
NAMES_ENV = "SSTORE_SERVE_NAMES"
MIN_TOKEN_CHARS = 16
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


class ServeError(TerminalError):
    """The engine could not serve on the address asked for (or not safely)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address) is this machine only: ``localhost`` or a loopback IP."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(header: str | None) -> str | None:
    """The name of a ``Host`` header without its port, lower case, IPv6 without brackets
    (``[::1]:8080`` -> ``::1``); None for a missing or malformed one."""
    if not header:
        return None
    text = header.strip().lower()
    if text.startswith("["):
        name, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
    else:
        name, colon, port = text.rpartition(":")
        if not colon:
            name = text
        elif not port.isdigit() or ":" in name:
            return None
    name = name.rstrip(".")
    return name or None


@dataclass(frozen=True)
class Access:
    """The rules of one server: the ``Host`` names it answers and its token (None: none)."""

    names: frozenset[str]
    token: str | None
    any_address: bool = False

    def host_allowed(self, header: str | None, local_address: str) -> bool:
        """Whether ``Host: header`` names this server; ``local_address`` is the address the
        connection arrived on (named directly, it is one this server serves)."""
        name = host_name(header)
        if name is None:
            return False
        return name in self.names or (self.any_address and name == local_address.lower())

    def authorized(self, header: str | None) -> bool:
        """Whether ``Authorization: header`` carries the token (always, without a token)."""
        if self.token is None:
            return True
        scheme, _, given = (header or "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), self.token.encode())


def policy(host: str, names: Iterable[str] = (),
           environ: Mapping[str, str] | None = None) -> Access:
    """The rules for a server bound to ``host``; ``ServeError`` when it may not start (off
    loopback without a token, or with a token too short to resist guessing)."""
    env = os.environ if environ is None else environ
    token = env.get(TOKEN_ENV, "").strip() or None
    if token is None and not is_loopback(host):
        raise ServeError(f"serving status on {host or 'every address'} (not loopback) needs a "
                         f"token: set {TOKEN_ENV} to a secret of at least {MIN_TOKEN_CHARS} "
                         f"characters; clients then send 'Authorization: Bearer <token>'")
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ServeError(f"{TOKEN_ENV} is too short: use at least {MIN_TOKEN_CHARS} characters")
    extra = [n for n in env.get(NAMES_ENV, "").split(",")] + list(names)
    allowed = {n.strip().strip("[]").lower().rstrip(".") for n in extra if n.strip()}
    bound = host.strip("[]").lower()
    any_address = bound in WILDCARDS
    if any_address:
        allowed |= LOOPBACK_NAMES | _machine_names()
    elif is_loopback(bound):
        allowed |= LOOPBACK_NAMES | {bound}
    else:
        allowed.add(bound)
    return Access(frozenset(allowed), token, any_address)


def _machine_names() -> set[str]:
    """This machine's own names (what a client on the network may call it)."""
    names = {socket.gethostname().lower()}
    try:
        names.add(socket.getfqdn().lower())
    except OSError:
        pass
    return {n for n in names if n}
