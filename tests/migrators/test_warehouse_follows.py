"""Issue 38, step 2: the PostgreSQL target follows an evolved stream, in the transaction of
the first rows that need it.

Real PostgreSQL, a reader in another connection: it never sees a new column without its rows
(the catalog does not show it before COMMIT, and the table cannot be read meanwhile). A target
that cannot follow (a view, a column of another type the user made) is a terminal error and
nothing moves."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from migrators import StreamToPostgres
from migrators.errors import IncompatibleSchemaError
from migrators.table_to_postgres import copy_table_to_postgres
from sstore import Engine

V1 = {"id": "INTEGER", "amount": "DECIMAL(10,2)"}
V2 = {"id": "BIGINT", "amount": "DECIMAL(14,2)", "note": "VARCHAR"}


def pg(url: str, sql: str, *params: object) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as con:
        cur = con.execute(sql, params)
        return cur.fetchall() if cur.description else []


def layout(url: str, table: str = "orders") -> list[tuple]:
    return pg(url, "SELECT column_name, data_type, numeric_precision, numeric_scale FROM "
                   "information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
              table)


def v1_delivered(path: str, url: str, mode: str = "append") -> None:
    with Engine(path) as engine:
        engine.stream("orders", V1)
        sink = StreamToPostgres(engine, "orders", url, "orders", mode=mode,
                                key=("id",) if mode == "merge" else ())
        engine.ingest("orders", [(1, Decimal("1.50")), (2, Decimal("2.50"))])
        sink.run_once()
        sink.close()


@pytest.mark.parametrize("mode", ["append", "merge"])
def test_the_target_gains_and_widens_columns_with_the_first_rows(state_path: str, pg_url: str,
                                                                 mode: str) -> None:
    v1_delivered(state_path, pg_url, mode)
    assert layout(pg_url) == [("id", "integer", 32, 0), ("amount", "numeric", 10, 2)]
    seen: list[object] = []

    def reader(_con: psycopg.Connection) -> None:
        """Another connection, between the COPY and the COMMIT."""
        with psycopg.connect(pg_url, autocommit=True) as other:
            seen.append(other.execute(
                "SELECT count(*) FROM information_schema.columns WHERE table_name = 'orders' "
                "AND column_name = 'note'").fetchone())
            other.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute("SELECT * FROM orders")
            seen.append("locked")

    with Engine(state_path) as engine:
        engine.stream("orders", V2)
        sink = StreamToPostgres(engine, "orders", pg_url, "orders", mode=mode,
                                key=("id",) if mode == "merge" else (), before_commit=reader)
        sink.run_once()  # nothing new: the target is not touched
        assert layout(pg_url)[-1][0] == "amount" and seen == []
        engine.ingest("orders", [(2**40, Decimal("123456789012.25"), "big")])
        sink.run_once()
        sink.close()
    assert seen == [(0,), "locked"]
    assert layout(pg_url) == [("id", "bigint", 64, 0), ("amount", "numeric", 14, 2),
                              ("note", "text", None, None)]
    assert pg(pg_url, "SELECT id, amount, note FROM orders ORDER BY id") == [
        (1, Decimal("1.50"), None), (2, Decimal("2.50"), None),
        (2**40, Decimal("123456789012.25"), "big")]


def test_a_failed_delivery_takes_the_column_back_with_its_rows(state_path: str,
                                                               pg_url: str) -> None:
    v1_delivered(state_path, pg_url)

    def fail(_con: psycopg.Connection) -> None:
        raise IncompatibleSchemaError("made to fail before COMMIT")

    with Engine(state_path) as engine:
        engine.stream("orders", {**V1, "note": "VARCHAR"})
        engine.ingest("orders", [(3, Decimal("3.50"), "x")])
        sink = StreamToPostgres(engine, "orders", pg_url, "orders", before_commit=fail)
        with pytest.raises(IncompatibleSchemaError, match="made to fail"):
            sink.run_pending()
        assert [c[0] for c in layout(pg_url)] == ["id", "amount"]
        sink.close()
        sink = StreamToPostgres(engine, "orders", pg_url, "orders")
        sink.run_once()
        sink.close()
    assert pg(pg_url, "SELECT id, note FROM orders ORDER BY id") == [
        (1, None), (2, None), (3, "x")]


def test_sstore_migrate_follows_too(state_path: str, pg_url: str) -> None:
    v1_delivered(state_path, pg_url)
    with Engine(state_path) as engine:
        engine.stream("orders", V2)
        engine.ingest("orders", [(3, Decimal("3.25"), "cli")])
    done = subprocess.run([sys.executable, "-m", "sstore.cli", "migrate", state_path,
                           "--stream", "orders", "--postgres", pg_url, "--table", "orders"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert done.returncode == 0, done.stderr
    assert layout(pg_url)[0][:2] == ("id", "bigint")
    assert pg(pg_url, "SELECT id, note FROM orders ORDER BY id") == [
        (1, None), (2, None), (3, "cli")]


def test_a_table_copy_adds_the_column_its_source_gained(engine: Engine, pg_url: str) -> None:
    engine.execute("CREATE TABLE dim (k INTEGER, name VARCHAR)")
    engine.execute("INSERT INTO dim VALUES (1, 'a')")
    copy_table_to_postgres(engine, pg_url, "dim", "dim")
    engine.execute("ALTER TABLE dim ADD COLUMN since DATE")
    engine.execute("INSERT INTO dim VALUES (2, 'b', DATE '2026-11-29')")
    copy_table_to_postgres(engine, pg_url, "dim", "dim")
    assert [c[:2] for c in layout(pg_url, "dim")] == [
        ("k", "integer"), ("name", "text"), ("since", "date")]
    assert pg(pg_url, "SELECT k, since::text FROM dim ORDER BY k") == [
        (1, None), (2, "2026-11-29")]


def _watermarks(url: str) -> list[tuple]:
    if pg(url, "SELECT to_regclass('sstore.watermarks') IS NULL") == [(True,)]:
        return []
    return pg(url, "SELECT batch_id, rows_total FROM sstore.watermarks")


def _halted(state_path: str, pg_url: str, declared: dict, match: str, acked: int,
            rows_in: str, rows: int) -> None:
    """The evolved stream's sink halts with ``match``; nothing moved, nothing acknowledged."""
    before = _watermarks(pg_url)
    with Engine(state_path) as engine:
        engine.stream("orders", declared)
        engine.ingest("orders", [(3, Decimal("3.50"), 7)])
        sink = StreamToPostgres(engine, "orders", pg_url, "orders")
        with pytest.raises(IncompatibleSchemaError, match=match):
            sink.run_pending()
        assert engine.acknowledged(sink.consumer) == acked
    assert _watermarks(pg_url) == before
    assert pg(pg_url, f"SELECT count(*) FROM {rows_in}") == [(rows,)]


