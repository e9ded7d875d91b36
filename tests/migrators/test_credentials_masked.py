"""A password in a PostgreSQL URL shows nowhere: not in logs, ``sstore status``, ``/status``,
``/metrics``, exception messages or reprs (issue 36, ``sstore.base.redact``).

The role has a real password on the test server. The server trusts local connections, so it
would accept any password: the failing paths are therefore exercised too, against a port where
nothing listens, with the password in the URL. Everything the user or a machine could read is
collected, then searched for the password.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import traceback
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from migrators import reader
from migrators.access import Replica
from migrators.engine_to_postgres import StreamToPostgres
from migrators.postgres import connect
from migrators.private_auth import read_passwords
from migrators.urls import parse, shown
from migrators.warehouse_url import resolve_warehouse
from sstore import Engine, observe
from sstore.base.redact import mask_secrets
from sstore.base.sql import ident
from sstore.cli import main

SECRET = "Pw-s3cr3t-not-for-logs"
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str) -> str:
    with OPENER.open(url, timeout=10) as response:
        return response.read().decode()


def failure(fn: Any) -> str:
    """The whole traceback ``fn()`` raises (message, chained causes), as a user would see it."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - any failure is text to search
        return "".join(traceback.format_exception(exc))
    raise AssertionError("expected a failure")


@pytest.fixture
def secret_url(postgresql: psycopg.Connection) -> Iterator[str]:
    """A URL with a password for a role made for this test in the test's database."""
    role = f"masked_{os.getpid()}"
    info = postgresql.info
    with psycopg.connect(host=info.host, port=info.port, user=info.user,
                         password=info.password, dbname=info.dbname, autocommit=True) as con:
        con.execute(f'DROP ROLE IF EXISTS "{role}"')
        con.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{SECRET}'")
        con.execute(f'GRANT ALL ON DATABASE "{info.dbname}" TO "{role}"')
        con.execute(f'GRANT ALL ON SCHEMA public TO "{role}"')
        # reads run as the reader role (migrators.reader), which only a superuser may create
        login = info.user + (f":{info.password}" if info.password else "")
        reader.ensure(f"postgresql://{login}@{info.host}:{info.port}/{info.dbname}")
        con.execute(f'GRANT {ident(reader.role())} TO "{role}"')
        try:
            yield f"postgresql://{role}:{SECRET}@{info.host}:{info.port}/{info.dbname}"
        finally:
            con.execute(f'DROP OWNED BY "{role}"')
            con.execute(f'DROP ROLE "{role}"')


def test_a_password_shows_nowhere(secret_url: str, tmp_path: Path,
                                  caplog: pytest.LogCaptureFixture) -> None:
    dead = secret_url.replace(f":{parse(secret_url).port}/", ":1/")  # nothing listens there
    seen: list[str] = []
    state = str(tmp_path / "s.duckdb")
    caplog.set_level(logging.DEBUG)
    with Engine(state) as engine:
        engine.stream("events", {"id": "INTEGER"})

        @engine.procedure(input="events")
        def forward(tx: Any, batch: Any) -> None:  # user code that names its URL when failing
            raise RuntimeError(f"could not write to {secret_url}")

        engine.ingest("events", [{"id": 1}, {"id": 2}])
        engine.run_until_idle()  # forward halts, its message kept in the state file
        sink = StreamToPostgres(engine, "events", secret_url, "events_out")
        assert sink.run_once().rows == 2  # the password works
        broken = StreamToPostgres(engine, "events", dead, "events_lost")
        seen += [repr(sink), repr(broken), repr(parse(secret_url)),
                 repr(Replica(engine, secret_url, "events_out", "copy")),
                 repr(resolve_warehouse(secret_url))]
        broken.retry = type(broken.retry)(attempts=2, first_delay=0.01, max_delay=0.01)
        seen.append(failure(broken.run_once))
        seen.append(failure(lambda: connect(dead)))
        seen.append(failure(lambda: connect(f"host=127.0.0.1 port=1 user=x password={SECRET}")))
        seen.append(failure(lambda: parse(secret_url.replace("postgresql", "mysql"))))
        seen.append(failure(lambda: connect(secret_url + "?sslmode=nonsense")))
        url = observe.serve(engine, 0)
        status = get(url + "status")
        assert "could not write to" in status and "events_lost" in status
        seen += [status, get(url + "metrics"), json.dumps(engine.status().to_dict())]
    wide = CliRunner(env={"COLUMNS": "400"})  # no cell cut short: all of the text is shown
    result = wide.invoke(main, ["status", state])
    assert "could not write to postgresql://masked_" in result.output, result.output
    seen.append(result.output)
    as_json = wide.invoke(main, ["status", state, "--json"])
    seen.append(as_json.output)
    catalog = str(tmp_path / "catalog.json")
    added = CliRunner().invoke(main, ["polystore", "add-postgres", "pg", secret_url,
                                      "--catalog", catalog])
    assert added.exit_code == 0, added.output
    for args in ([], ["--json"]):
        listed = wide.invoke(main, ["polystore", "list", "--catalog", catalog, *args])
        assert listed.exit_code == 0 and "pg" in listed.output, listed.output
        seen.append(listed.output)
    seen += [r.getMessage() + (r.exc_text or "") for r in caplog.records]
    seen.append(caplog.text)
    leaks = [text for text in seen if SECRET in text]
    assert not leaks, leaks[0]
    assert any("***" in text or "masked_" in text for text in seen)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_command_lines_logs_mask_passwords(fmt: str, capsys: pytest.CaptureFixture[str]
                                               ) -> None:
    """Whatever reaches a log record (a message, an extra field, a traceback of user code)
    leaves the command masked."""
    from sstore.cli.logs import configure

    url = f"postgresql://app:{SECRET}@db:5432/x"
    configure("debug", fmt)
    try:
        log = logging.getLogger("sstore.test_masking")
        try:
            raise RuntimeError(f"cannot reach {url}")
        except RuntimeError:
            log.exception("failed at %s", url, extra={"target": url})
        log.debug("keyword form: host=db password=%s", SECRET)
    finally:
        configure("warning", "text")
    err = capsys.readouterr().err
    assert "cannot reach postgresql://app:***@db:5432/x" in err and "password=***" in err
    assert SECRET not in err


