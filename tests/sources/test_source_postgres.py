"""PostgreSQL change data capture (sstore.sources.postgres_cdc, `sstore source postgres`): the
snapshot then the changes, with no gap and no duplicate at the handoff, the slot advanced only
after the engine committed, across SIGKILLs anywhere. On a private server with
``wal_level = logical`` (migrators.embedded_postgres), started once for this module."""

from __future__ import annotations

import datetime
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from migrators.embedded_postgres import PrivatePostgres
from sstore import DeclarationError, Engine
from sstore.cli.app import main
from sstore.sources import SourceError, feed
from sstore.sources.pgoutput import lsn_int
from sstore.sources.postgres_cdc import PostgresSource

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = {"id": "INTEGER", "name": "VARCHAR", "amount": "DECIMAL(10,2)", "day": "DATE",
           "_op": "VARCHAR", "_lsn": "BIGINT"}


@pytest.fixture(scope="module")
def logical_pg() -> Iterator[PrivatePostgres]:
    """A private server with wal_level = logical (outside tmp_path: see test_embedded_postgres)."""
    home = Path(tempfile.mkdtemp(prefix="sstore-test-cdc-"))
    server = PrivatePostgres(home / "pg", settings={"wal_level": "logical"}).start()
    yield server
    server.stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def source_url(logical_pg: PrivatePostgres) -> Iterator[str]:
    """A fresh database on the logical server (slots are per database: none left over)."""
    name = f"cdc_{os.getpid()}_{random.randrange(10**9)}"
    with psycopg.connect(logical_pg.url, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    url = logical_pg.url_for(name)
    yield url
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE database = current_database()")
    with psycopg.connect(logical_pg.url, autocommit=True) as con:
        con.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def sql(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as con:
        for statement in statements:
            con.execute(statement)


def slot_lsn(url: str) -> str | None:
    with psycopg.connect(url) as con:
        row = con.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots").fetchone()
    return None if row is None else str(row[0])


def program(path: str) -> Engine:
    eng = Engine(path)
    eng.stream("orders", COLUMNS)

    @eng.procedure(input="orders", output="ops")
    def count(tx, batch):
        return tx.sql("SELECT _op FROM batch")

    return eng


def captured(path: str) -> list[dict[str, Any]]:
    with Engine.open_existing(path) as eng:
        return eng.query("SELECT * FROM orders ORDER BY _batch_id, _lsn, _op").to_pylist()


def replay(rows: list[dict[str, Any]]) -> dict[int, tuple[Any, ...]]:
    """The table a consumer rebuilds from the stream (by key, in LSN order)."""
    table: dict[int, tuple[Any, ...]] = {}
    for r in sorted(rows, key=lambda r: (r["_batch_id"], r["_lsn"])):
        if r["_op"] == "truncate":
            table.clear()
        elif r["_op"] == "delete":
            table.pop(r["id"], None)
        else:
            table[r["id"]] = (r["name"], r["amount"], r["day"])
    return table


def current(url: str) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(url) as con:
        return {r[0]: tuple(r[1:]) for r in
                con.execute("SELECT id, name, amount, day FROM orders").fetchall()}


def make_table(url: str) -> None:
    sql(url, "CREATE TABLE orders (id int PRIMARY KEY, name text, amount numeric(10,2), "
             "day date)",
        "INSERT INTO orders SELECT i, 'n' || i, i * 1.25, DATE '2024-01-01' + i "
        "FROM generate_series(1, 5) i")


def test_snapshot_then_changes_each_once_slot_after_commit(source_url: str,
                                                           state_path: str) -> None:
    make_table(source_url)
    with program(state_path) as eng:
        report = feed(eng, PostgresSource(source_url, "public.orders"), "orders",
                      until_idle=True, poll=0.05)
        assert (report.batches, report.rows) == (1, 5)
        snapshot_at = report.position
    assert slot_lsn(source_url) is not None
    sql(source_url, "INSERT INTO orders VALUES (6, 'six', 6.5, '2024-02-06')",
        "UPDATE orders SET name = 'two' WHERE id = 2",
        "BEGIN; DELETE FROM orders WHERE id = 1; INSERT INTO orders VALUES (7, NULL, NULL, "
        "NULL); COMMIT")
    with program(state_path) as eng:
        report = feed(eng, PostgresSource(source_url, "orders", batch=1), "orders",
                      until_idle=True, poll=0.05)
        assert report.batches == 3 and report.rows == 4  # a transaction is never split
        assert eng.query_rows("SELECT count(*) FROM ops")[1] == [(9,)]
        position = report.position
    rows = captured(state_path)
    assert [(r["_op"], r["id"], r["name"]) for r in rows] == [
        ("snapshot", 1, "n1"), ("snapshot", 2, "n2"), ("snapshot", 3, "n3"),
        ("snapshot", 4, "n4"), ("snapshot", 5, "n5"), ("insert", 6, "six"),
        ("update", 2, "two"), ("delete", 1, None), ("insert", 7, None)]
    assert {r["_batch_id"] for r in rows if r["_op"] == "snapshot"} == {snapshot_at}
    assert replay(rows) == current(source_url)
    assert lsn_int(slot_lsn(source_url) or "0/0") == position  # advanced to the commit
    sql(source_url, "TRUNCATE orders", "INSERT INTO orders VALUES (8, 'e', 1, '2024-03-01')")
    with program(state_path) as eng:
        feed(eng, PostgresSource(source_url, "orders"), "orders", until_idle=True, poll=0.05)
    rows = captured(state_path)
    assert [(r["_op"], r["id"]) for r in rows[-2:]] == [("truncate", None), ("insert", 8)]
    assert replay(rows) == current(source_url) == {8: ("e", 1, datetime.date(2024, 3, 1))}


def test_several_tables_from_one_slot(source_url: str, state_path: str) -> None:
    """One snapshot of both tables as of one instant, then their changes in commit order; a
    transaction over both is one batch; rows carry their table in _table."""
    sql(source_url, "CREATE TABLE orders (id int PRIMARY KEY, name text)",
        "CREATE TABLE lines (line int PRIMARY KEY, id int, qty int)",
        "INSERT INTO orders VALUES (1, 'a')", "INSERT INTO lines VALUES (10, 1, 3)")
    eng = Engine(state_path)
    eng.stream("changes", {"_table": "VARCHAR", "id": "INTEGER", "name": "VARCHAR",
                           "line": "INTEGER", "qty": "INTEGER", "_op": "VARCHAR",
                           "_lsn": "BIGINT"})
    with eng:
        with pytest.raises(DeclarationError, match="_table VARCHAR"):
            eng2 = Engine(state_path + ".b")
            eng2.stream("changes", {"id": "INTEGER", "name": "VARCHAR", "line": "INTEGER",
                                    "qty": "INTEGER", "_op": "VARCHAR", "_lsn": "BIGINT"})
            with eng2:
                feed(eng2, PostgresSource(source_url, ["orders", "lines"]), "changes",
                     until_idle=True, poll=0.05)
        feed(eng, PostgresSource(source_url, ["public.orders", "public.lines"]), "changes",
             until_idle=True, poll=0.05)
        sql(source_url, "BEGIN; INSERT INTO orders VALUES (2, 'b'); INSERT INTO lines VALUES "
                        "(20, 2, 5); COMMIT", "DELETE FROM lines WHERE line = 10")
        report = feed(eng, PostgresSource(source_url, ["public.orders", "public.lines"],
                                          batch=1), "changes", until_idle=True, poll=0.05)
        assert report.batches == 2
        rows = eng.query("SELECT _batch_id, _table, _op, id, name, line, qty FROM changes "
                         "ORDER BY _batch_id, _lsn").to_pylist()
    snapshot, first, second = sorted({r["_batch_id"] for r in rows})
    assert [tuple(r.values())[1:] for r in rows] == [
        ("public.orders", "snapshot", 1, "a", None, None),
        ("public.lines", "snapshot", 1, None, 10, 3),
        ("public.orders", "insert", 2, "b", None, None),
        ("public.lines", "insert", 2, None, 20, 5),
        ("public.lines", "delete", None, None, 10, None)]
    assert [r["_batch_id"] for r in rows] == [snapshot, snapshot, first, first, second]


def test_a_table_without_key_is_refused_until_replica_identity_full(
        source_url: str, state_path: str) -> None:
    sql(source_url, "CREATE TABLE orders (id int, name text, amount numeric(10,2), day date)",
        "INSERT INTO orders VALUES (1, 'a', 1, '2024-01-01')")
    with program(state_path) as eng, pytest.raises(
            SourceError, match="REPLICA IDENTITY FULL"):
        feed(eng, PostgresSource(source_url, "orders"), "orders", until_idle=True, poll=0.05)
    sql(source_url, "ALTER TABLE orders REPLICA IDENTITY FULL")
    with program(state_path) as eng:
        feed(eng, PostgresSource(source_url, "orders"), "orders", until_idle=True, poll=0.05)
        sql(source_url, "DELETE FROM orders WHERE id = 1")
        feed(eng, PostgresSource(source_url, "orders"), "orders", until_idle=True, poll=0.05)
    assert [(r["_op"], r["id"], r["name"]) for r in captured(state_path)] == [
        ("snapshot", 1, "a"), ("delete", 1, "a")]  # FULL: the deleted row whole


def test_a_column_change_stops_the_source_before_it(source_url: str, state_path: str) -> None:
    make_table(source_url)
    with program(state_path) as eng:
        feed(eng, PostgresSource(source_url, "orders"), "orders", until_idle=True, poll=0.05)
    sql(source_url, "INSERT INTO orders VALUES (6, 'six', 6, '2024-02-06')",
        "ALTER TABLE orders ADD COLUMN colour text",
        "INSERT INTO orders VALUES (7, 'seven', 7, '2024-02-07', 'red')")
    with program(state_path) as eng, pytest.raises(SourceError,
                                                   match=r"new column\(s\) \['colour'\]"):
        feed(eng, PostgresSource(source_url, "orders", batch=1), "orders", until_idle=True,
             poll=0.05)
    assert [r["id"] for r in captured(state_path)][-1] == 6  # up to the change, not past it
    with Engine(state_path) as eng:  # the stream evolves: the column appended
        eng.stream("orders", {**COLUMNS, "colour": "VARCHAR"})
        feed(eng, PostgresSource(source_url, "orders"), "orders", until_idle=True, poll=0.05)
        rows = eng.query("SELECT id, colour FROM orders WHERE id > 5 ORDER BY id").to_pylist()
    assert rows == [{"id": 6, "colour": None}, {"id": 7, "colour": "red"}]


def test_wal_level_is_checked(pg_url: str, state_path: str) -> None:
    """On the suite's warehouse (wal_level as its owner set it): refused with the fix, unless
    it is logical already."""
    with psycopg.connect(pg_url) as con:
        level = con.execute("SHOW wal_level").fetchone()[0]  # type: ignore[index]
    make_table(pg_url)
    with program(state_path) as eng:
        if level != "logical":
            with pytest.raises(SourceError, match="ALTER SYSTEM SET wal_level = logical"):
                feed(eng, PostgresSource(pg_url, "orders"), "orders", until_idle=True)
        else:
            assert feed(eng, PostgresSource(pg_url, "orders"), "orders",
                        until_idle=True).rows == 5


def test_slot_status_alert_and_drop(source_url: str, state_path: str) -> None:
    make_table(source_url)
    with program(state_path) as eng:
        feed(eng, PostgresSource(source_url, "orders"), "orders", until_idle=True, poll=0.05)
    runner = CliRunner()
    shown = runner.invoke(main, ["source", "status", state_path, "--postgres", source_url])
    assert shown.exit_code == 0 and "slot sstore_orders: retains" in shown.output, shown.output
    sql(source_url, "INSERT INTO orders SELECT i, repeat('x', 500), 1, '2024-01-01' "
                    "FROM generate_series(100, 2100) i")  # not taken: the slot keeps it
    shown = runner.invoke(main, ["source", "status", state_path, "--postgres", source_url,
                                 "--max-retained", "100000", "--json"])
    assert shown.exit_code == 1 and '"alert": true' in shown.output, shown.output
    refused = runner.invoke(main, ["source", "drop", state_path, "--stream", "orders"])
    assert refused.exit_code == 1 and "give --postgres URL" in refused.output
    assert slot_lsn(source_url) is not None
    done = runner.invoke(main, ["source", "drop", state_path, "--stream", "orders",
                                "--postgres", source_url])
    assert done.exit_code == 0, done.output
    assert slot_lsn(source_url) is None


# ------------------------------------------------------------------ SIGKILL, a real process
def cli(state: str, url: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sstore.cli", "source", "postgres", state, "--postgres", url,
         "--table", "public.orders", "--stream", "orders", "--batch", "20", "--poll", "0.05",
         "--until-idle"],
        cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)


def test_sigkill_anywhere_loses_and_doubles_nothing(source_url: str, state_path: str) -> None:
    """A writer changes the table all along; the command is killed at the snapshot's commit,
    after a commit before the slot advanced, and by timers; the stream replayed equals the
    table, and holds each change once."""
    make_table(source_url)
    with program(state_path) as eng:
        eng.run_until_idle()  # the program ran once: the state file knows the stream
    stop = threading.Event()
    changes = [0]

    def write() -> None:
        rng = random.Random(7)
        with psycopg.connect(source_url, autocommit=True) as con:
            next_id = 100
            while not stop.is_set():
                kind = rng.random()
                with con.transaction():
                    if kind < 0.5:
                        con.execute("INSERT INTO orders VALUES (%s, 'w', 1, '2024-01-01')",
                                    (next_id,))
                        next_id += 1
                        changes[0] += 1
                    else:
                        done = con.execute("UPDATE orders SET amount = amount + 1 WHERE id = "
                                           "(SELECT min(id) FROM orders)")
                        changes[0] += done.rowcount
                time.sleep(0.01)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for spec in ("ingest.before_commit:1", "source.after_commit:2",
                     "ingest.after_commit:3"):
            proc = cli(state_path, source_url, {"SSTORE_CRASH_AT": spec})
            proc.communicate(timeout=120)
            assert proc.returncode == -signal.SIGKILL, spec
        for delay in (1.0, 1.6):
            proc = cli(state_path, source_url)
            time.sleep(delay)
            proc.kill()
            proc.communicate(timeout=60)
    finally:
        stop.set()
        writer.join()
    proc = cli(state_path, source_url)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    rows = captured(state_path)
    assert replay(rows) == current(source_url)
    snapshot = [r for r in rows if r["_op"] == "snapshot"]
    assert len({r["_batch_id"] for r in snapshot}) == 1  # one snapshot, taken once
    by_id: dict[int, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (r["_batch_id"], r["_lsn"])):
        by_id.setdefault(r["id"], []).append(r)
    assert set(by_id) == set(current(source_url))
    for key, events in by_id.items():  # each row enters once, then each +1 once, in order
        assert events[0]["_op"] in ("snapshot", "insert"), key
        assert all(e["_op"] == "update" for e in events[1:]), key
        amounts = [e["amount"] for e in events]
        assert amounts == [amounts[0] + i for i in range(len(amounts))], key
    assert changes[0] > 20 and len(rows) > len(snapshot)  # the writer ran throughout
