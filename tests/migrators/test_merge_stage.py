"""``merge_rows``' staging table is kept per session: it must never carry rows from one merge
into another, and must not make a new catalog entry per merge."""

from __future__ import annotations

import psycopg
import pyarrow as pa
import pytest

from migrators.errors import MigrationError
from migrators.postgres import merge_rows


def rows(ids: list[int], text: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{text}{i}" for i in ids]})


@pytest.fixture
def con(pg_url: str):
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE a (id BIGINT PRIMARY KEY, v TEXT)")
        con.execute("CREATE TABLE b (id BIGINT PRIMARY KEY, v VARCHAR(20), extra INT DEFAULT 7)")
        con.commit()
        yield con


def contents(con: psycopg.Connection, table: str) -> list[tuple]:
    return con.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()


def test_two_merges_in_one_transaction_take_only_their_own_rows(con: psycopg.Connection) -> None:
    with con.cursor() as cur:
        merge_rows(cur, "public.a", rows([1, 2], "a"), ["id"])
        merge_rows(cur, "public.b", rows([3], "b"), ["id"])  # the same shape: the same stage
        merge_rows(cur, "public.a", rows([2], "again"), ["id"])
    con.commit()
    assert contents(con, "a") == [(1, "a1"), (2, "again2")]
    assert contents(con, "b") == [(3, "b3", 7)]  # columns the rows lack get the defaults


def test_the_stage_is_made_once_and_a_failed_merge_leaves_nothing_in_it(
        con: psycopg.Connection) -> None:
    def stages() -> list[tuple]:
        return con.execute("SELECT oid FROM pg_class WHERE relname LIKE 'sstore_stage_%' AND "
                           "relpersistence = 't'").fetchall()

    with con.cursor() as cur:
        merge_rows(cur, "public.a", rows([1], "a"), ["id"])
    con.commit()
    first = stages()
    assert len(first) == 1
    with pytest.raises(MigrationError, match="two rows have one key"), con.cursor() as cur:
        merge_rows(cur, "public.a", rows([5, 5], "dup"), ["id"])  # a key twice: refused
    con.rollback()
    with con.cursor() as cur:
        merge_rows(cur, "public.a", rows([6], "a"), ["id"])
    con.commit()
    assert stages() == first  # kept, not made again
    assert contents(con, "a") == [(1, "a1"), (6, "a6")]  # nothing of the failed merge


def test_a_target_widened_after_the_stage_was_made(con: psycopg.Connection) -> None:
    wide = pa.table({"id": pa.array([1], pa.int64()), "v": ["x" * 30]})
    with con.cursor() as cur:
        merge_rows(cur, "public.b", rows([1], "b"), ["id"])
    con.commit()
    with pytest.raises(psycopg.errors.StringDataRightTruncation), con.cursor() as cur:
        merge_rows(cur, "public.b", wide, ["id"])  # VARCHAR(20) refuses 30 characters
    con.rollback()
    con.execute("ALTER TABLE b ALTER COLUMN v TYPE VARCHAR(40)")
    con.commit()
    with con.cursor() as cur:
        merge_rows(cur, "public.b", wide, ["id"])
    con.commit()
    assert contents(con, "b") == [(1, "x" * 30, 7)]


def test_a_merge_outside_a_transaction_is_refused_not_lost(pg_url: str) -> None:
    """On a connection in autocommit mode each statement commits alone: the COPY would fill
    the stage and commit, ``ON COMMIT DELETE ROWS`` would empty it, and the INSERT would move
    nothing. Refused with a message before any row is staged; with BEGIN sent it merges."""
    from sstore.base.errors import DeclarationError

    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("CREATE TABLE a (id BIGINT PRIMARY KEY, v TEXT)")
        with pytest.raises(DeclarationError, match="needs an open transaction"), \
                con.cursor() as cur:
            merge_rows(cur, "public.a", rows([1, 2], "a"), ["id"])
        assert contents(con, "a") == []
        con.execute("BEGIN")
        with con.cursor() as cur:
            merge_rows(cur, "public.a", rows([1, 2], "a"), ["id"])
        con.execute("COMMIT")
        assert contents(con, "a") == [(1, "a1"), (2, "a2")]
