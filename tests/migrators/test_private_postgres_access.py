"""Only the account that started the private PostgreSQL can log in (issue 36,
``migrators.private_auth``): SCRAM passwords in a 0600 password file, no trust, no Unix socket,
a server that keeps no root group; an older data directory that trusted everyone is closed at
its next start; reads on it log in as the reader, which cannot switch back to the superuser.

As root (our CI) another OS account, ``nobody``, tries to log in with ``psql`` over TCP and the
socket path, as each role, with and without the password file's path: each is refused. Not
as root, the same refusals are shown for a client without the password."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from migrators import private_auth
from migrators.embedded_postgres import PrivatePostgres
from migrators.postgres_to_engine import read_postgres
from migrators.private_auth import READER, SUPERUSER
from tests.migrators.test_embedded_postgres import postgres_processes

ROOT = os.geteuid() == 0


@pytest.fixture
def pg_dir() -> Iterator[Path]:
    """Outside pytest's ``tmp_path`` (see tests/migrators/test_embedded_postgres.py)."""
    path = Path(tempfile.mkdtemp(prefix="sstore-test-pg-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(pg_dir: Path) -> Iterator[PrivatePostgres]:
    with PrivatePostgres(pg_dir / "pg") as pg:
        yield pg


def as_other_account(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``psql`` as ``nobody`` (as root), else as this account without any password."""
    env = {"PATH": os.environ["PATH"], "PGCONNECT_TIMEOUT": "5", "HOME": "/nonexistent"}
    prefix = ["runuser", "-u", "nobody", "--"] if ROOT else []
    return subprocess.run([*prefix, "psql", "-X", "-w", *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def test_only_the_password_file_lets_one_in(server: PrivatePostgres) -> None:
    stat = server.passfile.stat()
    assert stat.st_mode & 0o777 == 0o600 and stat.st_uid == os.geteuid()
    assert private_auth.hba_methods(server.data_dir) == {"scram-sha-256"}
    passwords = private_auth.read_passwords(server.passfile)
    assert set(passwords) == {SUPERUSER, READER} and passwords[SUPERUSER] != passwords[READER]
    assert all(p not in server.url for p in passwords.values())
    with psycopg.connect(server.url) as con:
        assert con.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
                           ).fetchone() == (True,)
    with psycopg.connect(server.reader_url) as con:
        assert con.execute("SELECT current_user, rolsuper, pg_has_role('pg_read_all_data', "
                           "'MEMBER') FROM pg_roles WHERE rolname = current_user"
                           ).fetchone() == (READER, False, True)
    for user in (SUPERUSER, READER):
        with pytest.raises(psycopg.OperationalError, match="no password supplied"):
            psycopg.connect(host=server.host, port=server.port, user=user, dbname="postgres",
                            passfile="/nonexistent")
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(host=server.host, port=server.port, user=user, dbname="postgres",
                            password="guess", passfile="/nonexistent")
    # no Unix socket anywhere a client looks, nor in the data directory
    assert not list(server.data_dir.glob(".s.PGSQL.*"))
    for folder in ("/tmp", "/var/run/postgresql", "/run/postgresql"):
        assert not Path(folder, f".s.PGSQL.{server.port}").exists()
    state = server.protection()
    assert state["authentication"] == "scram-sha-256" and not state["open"]
    assert state["password_file_mode"] == "0600" and state["unix_socket"] is None


def test_another_account_cannot_log_in(server: PrivatePostgres) -> None:
    tries = []
    for user in (SUPERUSER, READER):
        base = f"host={server.host} port={server.port} user={user} dbname=postgres"
        tries += [[base], [f"{base} passfile={server.passfile}"],
                  [f"host=/tmp port={server.port} user={user} dbname=postgres"]]
    for args in tries:
        done = as_other_account(args + ["-c", "SELECT 1"])
        assert done.returncode != 0, (args, done.stdout)
        assert ("password" in done.stderr or "No such file" in done.stderr), done.stderr
    if ROOT:  # the server runs as its own user, with its own group and no root group
        for proc in postgres_processes(server.data_dir):
            assert proc.uids().real != 0 and proc.gids().real != 0
            groups = Path(f"/proc/{proc.pid}/status").read_text().split("Groups:")[1]
            assert groups.split("\n")[0].split() == [], groups
            assert proc.username() == "embedded_postgres"
        assert psutil.Process(os.getpid()).uids().real == 0


def test_an_old_trusting_data_directory_is_closed_at_its_next_start(pg_dir: Path) -> None:
    pg = PrivatePostgres(pg_dir / "pg").start()
    try:
        with psycopg.connect(pg.url) as con:
            con.execute("CREATE TABLE kept AS SELECT 42 AS answer")
        pg.stop()
        # what older versions left: trust on TCP, no password file
        (pg.data_dir / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 trust\n")
        pg.passfile.unlink()
        pg._pg_ctl(["start", "-w", "-l", str(pg.log_path)])  # started as an old version would
        assert pg.protection()["open"]
        opened = as_other_account([f"host={pg.host} port={pg.port} user=postgres "
                                   "dbname=postgres", "-Atc", "SELECT 'in'"])
        assert opened.stdout.strip() == "in"  # the hole, for real

        pg.start()  # adopts the running server and closes it

        assert not pg.protection()["open"] and pg.passfile.stat().st_mode & 0o777 == 0o600
        refused = as_other_account([f"host={pg.host} port={pg.port} user=postgres "
                                    "dbname=postgres", "-Atc", "SELECT 'in'"])
        assert refused.returncode != 0 and "password" in refused.stderr, refused.stderr
        with psycopg.connect(pg.url) as con:
            assert con.execute("SELECT answer FROM kept").fetchone() == (42,)
        with psycopg.connect(pg.reader_url) as con:
            assert con.execute("SELECT current_user").fetchone() == (READER,)
    finally:
        pg.stop()


def test_rotate_password(server: PrivatePostgres) -> None:
    old = private_auth.read_passwords(server.passfile)
    server.rotate_passwords()
    new = private_auth.read_passwords(server.passfile)
    assert set(new) == set(old) and all(new[r] != old[r] for r in old)
    assert server.passfile.stat().st_mode & 0o777 == 0o600
    for role in old:
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(host=server.host, port=server.port, user=role, dbname="postgres",
                            password=old[role], passfile="/nonexistent")
    for url in (server.url, server.reader_url):
        with psycopg.connect(url) as con:
            assert con.execute("SELECT 1").fetchone() == (1,)


def test_reads_log_in_as_the_reader_which_cannot_switch_back(server: PrivatePostgres) -> None:
    proof = Path(tempfile.gettempdir()) / f"sstore-escalation-{os.getpid()}"
    proof.unlink(missing_ok=True)
    with psycopg.connect(server.url, autocommit=True) as con:
        con.execute("CREATE FUNCTION escalate(path text) RETURNS int LANGUAGE plpgsql AS $$ "
                    "BEGIN PERFORM set_config('role', 'postgres', true); "
                    "EXECUTE format('COPY (SELECT 1) TO %L', path); RETURN 1; END $$")
    who = read_postgres(server.url, "SELECT session_user::text AS s, current_user::text AS c")
    assert who.to_pylist() == [{"s": READER, "c": READER}]
    with pytest.raises(Exception, match="permission denied to set role"):
        read_postgres(server.url, f"SELECT escalate('{proof}')")
    assert not proof.exists()


@pytest.mark.parametrize("server_took_them", [True, False])
def test_a_rotation_cut_short_is_settled_at_the_next_start(server: PrivatePostgres,
                                                           server_took_them: bool) -> None:
    """A crash after the next password file was written (and, or not, after the server took
    its passwords) locks nobody out: the next start keeps the file the server takes."""
    from psycopg import sql
    old = private_auth.read_passwords(server.passfile)
    fresh = {role: private_auth.new_password() for role in old}
    private_auth.write_passwords(private_auth.pending_path(server.passfile), fresh)
    if server_took_them:
        with psycopg.connect(server.url) as con:
            for role, password in fresh.items():
                con.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(private_auth.scram_verifier(password))))
    server.start()  # adopts the running server, settles the rotation
    assert not private_auth.pending_path(server.passfile).exists()
    assert private_auth.read_passwords(server.passfile) == (fresh if server_took_them else old)
    assert server.passfile.stat().st_mode & 0o777 == 0o600
    for url in (server.url, server.reader_url):
        with psycopg.connect(url) as con:
            assert con.execute("SELECT 1").fetchone() == (1,)