@pytest.mark.parametrize(("text", "masked"), [
    ("postgresql://app:s3cret@db:5432/x", "postgresql://app:***@db:5432/x"),
    ("at 'postgres://app:p@ss:w@127.0.0.1/x?sslmode=require'",
     "at 'postgres://app:***@127.0.0.1/x?sslmode=require'"),
    ("host=a password=xyz dbname=b", "host=a password=*** dbname=b"),
    ("host=a PASSWORD = 'a b\\' c' dbname=b", "host=a PASSWORD = *** dbname=b"),
    ("postgresql://u@h/x?password=zz&x=1", "postgresql://u@h/x?password=***&x=1"),
    ("postgresql://:pw@h/db", "postgresql://:***@h/db"),
    # left as they are: no password in them
    ("postgresql://app@h:5432/x", "postgresql://app@h:5432/x"),
    ("http://127.0.0.1:8080/status", "http://127.0.0.1:8080/status"),
    ("jdbc:postgresql://h:5/db user@example.org", "jdbc:postgresql://h:5/db user@example.org"),
])
def test_mask_secrets(text: str, masked: str) -> None:
    assert mask_secrets(text) == masked


def test_shown_urls_keep_where_and_drop_the_password() -> None:
    assert shown("postgresql://app:s3cret@db:5433/x") == "postgresql://app@db:5433/x"
    assert shown("host=db password=s3cret") == "host=db password=***"
    assert "s3cret" not in repr(parse("postgresql://app:s3cret@db/x"))


def test_the_private_servers_passwords_show_nowhere(tmp_path: Path) -> None:
    """The private server's generated passwords (``migrators.private_auth``) appear in no
    output of the commands that start, show, use, rotate and stop it, in no error, and not in
    the server's own log: its URLs name the password file instead."""
    from tests.cli.test_cli_postgres import environment, sstore
    home = Path(tempfile.mkdtemp(prefix="sstore-test-home-"))
    env = environment(home)
    seen: list[str] = []
    passwords: list[str] = []
    try:
        def run(*args: str) -> subprocess.CompletedProcess[str]:
            done = sstore(env, *args)
            seen.extend([done.stdout, done.stderr])
            return done

        assert run("postgres", "start", "--json").returncode == 0
        passwords += read_passwords(home / "postgres.pgpass").values()
        url = run("postgres", "url").stdout.strip()
        status = run("postgres", "status")
        assert "protection: scram-sha-256" in status.stdout and "mode 0600" in status.stdout
        assert json.loads(run("postgres", "status", "--json").stdout)["protection"][
            "password_file_mode"] == "0600"
        with psycopg.connect(url) as con:
            con.execute("CREATE TABLE shown AS SELECT 1 AS one")
        catalog = str(tmp_path / "catalog.json")
        assert run("polystore", "add-postgres", "pg", "--catalog", catalog).returncode == 0
        asked = run("query", "--catalog", catalog, "SELECT one FROM shown", "--format", "json")
        assert json.loads(asked.stdout) == [{"one": 1}], asked.stderr
        wrong_db = url.replace("/postgres?", "/no_such_db?")
        seen.append(failure(lambda: connect(wrong_db)))
        seen.append(failure(lambda: psycopg.connect(wrong_db)))
        assert run("postgres", "rotate-password").returncode == 0
        passwords += read_passwords(home / "postgres.pgpass").values()
        assert run("postgres", "status").returncode == 0
        assert run("postgres", "stop").returncode == 0
        seen.append((home / "postgres" / "server.log").read_text())
    finally:
        sstore(env, "postgres", "stop")
        shutil.rmtree(home, ignore_errors=True)
    assert len(set(passwords)) == 4 and all(len(p) > 30 for p in passwords)
    leaks = [text for text in seen for p in passwords if p in text]
    assert not leaks, leaks[0]
