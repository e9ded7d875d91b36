"""Engine -> PostgreSQL: incremental, exactly once, append and merge, types, failures."""

from __future__ import annotations

import datetime as dt
import decimal
import threading
import time

import psycopg
import pyarrow as pa
import pytest

from migrators import (
    IncompatibleSchemaError,
    MigrationError,
    PostgresUnavailable,
    StreamToPostgres,
    UnsupportedTypeError,
    cast,
)
from migrators.postgres import RetryPolicy
from sstore import Engine

FAST_RETRY = RetryPolicy(attempts=4, first_delay=0.05, max_delay=0.2)


def trades_engine(path: str) -> Engine:
    eng = Engine(path)
    eng.stream("trades", {"id": "BIGINT", "status": "VARCHAR", "price": "DECIMAL(10,2)",
                          "qty": "INTEGER", "ok": "BOOLEAN", "day": "DATE",
                          "at": "TIMESTAMP", "at_tz": "TIMESTAMPTZ", "score": "DOUBLE"})
    return eng


def trade(i: int, status: str = "new") -> tuple:
    return (i, status, decimal.Decimal(i) / 4, i % 7, i % 2 == 0, dt.date(2024, 1, 1 + i % 28),
            dt.datetime(2024, 1, 1, 12, i % 60), dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
            i * 0.5)


def pg_rows(url: str, sql: str, *params: object) -> list[tuple]:
    with psycopg.connect(url) as con:
        return con.execute(sql, params).fetchall()


def test_append_moves_committed_batches_once(state_path: str, pg_url: str) -> None:
    eng = trades_engine(state_path)
    for b in range(5):
        eng.ingest("trades", [trade(b * 10 + i) for i in range(10)])
    report = cast(eng, pg_url, stream="trades", table="wh.trades", chunk_rows=25)
    assert (report.rows, report.batches, report.watermark) == (50, 5, 5)
    assert report.chunks == 3  # 20 + 20 + 10 rows: a chunk never splits a batch
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM wh.trades") == [(50, 50)]
    # nothing new: nothing moves; new batches: only they move
    assert cast(eng, pg_url, stream="trades", table="wh.trades").rows == 0
    eng.ingest("trades", [trade(100)])
    assert cast(eng, pg_url, stream="trades", table="wh.trades").rows == 1
    assert pg_rows(pg_url, "SELECT batch_id, rows_total FROM sstore.watermarks") == [(6, 51)]
    # types arrive exactly
    got = pg_rows(pg_url, "SELECT id, status, price, qty, ok, day, at, at_tz, score FROM "
                          "wh.trades WHERE id = 13")
    assert got == [trade(13)]
    types = dict(pg_rows(pg_url, "SELECT column_name, data_type FROM information_schema.columns "
                                 "WHERE table_name = 'trades'"))
    assert types == {"id": "bigint", "status": "text", "price": "numeric", "qty": "integer",
                     "ok": "boolean", "day": "date", "at": "timestamp without time zone",
                     "at_tz": "timestamp with time zone", "score": "double precision"}
    eng.close()


def test_migrated_batches_are_collected_only_after_acknowledgement(state_path: str,
                                                                   pg_url: str) -> None:
    eng = Engine(state_path, gc_every=1)
    eng.stream("raw", {"x": "INTEGER"})

    @eng.procedure(input="raw", output="doubled")
    def double(tx, batch):
        return tx.sql("SELECT x * 2 AS x FROM batch")

    migrator = StreamToPostgres(eng, "doubled", pg_url, "public.doubled")
    migrator.start()
    for x in range(4):
        eng.ingest("raw", [(x,)])
    eng.run_until_idle()
    eng.collect_garbage()
    # the migrator holds the stream: all four batches wait for it
    assert eng.query("SELECT count(*) FROM doubled").column(0)[0].as_py() == 4
    migrator.run_once()
    eng.collect_garbage()
    assert eng.query("SELECT count(*) FROM doubled").column(0)[0].as_py() == 0
    assert sorted(r[0] for r in pg_rows(pg_url, "SELECT x FROM doubled")) == [0, 2, 4, 6]
    eng.close()
    # the hold is in the state file: a restarted program keeps feeding the migrator
    eng = Engine(state_path, gc_every=1)
    eng.stream("raw", {"x": "INTEGER"})
    eng.procedure(input="raw", output="doubled")(double)
    eng.ingest("raw", [(10,)])
    eng.run_until_idle()
    eng.collect_garbage()
    assert eng.query("SELECT count(*) FROM doubled").column(0)[0].as_py() == 1
    assert StreamToPostgres(eng, "doubled", pg_url, "public.doubled").run_once().rows == 1
    eng.close()