def test_a_view_target_cannot_follow_and_nothing_moves(state_path: str, pg_url: str) -> None:
    with Engine(state_path) as engine:
        engine.stream("orders", V1)
        engine.ingest("orders", [(1, Decimal("1.50")), (2, Decimal("2.50"))])
    pg(pg_url, "CREATE TABLE orders_rows (id integer, amount numeric(10,2))")
    pg(pg_url, "CREATE VIEW orders AS SELECT * FROM orders_rows")
    _halted(state_path, pg_url, {**V1, "note": "INTEGER"},
            r"target public.orders is a view and cannot follow stream 'orders', which needs: "
            r"add note integer. Nothing was written", 0, "orders_rows", 0)
    assert [c[0] for c in layout(pg_url)] == ["id", "amount"]


def test_a_column_of_another_type_the_user_made_is_refused(state_path: str,
                                                           pg_url: str) -> None:
    v1_delivered(state_path, pg_url)
    pg(pg_url, "ALTER TABLE orders ADD COLUMN note boolean")
    _halted(state_path, pg_url, {**V1, "note": "INTEGER"},
            r"column 'note' is boolean, which cannot take integer", 1, "orders", 2)


def test_a_narrower_column_the_user_made_is_not_widened(state_path: str, pg_url: str) -> None:
    """Only a column the stream widened follows: a BIGINT stream into an integer column the
    user made is refused as before (no evolution says the column was the stream's own)."""
    pg(pg_url, "CREATE TABLE orders (id integer, amount numeric(10,2))")
    with Engine(state_path) as engine:
        engine.stream("orders", {"id": "BIGINT", "amount": "DECIMAL(10,2)"})
        engine.ingest("orders", [(1, Decimal("1.50"))])
        sink = StreamToPostgres(engine, "orders", pg_url, "orders")
        with pytest.raises(IncompatibleSchemaError, match="'id' is integer, which cannot take "
                                                          "bigint"):
            sink.run_pending()
    assert layout(pg_url)[0][:2] == ("id", "integer")
