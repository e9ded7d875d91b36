"""Read paths into PostgreSQL cannot write, by privilege (issue 36, ``migrators.reader``).

A table of write attempts goes through every read path: ``sstore query`` (the polystore's
PostgreSQL island), the connector's fetch and its planner questions, ``cross_system_query``
and a cast into the engine (``copy_into_engine(query=...)``). Each is refused, and afterwards
nothing has changed in PostgreSQL (table rows, the sequence, large objects, a server file,
another session) or in the engine (no table made). Then the privilege alone: SQL that the
denylist lets through and that writes even in a READ ONLY transaction (a user's function
that writes a server file) is refused by PostgreSQL when the reader runs it, and does write
when the URL's own superuser runs it the same way, so the attack is real.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from migrators import reader
from migrators.access import cross_system_query
from migrators.postgres_to_engine import copy_into_engine, read_postgres
from migrators.urls import parse
from sstore import Engine
from sstore.base.readonly import check_query
from sstore.cli import main
from sstore.polystore.connector_postgres import PostgresConnector

PROOF = Path(tempfile.gettempdir()) / f"sstore-read-privilege-{os.getpid()}"

SETUP = """
CREATE TABLE probe (id int);
INSERT INTO probe VALUES (1);
CREATE TABLE target (id int);
CREATE SEQUENCE counter;
CREATE FUNCTION write_row() RETURNS int LANGUAGE plpgsql VOLATILE AS
  $$ BEGIN INSERT INTO target VALUES (1); RETURN 1; END $$;
CREATE FUNCTION write_file(path text) RETURNS int LANGUAGE plpgsql VOLATILE AS
  $$ BEGIN EXECUTE format('COPY (SELECT 1) TO %L', path); RETURN 1; END $$;