def test_merge_updates_rows_by_key_last_change_wins(state_path: str, pg_url: str) -> None:
    eng = trades_engine(state_path)
    eng.ingest("trades", [trade(1, "new"), trade(2, "new")])
    eng.ingest("trades", [trade(1, "submitted")])
    eng.ingest("trades", [trade(1, "completed"), trade(3, "new")])
    report = cast(eng, pg_url, stream="trades", table="trades", mode="merge", key=["id"])
    assert report.rows == 3
    assert pg_rows(pg_url, "SELECT id, status FROM trades ORDER BY id") == [
        (1, "completed"), (2, "new"), (3, "new")]
    eng.ingest("trades", [trade(2, "canceled")])
    cast(eng, pg_url, stream="trades", table="trades", mode="merge", key=["id"], chunk_rows=1)
    assert pg_rows(pg_url, "SELECT id, status FROM trades ORDER BY id") == [
        (1, "completed"), (2, "canceled"), (3, "new")]
    eng.close()


def test_existing_target_with_incompatible_column_is_named(state_path: str, pg_url: str) -> None:
    eng = trades_engine(state_path)
    eng.ingest("trades", [trade(1)])
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE t1 (id BIGINT, status TEXT, price NUMERIC, qty INTEGER, "
                    "ok BOOLEAN, day DATE, at TIMESTAMP, at_tz TIMESTAMPTZ, score INTEGER)")
        con.execute("CREATE TABLE t2 (id BIGINT)")
    with pytest.raises(IncompatibleSchemaError, match="column 'score' is integer"):
        cast(eng, pg_url, stream="trades", table="t1")
    with pytest.raises(IncompatibleSchemaError, match="no column 'status'"):
        cast(eng, pg_url, stream="trades", table="t2")
    eng.close()


def test_unsupported_type_is_rejected_clearly(engine: Engine, pg_url: str) -> None:
    engine.stream("lists", {"xs": "INTEGER[]"})
    engine.ingest("lists", [([1, 2],)])
    with pytest.raises(UnsupportedTypeError, match="column 'xs'"):
        cast(engine, pg_url, stream="lists", table="lists")


def test_unreachable_postgres_is_retried_then_reported(engine: Engine) -> None:
    engine.stream("s", {"x": "INTEGER"})
    engine.ingest("s", [(1,)])
    policy = RetryPolicy(attempts=3, first_delay=0.01, max_delay=0.02)
    migrator = StreamToPostgres(engine, "s", "postgresql://postgres@127.0.0.1:1/nope", "s",
                                retry=policy)
    with pytest.raises(PostgresUnavailable, match="gave up after 3 attempts"):
        migrator.run_once()
    assert policy.retries_done == 2
    assert engine.query("SELECT count(*) FROM s").column(0)[0].as_py() == 1  # nothing lost


def test_connection_killed_before_commit_loses_and_duplicates_nothing(state_path: str,
                                                                      pg_url: str) -> None:
    eng = trades_engine(state_path)
    for b in range(6):
        eng.ingest("trades", [trade(b * 100 + i) for i in range(100)])
    kills = {"left": 2}

    def kill_own_backend(con: psycopg.Connection) -> None:
        if kills["left"]:
            kills["left"] -= 1
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (con.info.backend_pid,))

    migrator = StreamToPostgres(eng, "trades", pg_url, "trades", chunk_rows=150,
                                retry=FAST_RETRY, before_commit=kill_own_backend)
    report = migrator.run_once()
    assert report.retries == 2 and report.rows == 600
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM trades") == [(600, 600)]
    eng.close()


def test_connection_killed_mid_copy(state_path: str, pg_url: str) -> None:
    eng = Engine(state_path)
    eng.stream("wide", {"id": "BIGINT", "pad": "VARCHAR"})
    eng.ingest("wide", pa.table({"id": pa.array(range(400_000), pa.int64()),
                                 "pad": pa.array(["x" * 40] * 400_000)}))
    stop = threading.Event()
    killed: list[int] = []

    def killer() -> None:  # terminate whichever backend is running the COPY, once
        with psycopg.connect(pg_url, autocommit=True) as admin:
            while not stop.is_set() and not killed:
                rows = admin.execute("SELECT pid FROM pg_stat_activity WHERE query LIKE "
                                     "'COPY%%' AND state = 'active' AND pid <> "
                                     "pg_backend_pid()").fetchall()
                for (pid,) in rows:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    killed.append(pid)
                stop.wait(0.005)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        report = StreamToPostgres(eng, "wide", pg_url, "wide", retry=FAST_RETRY).run_once()
    finally:
        stop.set()
        thread.join()
    assert killed, "the COPY finished before it could be killed; make the batch bigger"
    # the kill usually lands in the COPY (then report.retries >= 1); when PostgreSQL processes
    # it only after the transaction ended, nothing needed a retry: either way exactly once
    assert report.retries <= FAST_RETRY.attempts
    assert pg_rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM wide") == [(400_000, 400_000)]
    eng.close()


