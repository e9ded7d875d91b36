"""Finding a serving engine from its state file: the discovery file and the client.

DuckDB lets one process write a state file and nobody else read it meanwhile, so ``sstore
status STATE`` cannot open a file a running pipeline holds. A serving engine therefore writes
``STATE.live.json`` beside the state file (pid, host, port, URL), and removes it when it
closes. The protocol, from the reader's side:

1. Opening STATE read-only fails with DuckDB's lock error (``sstore.storage.statefile.file_status``
   raises ``StateFileLockedError``; ``file_status`` here catches it).
2. ``find(STATE)`` reads ``STATE.live.json``. A file whose pid no longer runs (a process
   killed before it could remove it), or whose pid is not the one DuckDB names as the lock
   holder, is stale and ignored.
3. ``fetch_status`` GETs ``/status`` from that URL (loopback, no proxy), with the bearer
   token of ``SSTORE_SERVE_TOKEN`` when it is set (an engine serving off loopback requires
   it, ``sstore.observe.access``), and returns the document; ``EngineStatus.from_dict``
   reads it.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from sstore.base.errors import TerminalError
from sstore.base.files import write_atomically
from sstore.storage.statefile import StateFileLockedError
from sstore.storage.statefile import file_status as status_from_file
from sstore.storage.status import EngineStatus

SUFFIX = ".live.json"
#: The bearer token's variable (``sstore.observe.access.TOKEN_ENV``; named here too so that
#: ``sstore status`` does not import the server side).
TOKEN_ENV = "SSTORE_SERVE_TOKEN"
FETCH_TIMEOUT = 10.0


class LiveStatusError(TerminalError):
    """A serving engine was found but did not answer."""


@dataclass(frozen=True)
class Discovery:
    pid: int
    host: str
    port: int
    url: str
    engine_id: str
    state: str


def discovery_path(state: str) -> str:
    return os.path.abspath(state) + SUFFIX


def connect_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to ``host``."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def write(state: str, host: str, port: int, engine_id: str) -> Discovery:
    """Write the discovery file (whole or not at all: a temporary file renamed over it)."""
    reach = connect_host(host)
    url = f"http://[{reach}]:{port}/" if ":" in reach else f"http://{reach}:{port}/"
    found = Discovery(os.getpid(), host, port, url, engine_id, os.path.abspath(state))
    path = discovery_path(state)
    write_atomically(path, json.dumps(vars(found)))
    return found


def remove(state: str) -> None:
    """Remove the discovery file if this process wrote it (another may serve the file now)."""
    path = discovery_path(state)
    found = _read(path)
    if found is not None and found.pid == os.getpid():
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def find(state: str, lock_pid: int | None = None) -> Discovery | None:
    """The live engine serving ``state``, or None (no file, a stale one, or another owner)."""
    found = _read(discovery_path(state))
    if found is None or not _running(found.pid):
        return None
    if lock_pid is not None and found.pid != lock_pid:
        return None
    return found


def fetch_status(found: Discovery, timeout: float = FETCH_TIMEOUT) -> dict[str, Any]:
    """GET ``/status`` from a serving engine (never through a proxy: it is on this host)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(found.url + "status")
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with opener.open(request, timeout=timeout) as response:
            status: dict[str, Any] = json.loads(response.read().decode("utf-8"))
            return status
    except urllib.error.HTTPError as exc:
        hint = f" (set {TOKEN_ENV} to the token it serves with)" if exc.code == 401 else ""
        raise LiveStatusError(f"the engine of {found.state} (PID {found.pid}) serves at "
                              f"{found.url} but refused: HTTP {exc.code}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise LiveStatusError(f"the engine of {found.state} (PID {found.pid}) serves at "
                              f"{found.url} but did not answer: {exc}") from None


def _read(path: str) -> Discovery | None:
    try:
        with open(path, encoding="utf-8") as src:
            data = json.load(src)
        return Discovery(int(data["pid"]), str(data["host"]), int(data["port"]),
                         str(data["url"]), str(data["engine_id"]), str(data["state"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none, half-written by hand, or from another tool: not ours to trust


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, killed but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc here: kill(pid, 0) has answered


def file_status(state: str) -> EngineStatus:
    """A state file's status: read from the file (``sstore.storage.statefile.file_status``), or,
    when a serving engine holds it, asked of that engine over HTTP (the discovery file names the
    process and its URL). A holder that does not serve: the file's ``StateFileLockedError``,
    which says how to make it serve."""
    try:
        return status_from_file(state)
    except StateFileLockedError as error:
        found = find(state, lock_pid=error.holder or None)
        if found is None:
            raise
    return EngineStatus.from_dict(fetch_status(found))
