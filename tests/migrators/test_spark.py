"""Spark cast operators against a real local Spark, a real PostgreSQL and real engine files.

One SparkSession serves the whole module: starting Spark takes ~15 s.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import duckdb
import psycopg
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from migrators import spark_session
from migrators.errors import (
    IncompatibleSchemaError,
    MigrationError,
    PostgresUnavailable,
    UnsupportedTypeError,
)
from migrators.spark import (
    arrow_to_spark,
    dataframe_to_engine,
    dataframe_to_postgres,
    engine_to_dataframe,
    postgres_to_dataframe,
)
from migrators.spark_session import SparkSetupError, get_spark, is_running, jdbc_jar
from sstore import Engine
from sstore.base.errors import DeclarationError, TerminalError, TransientError
from sstore.base.retry import RetryPolicy

ROOT = Path(__file__).resolve().parents[2]
UTC = dt.UTC

FACTS_DDL = """CREATE TABLE facts (id INTEGER PRIMARY KEY, big BIGINT, amount DECIMAL(18,4),
    ratio DOUBLE, name VARCHAR, flag BOOLEAN, day DATE, ts TIMESTAMP, ts_tz TIMESTAMPTZ)"""
FACTS = [
    (1, 9_007_199_254_740_993, Decimal("-12345678901234.5678"), 0.1, "plain", True,
     dt.date(2024, 2, 29), dt.datetime(2024, 2, 29, 23, 59, 59, 999_999),
     dt.datetime(2024, 6, 1, 10, 0, 0, 123_456, tzinfo=UTC)),
    (2, -1, Decimal("0.0001"), -1.5e300, "quote ' \" and ünïcødé ✓", False,
     dt.date(1, 1, 1), dt.datetime(1969, 12, 31, 23, 59, 59, 1),
     dt.datetime(1900, 1, 1, tzinfo=UTC)),
    (3, 0, Decimal("0"), 0.0, "", True, dt.date(1970, 1, 1), dt.datetime(1970, 1, 1),
     dt.datetime(2038, 1, 19, 3, 14, 8, tzinfo=UTC)),
    (4, None, None, None, None, None, None, None, None),
]


def rows(engine: Engine, sql: str) -> list[tuple]:
    return [tuple(r.values()) for r in engine.query(sql).to_pylist()]


def column_types(engine: Engine, table: str) -> list[tuple[str, str]]:
    return [(r["column_name"], r["column_type"])
            for r in engine.query(f"DESCRIBE {table}").to_pylist()]


def pg(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url) as con:
        cur = con.execute(sql)
        return cur.fetchall() if cur.description else []


# ------------------------------------------------------------------------------ round trips
def test_round_trip_engine_spark_postgres_spark_engine(spark: SparkSession, engine: Engine,
                                                       pg_url: str) -> None:
    engine.execute(FACTS_DDL)
    with engine.transaction() as tx:
        for row in FACTS:
            tx.execute("INSERT INTO facts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", *row)
    pg(pg_url, "CREATE SCHEMA warehouse")

    df = engine_to_dataframe(engine, "facts", spark)
    assert dict(df.dtypes) == {"id": "int", "big": "bigint", "amount": "decimal(18,4)",
                               "ratio": "double", "name": "string", "flag": "boolean",
                               "day": "date", "ts": "timestamp_ntz", "ts_tz": "timestamp"}
    assert dataframe_to_postgres(df, pg_url, "warehouse.facts") == 4

    # PostgreSQL holds the same values with the same meaning, checked without Spark
    assert pg(pg_url, "SELECT column_name, data_type, numeric_precision, numeric_scale "
                      "FROM information_schema.columns WHERE table_schema = 'warehouse' "
                      "ORDER BY ordinal_position") == [
        ("id", "integer", 32, 0), ("big", "bigint", 64, 0), ("amount", "numeric", 18, 4),
        ("ratio", "double precision", 53, None), ("name", "text", None, None),
        ("flag", "boolean", None, None), ("day", "date", None, None),
        ("ts", "timestamp without time zone", None, None),
        ("ts_tz", "timestamp with time zone", None, None)]
    assert pg(pg_url, "SELECT * FROM warehouse.facts ORDER BY id") == FACTS

    back = postgres_to_dataframe(pg_url, "warehouse.facts", spark=spark)
    assert dict(back.dtypes) == dict(df.dtypes)
    assert dataframe_to_engine(back, engine, "facts_back") == 4
    assert rows(engine, "SELECT * FROM facts_back ORDER BY id") == FACTS
    assert column_types(engine, "facts_back") == column_types(engine, "facts")


def test_engine_query_with_parameters_and_widened_types(spark: SparkSession,
                                                        engine: Engine) -> None:
    df = engine_to_dataframe(engine, "SELECT 200::UTINYINT AS u8, 4000000000::UINTEGER AS u32, "
                                     "18446744073709551615::UBIGINT AS u64, ?::INTEGER AS p",
                             spark, params=[7])
    assert dict(df.dtypes) == {"u8": "smallint", "u32": "bigint", "u64": "decimal(20,0)",
                               "p": "int"}
    assert [tuple(r) for r in df.collect()] == [(200, 4_000_000_000,
                                                Decimal(18_446_744_073_709_551_615), 7)]
    with pytest.raises(UnsupportedTypeError, match="'iv'"):
        engine_to_dataframe(engine, "SELECT INTERVAL 1 DAY AS iv", spark)
    for value in ("'12:00:00+05:30'::TIMETZ", "'0101'::BIT"):  # Arrow hides what they are
        with pytest.raises(UnsupportedTypeError, match="column 'v' is .*: Arrow carries"):
            engine_to_dataframe(engine, f"SELECT {value} AS v, ?::INTEGER AS p", spark,
                                params=[7])


def test_arrow_rows_enter_spark_through_one_function(spark: SparkSession) -> None:
    """``arrow_to_spark`` (the polystore's Spark views, the TPC-DI events): unsigned integers
    widened, naive timestamps stay naive, the Arrow field's nullability kept; an empty table
    gives an empty DataFrame of the same types."""
    schema = pa.schema([pa.field("id", pa.uint32(), nullable=False), ("at", pa.timestamp("us")),
                        ("name", pa.string())])
    table = pa.table({"id": [1, 4_000_000_000], "at": [dt.datetime(2024, 2, 29, 23, 59), None],
                      "name": ["a", None]}, schema=schema)
    df = arrow_to_spark(spark, table)
    assert dict(df.dtypes) == {"id": "bigint", "at": "timestamp_ntz", "name": "string"}
    assert [f.nullable for f in df.schema.fields] == [False, True, True]
    assert [tuple(r) for r in df.orderBy("id").collect()] == [
        (1, dt.datetime(2024, 2, 29, 23, 59), "a"), (4_000_000_000, None, None)]
    empty = arrow_to_spark(spark, schema.empty_table())
    assert empty.dtypes == df.dtypes and empty.count() == 0
    with pytest.raises(UnsupportedTypeError, match="'span'"):
        arrow_to_spark(spark, pa.table({"span": pa.array([pa.MonthDayNano([1, 2, 3])],
                                                         pa.month_day_nano_interval())}))


# ------------------------------------------------------------------------------ partitioned read
def test_partitioned_parallel_read(spark: SparkSession, pg_url: str) -> None:
    pg(pg_url, "CREATE TABLE events (id BIGINT, day DATE, v DOUBLE PRECISION)")
    pg(pg_url, "INSERT INTO events SELECT i, DATE '2024-01-01' + (i % 90), i / 4.0 "
               "FROM generate_series(1, 1000) i")

    # bounds read from the table first
    df = postgres_to_dataframe(pg_url, "events", partition_column="id", num_partitions=4,
                               spark=spark)
    assert df.rdd.getNumPartitions() == 4
    sizes = [r["count"] for r in df.groupBy(F.spark_partition_id()).count().collect()]
    assert len(sizes) == 4 and sum(sizes) == 1000 and min(sizes) > 200  # Spark's stride: ~250
    assert sorted(r.id for r in df.select("id").collect()) == list(range(1, 1001))

    # explicit bounds narrower than the data: the edges still hold every row
    df = postgres_to_dataframe(pg_url, "events", partition_column="id", lower_bound=300,
                               upper_bound=700, num_partitions=2, spark=spark)
    assert df.rdd.getNumPartitions() == 2 and df.count() == 1000

    # a query, partitioned by a date column
    df = postgres_to_dataframe(pg_url, query="SELECT id, day FROM events WHERE id <= 100;",
                               partition_column="day", num_partitions=3, spark=spark)
    assert df.rdd.getNumPartitions() == 3
    assert sorted(r.id for r in df.collect()) == list(range(1, 101))

    # an empty table reads as one partition and no rows
    pg(pg_url, "CREATE TABLE nothing (id INTEGER)")
    df = postgres_to_dataframe(pg_url, "nothing", partition_column="id", num_partitions=4,
                               spark=spark)
    assert df.rdd.getNumPartitions() == 1 and df.count() == 0


# ------------------------------------------------------------------------------ write modes
def test_postgres_overwrite_keeps_the_table_append_adds(spark: SparkSession,
                                                        pg_url: str) -> None:
    pg(pg_url, 'CREATE TABLE "Dim" (id INTEGER PRIMARY KEY, name TEXT NOT NULL)')

    def frame(*ids: int):
        return spark.createDataFrame([(i, f"n{i}") for i in ids], "id int, name string")

    assert dataframe_to_postgres(frame(1, 2), pg_url, "Dim") == 2
    assert dataframe_to_postgres(frame(3), pg_url, "public.Dim", mode="append") == 1
    assert pg(pg_url, 'SELECT id, name FROM "Dim" ORDER BY id') == [(1, "n1"), (2, "n2"),
                                                                    (3, "n3")]
    assert dataframe_to_postgres(frame(10, 11), pg_url, "Dim", mode="overwrite") == 2
    assert pg(pg_url, 'SELECT id, name FROM "Dim" ORDER BY id') == [(10, "n10"), (11, "n11")]
    # overwrite truncated instead of dropping: the primary key is still there
    # (PostgreSQL 18 also lists NOT NULL constraints there: only the key is asked for)
    assert pg(pg_url, "SELECT contype FROM pg_constraint WHERE conrelid = '\"Dim\"'::regclass "
                      "AND contype = 'p'") == [("p",)]
    with pytest.raises(MigrationError, match="duplicate key"):
        dataframe_to_postgres(frame(10), pg_url, "Dim")

    # append into a missing table creates it; an empty DataFrame writes 0 rows
    assert dataframe_to_postgres(frame(5), pg_url, "fresh") == 1
    assert dataframe_to_postgres(frame(), pg_url, "fresh") == 0
    assert pg(pg_url, "SELECT * FROM fresh") == [(5, "n5")]


def test_engine_replace_keeps_the_declaration_append_adds(spark: SparkSession,
                                                          engine: Engine) -> None:
    engine.stream("clicks", {"id": "INTEGER"})
    engine.execute("CREATE TABLE dim (id INTEGER PRIMARY KEY, name VARCHAR)")

    def frame(*ids: int):
        return spark.createDataFrame([(i, f"n{i}") for i in ids], "id int, name string")

    assert dataframe_to_engine(frame(1, 2), engine, "dim") == 2
    assert dataframe_to_engine(frame(3), engine, "dim", mode="append") == 1
    assert rows(engine, "SELECT * FROM dim ORDER BY id") == [(1, "n1"), (2, "n2"), (3, "n3")]
    assert dataframe_to_engine(frame(7), engine, "dim", mode="replace") == 1
    assert rows(engine, "SELECT * FROM dim") == [(7, "n7")]
    # the primary key survived the replace, and a failed copy changes nothing
    with pytest.raises(duckdb.ConstraintException, match="(?i)duplicate key"):
        dataframe_to_engine(frame(8, 7), engine, "dim")
    assert rows(engine, "SELECT * FROM dim") == [(7, "n7")]
    # a missing table is created; streams only take ingest
    assert dataframe_to_engine(frame(4), engine, "new_dim", mode="replace") == 1
    assert rows(engine, "SELECT * FROM new_dim") == [(4, "n4")]
    with pytest.raises(DeclarationError, match="ingest"):
        dataframe_to_engine(frame(1), engine, "clicks")


# ------------------------------------------------------------------------------ errors
def test_jdbc_failures_are_transient_or_terminal(spark: SparkSession, pg_url: str) -> None:
    # two tries (one retry), not the default 4 (3.5 s of waiting for nothing)
    with pytest.raises(PostgresUnavailable, match="Connection refused") as unreachable:
        postgres_to_dataframe("postgresql://postgres@127.0.0.1:1/x", "t", spark=spark,
                              retry=RetryPolicy(attempts=2))
    assert isinstance(unreachable.value, TransientError)
    assert "gave up after 2 attempts" in str(unreachable.value)
    with pytest.raises(MigrationError, match='relation "missing" does not exist') as missing:
        postgres_to_dataframe(pg_url, "missing", spark=spark)
    assert isinstance(missing.value, TerminalError)


def test_missing_jar_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bad = str(tmp_path / "nowhere" / "postgresql.jar")
    with pytest.raises(SparkSetupError) as err:
        jdbc_jar({"SSTORE_JDBC_JAR": bad})
    assert bad in str(err.value) and "/usr/share/java/postgresql.jar" in str(err.value)
    assert isinstance(err.value, TerminalError)

    monkeypatch.setattr(spark_session, "DEFAULT_JDBC_JAR", bad)
    with pytest.raises(SparkSetupError, match="SSTORE_JDBC_JAR is not set") as err:
        jdbc_jar({})
    assert bad in str(err.value)

    # the real entry point, in a fresh process: fails before any JVM starts
    env = {**os.environ, "SSTORE_JDBC_JAR": bad}
    proc = subprocess.run([sys.executable, "-c", "from migrators.spark_session import "
                           "get_spark; get_spark('local[1]')"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "SparkSetupError" in proc.stderr and bad in proc.stderr
    assert "libpostgresql-jdbc-java" in proc.stderr


def test_one_session_per_process(spark: SparkSession) -> None:
    assert get_spark() is spark
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    with pytest.raises(SparkSetupError, match="stop_spark"):
        get_spark("local[1]")


def test_is_running_asks_without_starting_spark(spark: SparkSession) -> None:
    """The planner and the calibration ask ``is_running`` to price Spark's start-up; asking
    must not start a JVM."""
    assert is_running()
    proc = subprocess.run([sys.executable, "-c", (
        "from migrators.spark_session import is_running\n"
        "from pyspark import SparkContext\n"
        "print(is_running(), SparkContext._active_spark_context is None)")],
        cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]


def test_cast_finds_the_spark_migrators(spark: SparkSession, engine: Engine, pg_url: str) -> None:
    from migrators import cast

    engine.execute("CREATE TABLE src (id INTEGER, name VARCHAR)")
    engine.execute("INSERT INTO src VALUES (1, 'a'), (2, 'b')")
    df = cast(engine, spark, sql_or_table="src")                    # engine -> Spark
    assert cast(df, pg_url, table="public.src_copy") == 2            # Spark -> PostgreSQL
    back = cast(pg_url, spark, table="public.src_copy")              # PostgreSQL -> Spark
    assert cast(back, engine, table="src_back") == 2                 # Spark -> engine
    assert rows(engine, "SELECT id, name FROM src_back ORDER BY id") == [(1, "a"), (2, "b")]


# ------------------------------------------------------------------ targets that would round
def test_postgres_target_that_would_round_is_refused_before_a_row(spark: SparkSession,
                                                                  pg_url: str) -> None:
    """The rule of every other writer: a timestamp(0) column or a column of another type is
    refused up front; a numeric of a smaller scale takes values that fit and fails the job at
    the first value it would round, never landing it rounded."""
    pg(pg_url, "CREATE TABLE stamps (id INTEGER, at TIMESTAMP(0))")
    stamps = spark.createDataFrame([(1, dt.datetime(2024, 12, 31, 23, 59, 59, 600_000))],
                                   "id int, at timestamp_ntz")
    with pytest.raises(IncompatibleSchemaError, match="timestamp"):
        dataframe_to_postgres(stamps, pg_url, "stamps")
    pg(pg_url, "CREATE TABLE texts (id INTEGER, v INTEGER)")
    with pytest.raises(IncompatibleSchemaError, match="cannot take text"):
        dataframe_to_postgres(spark.createDataFrame([(1, "x")], "id int, v string"), pg_url,
                              "texts")
    assert pg(pg_url, "SELECT count(*) FROM stamps") == [(0,)]

    pg(pg_url, "CREATE TABLE prices (id INTEGER, price NUMERIC(10, 1))")
    fits = spark.createDataFrame([(1, Decimal("1.50")), (2, Decimal("2.00"))],
                                 "id int, price decimal(10,2)")
    assert dataframe_to_postgres(fits, pg_url, "prices") == 2
    rounds = spark.createDataFrame([(3, Decimal("1.55"))], "id int, price decimal(10,2)")
    with pytest.raises(MigrationError, match="round"):
        dataframe_to_postgres(rounds.coalesce(1), pg_url, "prices")
    assert pg(pg_url, "SELECT id, price FROM prices ORDER BY id") == [
        (1, Decimal("1.5")), (2, Decimal("2.0"))]
