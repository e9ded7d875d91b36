"""Read paths cannot write (issue 10, item 5): real DuckDB files, real PostgreSQL, the real CLI.

Each hostile-but-realistic case a user found is reproduced here and must now be refused with a
message that names what was refused, leaving the state file (md5) and the PostgreSQL tables
(row counts, primary keys) as they were. Where an engine offers a second guard (a read-only
DuckDB connection with external access off, READ ONLY transactions), a test bypasses the SQL
check to show that guard holds on its own.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import psycopg
import pyarrow as pa
import pytest

from sstore import Engine
from sstore.base.errors import TerminalError

ROOT = Path(__file__).resolve().parents[2]


def _md5(path: str) -> str:
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def _sstore(*args: str, catalog: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real command line in a process of its own, importing this worktree's code."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if catalog is not None:
        env["SSTORE_CATALOG"] = catalog
    return subprocess.run([sys.executable, "-m", "sstore.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=str(ROOT), check=False)


def _refused(info: pytest.ExceptionInfo[BaseException], *words: str,
             kind: str = "ReadOnlyQueryError") -> None:
    """The error is sstore's refusal of that ``kind`` and names what was refused. (Tests
    check the damage first and the class last, so that they fail for the damage on code
    without the guards.)"""
    names = [cls.__name__ for cls in type(info.value).__mro__]
    assert kind in names, repr(info.value)
    for word in words:
        assert word in str(info.value), str(info.value)


@pytest.fixture
def state_file(tmp_path: Path) -> str:
    """A closed state file with a stream (two batches) and a table."""
    path = str(tmp_path / "state.duckdb")
    with Engine(path) as engine:
        engine.stream("votes", {"phone": "BIGINT", "contestant": "INTEGER"})
        engine.execute("CREATE TABLE totals (contestant INTEGER PRIMARY KEY, n BIGINT)")
        engine.execute("INSERT INTO totals VALUES (1, 10), (2, 20)")
        engine.ingest("votes", [(5551234, 1), (5559876, 2)])
        engine.ingest("votes", [(5550000, 1)])
    return path


def _counts(path: str) -> tuple[int, int, int]:
    with duckdb.connect(path, read_only=True) as con:
        return (con.execute("SELECT count(*) FROM totals").fetchone()[0],
                con.execute("SELECT count(*) FROM votes").fetchone()[0],
                con.execute("SELECT count(*) FROM sstore_sys.commits").fetchone()[0])


# ---------------------------------------------------------------- the check itself

ACCEPTED = [
    "SELECT * EXCLUDE (_batch_id) FROM votes",
    "SELECT contestant, count(*) FROM votes GROUP BY ALL ORDER BY ALL",
    "FROM totals",
    "FROM totals SELECT n WHERE contestant = ?",
    "WITH t AS (SELECT 1 AS x) SELECT * FROM t",
    "SELECT 1 UNION ALL SELECT 2 EXCEPT SELECT 2 INTERSECT SELECT 1",
    "VALUES (1, 'a'), (2, 'b')",
    "SELECT * FROM range(3) r(i) JOIN generate_series(1, 2) g(j) ON i = j",
    "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'",
    "SELECT max(batch_id) AS last FROM sstore_sys.commits WHERE node = $1",
    "SELECT 200::UTINYINT AS u8, ?::INTEGER AS p",  # sqlglot cannot parse this; DuckDB can
    "WITH RECURSIVE r AS (SELECT 1 AS i UNION ALL SELECT i + 1 FROM r WHERE i < 3) FROM r",
    "SELECT list_transform([1, 2], x -> x + 1) AS l, {'a': 1} AS s",
    "DESCRIBE totals",
    "SUMMARIZE SELECT * FROM totals",
]

REFUSED = [  # (SQL, the statement kind the message must name)
    ("INSERT INTO totals VALUES (3, 30)", "INSERT"),
    ("UPDATE totals SET n = 0", "UPDATE"),
    ("DELETE FROM totals", "DELETE"),
    (("MERGE INTO totals USING totals AS s ON totals.contestant = s.contestant "
      "WHEN MATCHED THEN DELETE"), "MERGE"),
    ("COPY (SELECT 'x') TO '/tmp/sstore-readonly-copy.csv'", "COPY"),
    ("CREATE TABLE stolen AS SELECT * FROM totals", "CREATE"),
    ("DROP TABLE sstore_sys.commits", "DROP"),
    ("ATTACH '/tmp/sstore-readonly-attach.duckdb' AS other", "ATTACH"),
    ("PRAGMA database_size", "PRAGMA"),
    ("SET threads = 1", "SET"),
    ("CALL pragma_version()", "CALL"),
    ("INSTALL httpfs", "INSTALL"),
    ("LOAD httpfs", "LOAD"),
    ("EXPORT DATABASE '/tmp/sstore-readonly-export'", "EXPORT"),
    ("CHECKPOINT", "CHECKPOINT"),
    ("SELECT 1; DELETE FROM totals", "DELETE"),
    ("WITH d AS (DELETE FROM totals RETURNING *) SELECT * FROM d", "DELETE"),
    ("WITH u AS (UPDATE totals SET n = 0 RETURNING *) SELECT * FROM u", "UPDATE"),
    ("WITH i AS (INSERT INTO totals VALUES (9, 9) RETURNING *) SELECT * FROM i", "INSERT"),
    ("SELECT * FROM totals WHERE n IN (SELECT nextval('seq'))", "nextval"),
    ("SUMMARIZE SELECT * FROM read_text('/etc/hostname')", "read_text"),
    ("SELECT * FROM main.read_csv_auto('/etc/hostname')", "read_csv_auto"),
    ("SELECT * FROM totals, LATERAL (SELECT * FROM sniff_csv('/etc/hostname'))", "sniff_csv"),
    ("SELECT * FROM arrow_scan(1, 2, 3)", "arrow_scan"),
    ("SELECT * FROM read_text('/etc/hostname')", "read_text"),
    ("SELECT * FROM read_csv('/etc/hostname')", "read_csv"),
    ("SELECT * FROM glob('/etc/*')", "glob"),
    ("SELECT * FROM query('SELECT 1')", "query"),
    ("SELECT * FROM '/etc/passwd'", "/etc/passwd"),
    ('SELECT * FROM "data.csv"', "data.csv"),
]


@pytest.mark.parametrize("sql", ACCEPTED)
def test_queries_our_code_writes_pass_the_check(sql: str) -> None:
    from sstore.base.readonly import check_query
    check_query(sql, "duckdb")


@pytest.mark.parametrize(("sql", "kind"), REFUSED, ids=[k for _, k in REFUSED])
def test_everything_but_a_query_is_refused_by_name(sql: str, kind: str) -> None:
    from sstore.base.readonly import check_query
    with pytest.raises(TerminalError) as info:
        check_query(sql, "duckdb")
    _refused(info, kind)


@pytest.mark.parametrize(("dialect", "sql", "kind"), [
    ("postgres", "WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", "DELETE"),
    ("postgres", "SELECT * INTO copy_of_t FROM t", "INTO"),
    ("postgres", "SELECT * FROM t FOR UPDATE", "FOR UPDATE"),
    ("postgres", "SELECT pg_read_file('/etc/passwd')", "pg_read_file"),
    ("postgres", "SELECT set_config('default_transaction_read_only', 'off', false)",
     "set_config"),
    ("postgres", "SELECT lo_export(1, '/tmp/x')", "lo_export"),
    ("postgres", "COPY (SELECT 1) TO '/tmp/x'", "COPY"),
    ("postgres", "TRUNCATE t", "TRUNCATE"),
    ("spark", "SELECT * FROM csv.`/etc/passwd`", "/etc/passwd"),
    ("spark", "SELECT reflect('java.lang.System', 'getenv')", "reflect"),
    ("spark", "CACHE TABLE t", "CACHE"),
])
def test_other_dialects_are_checked_too(dialect: str, sql: str, kind: str) -> None:
    from sstore.base.readonly import check_query
    with pytest.raises(TerminalError) as info:
        check_query(sql, dialect)
    _refused(info, kind)


def test_sql_that_cannot_be_parsed_is_refused() -> None:
    from sstore.base.readonly import UncheckableQueryError, check_query
    with pytest.raises(UncheckableQueryError, match="cannot check the query"):
        check_query("SELEC 1", "duckdb")
    with pytest.raises(UncheckableQueryError, match=r"sqlglot \(postgres\) cannot parse"):
        check_query("SELECT FROM WHERE (", "postgres")


# ---------------------------------------------------------------- a state file from outside

def test_copy_to_the_state_file_is_refused_and_the_file_is_intact(state_file: str) -> None:
    """Seen: ``sstore query STATE "COPY (SELECT 'x') TO '<state>'"`` exited 0 and overwrote
    the state file with one line of CSV."""
    before, counts = _md5(state_file), _counts(state_file)
    done = _sstore("query", state_file, f"COPY (SELECT 'x') TO '{state_file}'")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "COPY is not a query" in done.stderr
    assert _md5(state_file) == before and _counts(state_file) == counts
    from sstore.storage.statefile import query_file
    with pytest.raises(TerminalError) as info:
        query_file(state_file, f"COPY (SELECT 'x') TO '{state_file}' (FORMAT csv)")
    _refused(info, "COPY")
    assert _md5(state_file) == before


def test_reading_other_files_is_refused(state_file: str, tmp_path: Path) -> None:
    """Seen: ``sstore query STATE "SELECT * FROM read_text('/etc/hostname')"`` printed it."""
    secret = tmp_path / "secret.csv"
    secret.write_text("password\nhunter2\n")
    for sql in (f"SELECT * FROM read_text('{secret}')", f"SELECT * FROM read_csv('{secret}')",
                f"SELECT * FROM '{secret}'", f"SELECT * FROM glob('{tmp_path}/*')"):
        done = _sstore("query", state_file, sql)
        assert done.returncode == 1, (sql, done.stdout)
        assert "hunter2" not in done.stdout + done.stderr and "secret" not in done.stdout
        assert "query failed" in done.stderr


def test_the_state_file_connection_refuses_files_without_the_check(state_file: str,
                                                                     monkeypatch) -> None:
    """Second guard: the connection is read-only with external access off, so COPY TO,
    read_text and ATTACH fail in DuckDB itself even when the SQL check is bypassed."""
    from sstore.storage import statefile
    monkeypatch.setattr(statefile, "check_query", lambda sql, dialect="duckdb": None)
    before = _md5(state_file)
    for sql in (f"COPY (SELECT 'x') TO '{state_file}.copy'",
                "SELECT * FROM read_text('/etc/hostname')",
                f"ATTACH '{state_file}.other' AS other"):
        with pytest.raises(duckdb.PermissionException):
            statefile.query_file(state_file, sql)
    # over the state file itself DuckDB 2.0.1 refuses already when binding (the file belongs
    # to an attached database); either refusal keeps the file whole
    with pytest.raises((duckdb.PermissionException, duckdb.BinderException)):
        statefile.query_file(state_file, f"COPY (SELECT 'x') TO '{state_file}'")
    with pytest.raises(duckdb.Error, match="read-only"):
        statefile.query_file(state_file, "DELETE FROM totals")
    assert _md5(state_file) == before and not os.path.exists(f"{state_file}.other")
    assert not os.path.exists(f"{state_file}.copy")


# ---------------------------------------------------------------- the live engine

def test_engine_query_refuses_writes_and_files(engine: Engine, tmp_path: Path) -> None:
    engine.stream("votes", {"phone": "BIGINT", "contestant": "INTEGER"})
    engine.execute("CREATE TABLE totals (contestant INTEGER PRIMARY KEY, n BIGINT)")
    engine.execute("INSERT INTO totals VALUES (1, 10), (2, 20)")
    engine.ingest("votes", [(5551234, 1)])
    target = tmp_path / "leak.csv"
    for sql, kind in (("DELETE FROM totals", "DELETE"),
                      (f"COPY totals TO '{target}'", "COPY"),
                      ("DROP TABLE sstore_sys.commits", "DROP"),
                      ("SELECT * FROM read_text('/etc/hostname')", "read_text"),
                      (f"ATTACH '{tmp_path / 'x.duckdb'}' AS x", "ATTACH")):
        with pytest.raises(TerminalError) as info:
            engine.query(sql)
        _refused(info, kind)
    assert not target.exists() and not (tmp_path / "x.duckdb").exists()
    assert engine.query("SELECT sum(n) AS s FROM totals").to_pylist() == [{"s": 30}]
    # the engine's own reads still work: its ledger, DuckDB shorthands, parameters
    assert engine.query("SELECT count(*) AS n FROM sstore_sys.commits WHERE node = ?",
                        "votes").to_pylist() == [{"n": 1}]
    assert engine.query("FROM votes SELECT * EXCLUDE (_batch_id)").to_pylist() == \
        [{"phone": 5551234, "contestant": 1}]


def test_engine_query_runs_in_a_read_only_transaction(engine: Engine, monkeypatch) -> None:
    """Second guard: with the SQL check bypassed, a write still fails (READ ONLY transaction
    on a cursor of its own) and the engine goes on working."""
    import sstore.engine_reads
    engine.execute("CREATE TABLE totals (contestant INTEGER, n BIGINT)")
    engine.execute("INSERT INTO totals VALUES (1, 10)")
    monkeypatch.setattr(sstore.engine_reads, "check_query", lambda sql, dialect="duckdb": None)
    with pytest.raises(duckdb.TransactionException, match="read-only"):
        engine.query("DELETE FROM totals")
    monkeypatch.undo()
    assert engine.query("SELECT count(*) AS n FROM totals").to_pylist() == [{"n": 1}]
    with engine.transaction() as tx:
        tx.execute("UPDATE totals SET n = 11")
    assert engine.query("SELECT n FROM totals").to_pylist() == [{"n": 11}]


# ---------------------------------------------------------------- the polystore

@pytest.fixture
def two_engines(tmp_path: Path, pg_url: str):
    """A live engine with a table and a stream, PostgreSQL with ``public.customer`` (primary
    key), both attached to a polystore; yields (polystore, engine)."""
    from sstore.polystore import Polystore
    engine = Engine(str(tmp_path / "stream.duckdb"))
    engine.stream("trades", {"t_id": "INTEGER", "c_id": "INTEGER"})
    engine.execute("CREATE TABLE vip (c_id INTEGER, level VARCHAR)")
    engine.execute("INSERT INTO vip VALUES (1, 'gold'), (2, 'silver')")
    engine.ingest("trades", [(10, 1), (11, 2), (12, 1)])
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE customer (c_id int PRIMARY KEY, c_name text)")
        con.execute("INSERT INTO customer SELECT g, 'c' || g FROM generate_series(1, 50) g")
    ps = Polystore(str(tmp_path / "catalog.json"))
    ps.attach_engine("stream", engine)
    ps.add_postgres("pg", pg_url)
    yield ps, engine
    ps.close()
    engine.close()


def _pg_count(url: str, table: str = "public.customer") -> int:
    with psycopg.connect(url) as con:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def _pg_primary_key(url: str, table: str = "public.customer") -> list[str]:
    with psycopg.connect(url) as con:
        return [r[0] for r in con.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
            (table,)).fetchall()]


def test_a_delete_through_the_polystore_is_refused_in_both_engines(two_engines,
                                                                   pg_url: str) -> None:
    """Seen: ``DELETE`` through the polystore committed in PostgreSQL and in the engine."""
    ps, engine = two_engines
    for sql, kind in (("DELETE FROM customer", "DELETE"), ("DELETE FROM vip", "DELETE"),
                      ("WITH d AS (DELETE FROM customer RETURNING *) SELECT count(*) FROM d",
                       "DELETE"),
                      ("UPDATE vip SET level = 'none'", "UPDATE"),
                      ("SELECT 1 FROM customer; DELETE FROM customer", "DELETE"),
                      ("SELECT pg_read_file('/etc/hostname') FROM customer", "pg_read_file")):
        with pytest.raises(TerminalError) as info:
            ps.query(sql)
        _refused(info, kind)
        with pytest.raises(TerminalError):
            ps.explain(sql)
    assert _pg_count(pg_url) == 50
    assert engine.query("SELECT count(*) AS n FROM vip").to_pylist() == [{"n": 2}]
    # a split object's query pulls into the island: a file function is refused there too
    ps.split("people", {"stream": "vip", "pg": "public.customer"})
    with pytest.raises(TerminalError) as info:
        ps.query("SELECT * FROM people, read_text('/etc/hostname')")
    _refused(info, "read_text")


def test_postgres_reads_run_in_read_only_transactions(two_engines, pg_url: str,
                                                      monkeypatch) -> None:
    """Second guard: with the SQL check bypassed, PostgreSQL itself refuses the write (the
    connector's ADBC reads and its small questions both run READ ONLY), and so does
    ``read_postgres`` (the migrators' read path)."""
    from migrators.errors import MigrationError
    from migrators.postgres_to_engine import read_postgres
    from sstore.polystore import connector_postgres
    ps, _engine = two_engines
    pg = ps.connector("pg")
    monkeypatch.setattr(connector_postgres, "check_query", lambda sql, dialect="duckdb": None)
    with pytest.raises(MigrationError, match="read-only transaction"):
        pg.fetch("DELETE FROM customer")
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        pg._execute("DELETE FROM customer")
    with pytest.raises(MigrationError, match="read-only transaction"):
        read_postgres(pg_url, "DELETE FROM customer RETURNING c_id")
    assert pg.fetch("SELECT count(*) AS n FROM customer").to_pylist() == [{"n": 50}]
    assert _pg_count(pg_url) == 50


def test_the_island_has_no_external_access(monkeypatch) -> None:
    from sstore.polystore import executor
    monkeypatch.setattr(executor, "check_query", lambda sql, dialect="duckdb": None)
    with pytest.raises(duckdb.PermissionException):
        executor.run_in_island("SELECT * FROM read_text('/etc/hostname')", {})
    assert executor.run_in_island("SELECT sum(x) AS s FROM t",
                                  {"t": pa.table({"x": [1, 2]})}).to_pylist() == [{"s": 3}]


def test_spark_reads_are_checked_before_spark_is_asked() -> None:
    from migrators.spark_session import is_running
    from sstore.polystore.connectors import SparkConnector
    spark = SparkConnector("spark")
    running = is_running()
    with pytest.raises(TerminalError) as info:
        spark.fetch("INSERT INTO t VALUES (1)")
    _refused(info, "INSERT")
    with pytest.raises(TerminalError) as info:
        spark.store("orders", pa.table({"x": [1]}))
    _refused(info, "sstore_scratch__", kind="ProtectedObjectError")
    assert is_running() == running  # no JVM was started for them


# ---------------------------------------------------------------- bdcast

CAST_SOURCE = "bdrel(SELECT c_id, level FROM vip)"


def test_bdcast_over_a_postgres_table_with_a_primary_key_is_refused(two_engines,
                                                                    pg_url: str) -> None:
    """Seen: bdcast(query, customer, pg) dropped public.customer (and its primary key) and put
    the query's rows in its place."""
    ps, _engine = two_engines
    for options in ({}, {"replace": True}):
        with pytest.raises(TerminalError) as info:
            ps.query(f"SELECT count(*) FROM bdcast({CAST_SOURCE}, customer, pg)", **options)
        assert _pg_count(pg_url) == 50 and _pg_primary_key(pg_url) == ["c_id"]
        _refused(info, "already names pg:customer", kind="ProtectedObjectError")
    assert [f.physical for f in ps.catalog.lookup("customer").fragments] == ["customer"]
    # a PostgreSQL table the catalog does not know is not touched either: the cast is new,
    # in the scratch schema
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE secret (c_id int PRIMARY KEY)")
        con.execute("INSERT INTO secret VALUES (7)")
    assert ps.query(f"SELECT count(*) AS n FROM bdcast({CAST_SOURCE}, secret, pg)"
                    ).to_pylist() == [{"n": 2}]
    assert _pg_count(pg_url, "public.secret") == 1 and _pg_primary_key(pg_url, "public.secret")
    assert _pg_count(pg_url, "sstore_scratch.secret") == 2


def test_bdcast_never_touches_the_engine_ledger(two_engines) -> None:
    """Seen: bdcast(query, sstore_sys.commits, stream) replaced the engine's ledger."""
    ps, engine = two_engines
    ledger = engine.query("SELECT * FROM sstore_sys.commits ORDER BY ALL").to_pylist()
    with pytest.raises(TerminalError) as info:
        ps.query(f"SELECT * FROM bdcast({CAST_SOURCE}, sstore_sys.commits, stream)")
    assert engine.query("SELECT * FROM sstore_sys.commits ORDER BY ALL").to_pylist() == ledger
    _refused(info, "not a plain name", kind="ProtectedObjectError")
    with pytest.raises(TerminalError) as info:  # refused before the inner cast runs
        ps.query(f"SELECT * FROM bdcast(bdrel(SELECT * FROM bdcast({CAST_SOURCE}, inner_cast, "
                 f"stream)), sstore_sys.commits, stream)")
    _refused(info, "not a plain name", kind="ProtectedObjectError")
    assert ps.catalog.find("inner_cast") is None
    assert ps.query(f"SELECT count(*) AS n FROM bdcast({CAST_SOURCE}, commits, stream)"
                    ).to_pylist() == [{"n": 2}]
    assert ps.catalog.lookup("commits").fragments[0].physical == "sstore_scratch.commits"
    assert engine.query("SELECT * FROM sstore_sys.commits ORDER BY ALL").to_pylist() == ledger
    assert int(engine.ingest("trades", [(13, 2)])) == 2  # the engine goes on
    assert engine.query("SELECT count(*) AS n FROM sstore_sys.commits WHERE node = 'trades'"
                        ).to_pylist() == [{"n": 2}]


def test_bdcast_replace_works_inside_the_scratch_schema(two_engines, pg_url: str) -> None:
    ps, engine = two_engines
    first = f"SELECT count(*) AS n FROM bdcast({CAST_SOURCE}, golden, stream)"
    assert ps.query(first).to_pylist() == [{"n": 2}]
    engine.execute("INSERT INTO vip VALUES (3, 'bronze')")
    with pytest.raises(TerminalError) as info:
        ps.query(first)
    assert ps.query("SELECT count(*) AS n FROM golden").to_pylist() == [{"n": 2}]
    _refused(info, "replace=True", kind="CastExistsError")
    assert ps.query(first, replace=True).to_pylist() == [{"n": 3}]
    assert ps.query("SELECT count(*) AS n FROM golden").to_pylist() == [{"n": 3}]
    assert engine.query("SELECT count(*) AS n FROM sstore_scratch.golden").to_pylist() == \
        [{"n": 3}]
    # the same into PostgreSQL
    into_pg = f"SELECT count(*) AS n FROM bdcast({CAST_SOURCE}, golden_pg, pg)"
    ps.query(into_pg)
    with pytest.raises(TerminalError) as info:
        ps.query(into_pg)
    _refused(info, "sstore_scratch.golden_pg", kind="CastExistsError")
    assert ps.query(into_pg, replace=True).to_pylist() == [{"n": 3}]
    assert _pg_count(pg_url, "sstore_scratch.golden_pg") == 3


def test_writes_outside_sstores_schemas_are_refused_by_every_connector(two_engines) -> None:
    ps, engine = two_engines
    rows = pa.table({"c_id": [9]})
    for name, table in (("stream", "sstore_sys.commits"), ("stream", "vip"),
                        ("pg", "public.customer"), ("pg", "customer")):
        connector = ps.connector(name)
        with pytest.raises(TerminalError) as info:
            connector.store(table, rows)
        _refused(info, "writes only", kind="ProtectedObjectError")
        with pytest.raises(TerminalError) as info:
            connector.drop(table)
        _refused(info, "writes only", kind="ProtectedObjectError")
    assert engine.query("SELECT count(*) AS n FROM vip").to_pylist() == [{"n": 2}]


def test_cache_tables_never_clobber_a_users_table(two_engines, pg_url: str) -> None:
    """A migration's cache lives in the sstore_cache schema: a user's table named like the
    old cache tables (``sstore_cache__...`` in the engine's main schema) is left alone."""
    ps, engine = two_engines
    engine.execute("CREATE TABLE sstore_cache__customer__pg__to__stream AS SELECT 'mine' AS x")
    sql = "SELECT level, count(*) AS n FROM customer JOIN vip USING (c_id) GROUP BY level"
    answer = ps.query(sql, plan="migrate into stream").to_pylist()
    assert sorted(answer, key=str) == [{"level": "gold", "n": 1}, {"level": "silver", "n": 1}]
    assert engine.query("SELECT x FROM sstore_cache__customer__pg__to__stream").to_pylist() == \
        [{"x": "mine"}]
    assert engine.query("SELECT count(*) AS n FROM sstore_cache.customer__pg__to__stream"
                        ).to_pylist() == [{"n": 50}]
    assert _pg_count(pg_url) == 50


def test_a_state_file_in_the_catalog_is_never_written(tmp_path: Path, state_file: str,
                                                      pg_url: str) -> None:
    """An engine the catalog names by its state file is opened read-only (external access
    off): cross-engine queries, a cast into it and a DELETE leave its md5 as it was."""
    from sstore.polystore import Polystore
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE names (contestant int PRIMARY KEY, name text)")
        con.execute("INSERT INTO names VALUES (1, 'one'), (2, 'two')")
    catalog = str(tmp_path / "catalog.json")
    before = _md5(state_file)
    for args in (["polystore", "add-postgres", "pg", pg_url],
                 ["polystore", "add-engine", "stream", state_file]):
        done = _sstore(*args, catalog=catalog)
        assert done.returncode == 0, done.stderr
    assert "totals" in Path(catalog).read_text() and _md5(state_file) == before
    sql = "SELECT name, n FROM totals JOIN names USING (contestant) ORDER BY name"
    with Polystore(catalog) as ps:
        assert ps.query(sql).to_pylist() == [{"name": "one", "n": 10}, {"name": "two", "n": 20}]
        assert all(p.name != "migrate into stream" for p in ps.plans(sql))
    assert _md5(state_file) == before
    with Polystore(catalog) as ps:
        with pytest.raises(TerminalError) as info:
            ps.query("SELECT * FROM bdcast(bdrel(SELECT * FROM names), names_copy, stream)")
        _refused(info, "read-only", kind="ProtectedObjectError")
        with pytest.raises(TerminalError) as info:
            ps.query("DELETE FROM totals")
        _refused(info, "DELETE")
    done = _sstore("query", "DELETE FROM totals", catalog=catalog)
    assert done.returncode == 1 and "DELETE is not a query" in done.stderr
    done = _sstore("query", "--format", "csv", sql, catalog=catalog)
    assert done.returncode == 0 and "one,10" in done.stdout, done.stderr
    assert _md5(state_file) == before and _counts(state_file) == (2, 3, 2)


def test_cli_replace_flag(tmp_path: Path, pg_url: str) -> None:
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE customer (c_id int PRIMARY KEY, c_name text)")
        con.execute("INSERT INTO customer VALUES (1, 'a'), (2, 'b')")
    catalog = str(tmp_path / "catalog.json")
    assert _sstore("polystore", "add-postgres", "pg", pg_url, catalog=catalog).returncode == 0
    cast = "SELECT count(*) AS n FROM bdcast(bdrel(SELECT * FROM customer), best, pg)"
    first = _sstore("query", "--format", "csv", cast, catalog=catalog)
    assert first.returncode == 0 and first.stdout.splitlines() == ["n", "2"], first.stderr
    again = _sstore("query", cast, catalog=catalog)
    assert again.returncode == 1 and "--replace" in again.stderr
    replaced = _sstore("query", "--replace", "--format", "csv", cast, catalog=catalog)
    assert replaced.returncode == 0 and replaced.stdout.splitlines() == ["n", "2"]
    over_user_table = _sstore("query", "--replace",
                              "SELECT * FROM bdcast(bdrel(SELECT 1 AS c_id), customer, pg)",
                              catalog=catalog)
    assert over_user_table.returncode == 1 and "already names" in over_user_table.stderr
    assert _pg_count(pg_url) == 2 and _pg_primary_key(pg_url) == ["c_id"]
