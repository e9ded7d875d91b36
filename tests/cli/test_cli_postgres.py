"""The warehouse rule end to end (``migrators.warehouse_url``), in real processes.

With nothing at the default address, every command that needs PostgreSQL starts (or finds) a
private server, says so in one line, and the server stops cleanly on ``sstore postgres stop``;
a URL the user gives is never replaced; a server at the default address is used quietly; the
test session's own fixtures (tests/conftest.py) follow the same rule and stop their server.

The machine's PostgreSQL is never touched: "no server at the default address" is made by
pointing ``SSTORE_DEFAULT_POSTGRES_URL`` at a closed port. Private servers live under an
``SSTORE_HOME`` outside pytest's ``tmp_path`` (as root the server runs as another user, which
must traverse the directories above its data; see tests/migrators/test_embedded_postgres.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from migrators.embedded_postgres import PrivatePostgres, free_port
from migrators.urls import parse
from sstore import Engine
from tests.migrators.test_embedded_postgres import alive, postgres_processes
from tests.workloads.tpcdi.test_tpcdi_audit import build_warehouse, write_audit_files

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def home() -> Iterator[Path]:
    """An ``SSTORE_HOME`` of its own; a server a failed test left running is stopped."""
    path = Path(tempfile.mkdtemp(prefix="sstore-test-home-"))
    yield path
    server = PrivatePostgres(path / "postgres")
    if server.is_running:
        server.stop("immediate")
    shutil.rmtree(path, ignore_errors=True)


def environment(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without a warehouse URL, with a default address where
    nothing listens, and this worktree's code first on the path."""
    env = {k: v for k, v in os.environ.items() if k != "SSTORE_POSTGRES_URL"}
    env.update(SSTORE_HOME=str(home), COLUMNS="200",
               SSTORE_DEFAULT_POSTGRES_URL=f"postgresql://postgres@127.0.0.1:{free_port()}/postgres",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra)
    return env


def sstore(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sstore.cli", *args], capture_output=True,
                          text=True, env=env, timeout=300, check=False)


def state_with_rows(path: Path, batches: int = 3, rows: int = 4) -> str:
    with Engine(str(path)) as eng:
        eng.stream("out", {"id": "BIGINT"})
        for b in range(batches):
            eng.ingest("out", [(b * rows + i,) for i in range(rows)])
    return str(path)


def announcements(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "using a private one" in line]


def test_without_a_server_every_command_uses_one_private_server(home: Path,
                                                                tmp_path: Path) -> None:
    env = environment(home)
    default = env["SSTORE_DEFAULT_POSTGRES_URL"]
    state = state_with_rows(tmp_path / "s.duckdb")

    migrated = sstore(env, "migrate", state, "--stream", "out", "--table", "public.moved",
                      "--json")
    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout)["rows"] == 12
    said = announcements(migrated.stderr)
    assert len(said) == 1, migrated.stderr
    found = re.fullmatch(r"no PostgreSQL at (\S+); using a private one at (\S+) \(data in (.+)\)",
                         said[0])
    assert found is not None and found.group(1) == default
    assert found.group(3) == str(home / "postgres")
    url = found.group(2)

    status = json.loads(sstore(env, "postgres", "status", "--json").stdout)
    assert status["running"] and status["url"] == url
    assert status["data_dir"] == str((home / "postgres").resolve())
    postmaster = status["pid"]
    with psycopg.connect(url) as con:  # the rows are in the private server
        assert con.execute("SELECT count(*), sum(id) FROM public.moved").fetchone() == (12, 66)

    again = sstore(env, "migrate", state, "--stream", "out", "--table", "public.moved")
    assert again.returncode == 0 and "Moved 0 rows" in again.stdout  # the same server
    assert len(announcements(again.stderr)) == 1
    consumers = json.loads(sstore(env, "consumers", "list", state, "--json").stdout)
    assert [(c["consumer"], c["acknowledged"]) for c in consumers] == \
        [("migrator:public.moved", 3)]

    build_warehouse(url)  # the audit, found through the same rule
    data = write_audit_files(tmp_path / "data")
    audit = sstore(env, "tpcdi", "audit", "--input", str(data), "--json")
    assert audit.returncode == 0, audit.stderr
    report = json.loads(audit.stdout)
    assert report["ok"] and len(report["checks"]) == 24 and report["schema"] == "tpcdi"

    catalog = str(tmp_path / "catalog.json")
    added = sstore(env, "polystore", "add-postgres", "pg", "--catalog", catalog)
    assert added.returncode == 0, added.stderr
    asked = sstore(env, "query", "--catalog", catalog, "SELECT count(*) AS n FROM moved",
                   "--format", "json")
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout) == [{"n": 12}]

    stopped = sstore(env, "postgres", "stop")
    assert stopped.returncode == 0 and "stopped the private PostgreSQL" in stopped.stdout
    assert not alive(postmaster)
    assert postgres_processes(home / "postgres") == []
    assert not json.loads(sstore(env, "postgres", "status", "--json").stdout)["running"]
    assert "no private PostgreSQL runs" in sstore(env, "postgres", "stop").stdout