"""


@pytest.fixture
def db(pg_url: str) -> Iterator[tuple[str, psycopg.Connection]]:
    """The test database with its objects, and a second session (a victim to terminate)."""
    PROOF.unlink(missing_ok=True)
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute(SETUP)
    victim = psycopg.connect(pg_url, autocommit=True)
    try:
        yield pg_url, victim
    finally:
        victim.close()
        PROOF.unlink(missing_ok=True)


ATTEMPTS = {
    "nextval": "SELECT nextval('counter') AS v FROM probe",
    "set_config role": "SELECT pg_catalog.set_config('role', 'postgres', false) AS v FROM probe",
    "function that inserts": "SELECT write_row() AS v FROM probe",
    "lo_create": "SELECT lo_create(0) AS v FROM probe",
    "function that writes a server file": f"SELECT write_file('{PROOF}') AS v FROM probe",
    "pg_terminate_backend": "SELECT pg_terminate_backend({victim}) AS v FROM probe",
    "data-modifying CTE": "WITH d AS (DELETE FROM probe RETURNING id) SELECT id AS v FROM d",
}


def snapshot(url: str, victim: psycopg.Connection) -> dict[str, Any]:
    """What a write would change: rows, the sequence, large objects, the file, the session."""
    with psycopg.connect(url) as con:
        rows = con.execute("SELECT (SELECT count(*) FROM probe), (SELECT count(*) FROM "
                           "target), (SELECT count(*) FROM pg_largeobject_metadata)").fetchone()
        sequence = con.execute("SELECT last_value, is_called FROM counter").fetchone()
    alive = victim.execute("SELECT 1").fetchone() == (1,)
    return {"rows": rows, "sequence": sequence, "file": PROOF.exists(), "victim": alive}


def through_query(url: str, tmp_path: Path) -> Callable[[str], bool]:
    catalog = str(tmp_path / "catalog.json")
    added = CliRunner().invoke(main, ["polystore", "add-postgres", "pg", url,
                                      "--catalog", catalog])
    assert added.exit_code == 0, added.output

    def run(sql: str) -> bool:
        done = CliRunner().invoke(main, ["query", "--catalog", catalog, sql, "--format",
                                         "json"])
        return done.exit_code != 0
    return run


def refused(fn: Callable[[], Any]) -> bool:
    try:
        fn()
    except Exception:  # noqa: BLE001 - any refusal; what changed is checked separately
        return True
    return False


@pytest.mark.parametrize("path", ["sstore query", "connector fetch", "cross_system_query",
                                  "cast into the engine"])
def test_every_write_attempt_is_refused_and_changes_nothing(
        db: tuple[str, psycopg.Connection], tmp_path: Path, path: str) -> None:
    url, victim = db
    with Engine(str(tmp_path / "s.duckdb")) as engine:
        connector = PostgresConnector("pg", url)
        ways: dict[str, Callable[[str], bool]] = {
            "connector fetch": lambda sql: refused(lambda: connector.fetch(sql)),
            "cross_system_query": lambda sql: refused(lambda: cross_system_query(url, sql)),
            "cast into the engine": lambda sql: refused(lambda: copy_into_engine(
                url, engine, into="copied", query=sql)),
        }
        attempt = ways.get(path) or through_query(url, tmp_path)
        before = snapshot(url, victim)
        try:
            for name, sql in ATTEMPTS.items():
                assert attempt(sql.format(victim=victim.info.backend_pid)), name
                assert snapshot(url, victim) == before, name
            # and reads still work, as the reader
            assert not attempt("SELECT id AS v FROM probe")
        finally:
            connector.close()
        tables = engine.query("SELECT count(*) AS n FROM duckdb_tables() WHERE table_name = "
                              "'copied'").column("n")[0].as_py()
        assert tables == (1 if path == "cast into the engine" else 0)  # the plain read only
    assert before == {"rows": (1, 0, 0), "sequence": (1, False), "file": False, "victim": True}


def test_the_privilege_not_the_list_refuses(db: tuple[str, psycopg.Connection]) -> None:
    url, victim = db
    writes = f"SELECT write_file('{PROOF}') AS v"
    check_query(writes, "postgres")  # the denylist lets it through
    with pytest.raises(Exception, match="pg_write_server_files"):
        read_postgres(url, writes)  # the reader role's helper: PostgreSQL refuses
    assert not PROOF.exists()
    with pytest.raises(Exception, match="permission denied|read-only"):
        read_postgres(url, "SELECT write_row() AS v")
    # the planner's questions run as the reader too
    connector = PostgresConnector("pg", url)
    try:
        with pytest.raises(psycopg.Error, match="pg_write_server_files"):
            connector.fingerprint(writes)
        assert connector.fingerprint("SELECT id FROM probe") == f"1:{_hash(url)}"
        # a large object (which any role may create): refused in a READ ONLY transaction
        # since PostgreSQL 18, and rolled back with the question before it
        try:
            connector._execute("SELECT lo_create(0)")
        except psycopg.errors.ReadOnlySqlTransaction:
            pass
    finally:
        connector.close()
    assert snapshot(url, victim)["rows"] == (1, 0, 0) and not PROOF.exists()
    # the same SQL as the URL's superuser in a READ ONLY transaction writes: READ ONLY alone
    # is no guarantee, the role is
    with psycopg.connect(url) as con:
        con.read_only = True
        con.execute(writes)
        con.rollback()
    assert PROOF.exists()


def _hash(url: str) -> str:
    with psycopg.connect(url) as con:
        return str(con.execute("SELECT sum(hashtext(q::text)::numeric) FROM "
                               "(SELECT id FROM probe) AS q").fetchone()[0])


def test_a_named_role_that_is_missing_says_what_to_do(db: tuple[str, psycopg.Connection],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ = db
    monkeypatch.setenv(reader.ROLE_ENV, "sstore_no_such_reader")
    with pytest.raises(reader.ReaderRoleError,
                       match="'sstore_no_such_reader' .*does not exist.*CREATE ROLE"):
        read_postgres(url, "SELECT 1 AS one")


def test_spark_reads_run_as_the_reader(db: tuple[str, psycopg.Connection], spark: Any) -> None:
    """The polystore's Spark island reads PostgreSQL over JDBC (``postgres_to_dataframe``):
    as the reader too, its sessions read-only."""
    from migrators.spark import postgres_to_dataframe
    url, victim = db
    who = postgres_to_dataframe(url, query="SELECT current_user::text AS c, "
                                "current_setting('transaction_read_only') AS ro",
                                spark=spark).collect()
    assert [(r["c"], r["ro"]) for r in who] == [(reader.role(), "on")]
    for sql in (f"SELECT write_file('{PROOF}') AS v", "SELECT write_row() AS v"):
        assert refused(lambda sql=sql: postgres_to_dataframe(url, query=sql,
                                                             spark=spark).collect())
    assert snapshot(url, victim)["rows"] == (1, 0, 0) and not PROOF.exists()


def test_a_user_who_may_not_become_the_reader_is_told_the_grant(
        db: tuple[str, psycopg.Connection]) -> None:
    """A login that cannot create or be granted the reader role: the read is refused (never
    run as the writer instead) with the statement an administrator runs."""
    url, _ = db
    weak = f"sstore_weak_{os.getpid()}"
    reader.ensure(url)  # the superuser makes the role (the shared server may have it already)
    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f'DROP ROLE IF EXISTS "{weak}"')
        con.execute(f"CREATE ROLE \"{weak}\" LOGIN PASSWORD 'weak-pw'")
        try:
            where = parse(url)
            weak_url = f"postgresql://{weak}:weak-pw@{where.host}:{where.port}/{where.dbname}"
            with pytest.raises(reader.ReaderRoleError,
                               match=f'may not read as the reader role.*GRANT "sstore_reader" '
                                     f'TO "{weak}"'):
                read_postgres(weak_url, "SELECT 1 AS one")
        finally:
            con.execute(f'DROP ROLE "{weak}"')