def test_watermark_decides_after_a_crash_between_commit_and_acknowledgement(
        state_path: str, pg_url: str) -> None:
    eng = trades_engine(state_path)
    eng.ingest("trades", [trade(1)])
    eng.ingest("trades", [trade(2)])

    def crash_after_commit(con: psycopg.Connection) -> None:
        con.commit()
        raise KeyboardInterrupt  # "the process died" right after PostgreSQL committed

    migrator = StreamToPostgres(eng, "trades", pg_url, "trades", before_commit=crash_after_commit)
    with pytest.raises(KeyboardInterrupt):
        migrator.run_once()
    assert eng.acknowledged(migrator.consumer) == 0  # the engine never heard back
    report = StreamToPostgres(eng, "trades", pg_url, "trades").run_once()
    assert report.rows == 0 and eng.acknowledged(migrator.consumer) == 2
    assert pg_rows(pg_url, "SELECT count(*) FROM trades") == [(2,)]
    eng.close()


def test_continuous_sink_feeds_postgres_as_batches_commit(state_path: str, pg_url: str) -> None:
    eng = Engine(state_path)
    eng.stream("raw", {"x": "INTEGER"})

    @eng.procedure(input="raw", output="clean")
    def keep_positive(tx, batch):
        return tx.sql("SELECT x FROM batch WHERE x > 0")

    sink = StreamToPostgres(eng, "clean", pg_url, "clean")
    sink.attach()
    eng.ingest("raw", [(1,), (-1,)])
    eng.run_until_idle()
    assert sink.flush(timeout=30)
    assert pg_rows(pg_url, "SELECT x FROM clean") == [(1,)]
    eng.ingest("raw", [(2,)])
    eng.run_until_idle()
    assert sink.flush(timeout=30)
    assert sorted(pg_rows(pg_url, "SELECT x FROM clean")) == [(1,), (2,)]
    sink.detach()
    eng.close()


def test_sink_survives_postgres_going_away(state_path: str, pg_url: str) -> None:
    eng = Engine(state_path)
    eng.stream("raw", {"x": "INTEGER"})
    sink = StreamToPostgres(eng, "raw", pg_url, "raw_copy",
                            retry=RetryPolicy(attempts=2, first_delay=0.01, max_delay=0.05))
    sink.attach()
    eng.ingest("raw", [(1,)])
    assert sink.flush(timeout=30)
    sink.url = "postgresql://postgres@127.0.0.1:1/gone"  # PostgreSQL "goes away"
    sink.session.close()
    sink.session.url = sink.url
    eng.ingest("raw", [(2,)])
    deadline = time.monotonic() + 10
    while sink.last_error is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sink.last_error and "gave up" in sink.last_error
    assert eng.query("SELECT count(*) FROM raw WHERE x = 2").column(0)[0].as_py() == 1  # kept
    sink.session.url = sink.url = pg_url  # ... and comes back
    assert sink.flush(timeout=30)
    assert sorted(pg_rows(pg_url, "SELECT x FROM raw_copy")) == [(1,), (2,)]
    sink.detach()
    eng.close()


def test_unknown_pairs_and_streams_are_errors(engine: Engine, pg_url: str) -> None:
    with pytest.raises(MigrationError, match="cannot cast"):
        cast(engine, 42)
    with pytest.raises(MigrationError, match="no migrator from postgres to postgres"):
        cast(pg_url, pg_url)
    engine.stream("s", {"x": "INTEGER"})
    with pytest.raises(MigrationError, match="no stream 'nope'"):
        cast(engine, pg_url, stream="nope", table="t")


def test_engine_table_full_and_incremental_copies(engine: Engine, pg_url: str) -> None:
    engine.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner VARCHAR, "
                   "changed BIGINT)")
    engine.execute("INSERT INTO accounts SELECT i, 'o' || i, i FROM range(1, 101) t(i)")
    with pytest.raises(IncompatibleSchemaError, match="needs a primary key"):
        cast(engine, pg_url, source="accounts", table="nokey")  # created without a key ...
        cast(engine, pg_url, source="accounts", table="nokey", mode="merge", key=["id"])
    assert cast(engine, pg_url, source="accounts", table="dw.accounts", key=["id"]) == 100
    assert cast(engine, pg_url, source="accounts", table="dw.accounts") == 100  # replace
    assert pg_rows(pg_url, "SELECT count(*) FROM dw.accounts") == [(100,)]
    engine.execute("UPDATE accounts SET owner = 'new', changed = 500 WHERE id = 7")
    engine.execute("INSERT INTO accounts VALUES (101, 'o101', 501)")
    sent = cast(engine, pg_url, source="accounts", table="dw.accounts", mode="merge",
                key=["id"], since="changed")
    assert sent == 3  # the two changed rows and id 100, at the newest value copied before
    assert pg_rows(pg_url, "SELECT count(*), max(changed) FROM dw.accounts") == [(101, 501)]
    assert pg_rows(pg_url, "SELECT owner FROM dw.accounts WHERE id = 7") == [("new",)]
    assert cast(engine, pg_url, source="accounts", table="dw.accounts", mode="merge",
                key=["id"], since="changed") == 1  # only the boundary row, merged again