@pytest.mark.parametrize("how", ["environment", "option"])
def test_a_given_url_is_never_replaced(home: Path, tmp_path: Path, how: str) -> None:
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    env = environment(home, SSTORE_POSTGRES_URL=nowhere) if how == "environment" \
        else environment(home)
    option = [] if how == "environment" else ["--postgres", nowhere]
    state = state_with_rows(tmp_path / "s.duckdb", batches=1)
    # two tries (one retry) at the given URL are enough to see it is used and not replaced;
    # the default 8 would wait 16 s for nothing
    done = sstore(env, "migrate", state, "--stream", "out", "--table", "public.t",
                  "--attempts", "2", *option)
    assert done.returncode == 1
    assert f"127.0.0.1:{parse(nowhere).port}" in done.stderr and "Traceback" not in done.stderr
    assert "gave up after 2 attempts" in done.stderr
    assert announcements(done.stderr) == []
    assert not (home / "postgres").exists()  # no private server was even created
    if how == "environment":  # and scripts get it back as it is, not probed
        assert sstore(env, "postgres", "url").stdout.strip() == nowhere


def test_a_server_at_the_default_address_is_used_quietly(home: Path, pg_url: str) -> None:
    server = parse(pg_url)
    default = f"postgresql://{server.user}@{server.host}:{server.port}/postgres"
    env = environment(home, SSTORE_DEFAULT_POSTGRES_URL=default)
    done = sstore(env, "postgres", "url")
    assert done.returncode == 0 and done.stdout.strip() == default
    assert done.stderr == ""
    assert not (home / "postgres").exists()


def test_commands_started_together_share_one_server(home: Path) -> None:
    env = environment(home)
    procs = [subprocess.Popen([sys.executable, "-m", "sstore.cli", "postgres", "url"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert len({out.strip() for out, _ in outs}) == 1
    assert sstore(env, "postgres", "stop").returncode == 0
    assert postgres_processes(home / "postgres") == []


@pytest.mark.parametrize("workers", [0, 2])
def test_the_test_session_uses_the_rule_and_stops_its_server(home: Path, workers: int) -> None:
    """A pytest session with this conftest on a machine without PostgreSQL: ``pg_url`` is a
    database on the private server, whose URL the session exports; at its end the server it
    started is stopped. With two pytest-xdist workers (as ``scripts/test.sh`` runs) both use
    the one server the controller started, and the worker that finishes first does not stop
    it under the other (its test connects again after the first one has ended)."""
    inner = Path(tempfile.mkdtemp(prefix="sstore-test-inner-"))
    try:
        (inner / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
        (inner / "test_inner.py").write_text(
            "import json, os, time, psycopg, pytest\n"
            "@pytest.mark.parametrize('pause', [0.0, 4.0])\n"
            "def test_pg_url(pg_url, pause):\n"
            "    with psycopg.connect(pg_url) as con:\n"
            "        con.execute('CREATE TABLE t AS SELECT 1 AS one')\n"
            "    time.sleep(pause)\n"
            "    with psycopg.connect(pg_url) as con:\n"
            "        assert con.execute('SELECT one FROM t').fetchone() == (1,)\n"
            "    with open(os.environ['REPORT'] + str(pause), 'w') as f:\n"
            "        json.dump({'pg_url': pg_url, 'env': os.environ['SSTORE_POSTGRES_URL']}, f)\n")
        report = inner / "report.json"
        env = environment(home, REPORT=str(report))
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-n", str(workers), "--dist", "load",
                               str(inner / "test_inner.py")], cwd=inner, env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "2 passed" in done.stdout, done.stdout
        seen = [json.loads((inner / f"report.json{pause}").read_text()) for pause in (0.0, 4.0)]
    finally:
        shutil.rmtree(inner, ignore_errors=True)
    private = PrivatePostgres(home / "postgres")
    for one in seen:
        assert parse(one["pg_url"]).port == private.port == parse(one["env"]).port
        assert parse(one["pg_url"]).dbname.startswith("sstore_test_")
    if workers:  # each worker its own database on the one server
        assert len({one["pg_url"] for one in seen}) == 2
    assert not private.is_running and postgres_processes(home / "postgres") == []
