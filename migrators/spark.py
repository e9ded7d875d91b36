"""Cast operators for Spark: DataFrames to and from PostgreSQL (JDBC) and the engine (Arrow).

Spark is the bulk engine of the polystore: PostgreSQL is reached over JDBC, partition by
partition; the engine's DuckDB state crosses as one Arrow table through the driver (the engine
is a single process, so there is nothing to parallelise on its side).

Types keep their meaning on every hop; in particular a timestamp without time zone stays one
(``TimestampNTZType`` in Spark, ``preferTimestampNTZ`` on JDBC reads) instead of becoming an
instant interpreted in some session's zone.

| DuckDB | Arrow | Spark | PostgreSQL (created by Spark) |
| --- | --- | --- | --- |
| BOOLEAN | bool | boolean | boolean |
| TINYINT / SMALLINT | int8 / int16 | byte / short | smallint (read back: short) |
| INTEGER / BIGINT | int32 / int64 | int / long | integer / bigint |
| UTINYINT, USMALLINT, UINTEGER | uint8/16/32 | short, int, long (widened) | as Spark's |
| UBIGINT | uint64 | decimal(20,0) (widened) | numeric(20,0) |
| DECIMAL(p,s) | decimal128(p,s) | decimal(p,s) | numeric(p,s) |
| FLOAT / DOUBLE | float32 / float64 | float / double | real / double precision |
| VARCHAR | string | string | text |
| BLOB | binary | binary | bytea |
| DATE | date32 | date | date |
| TIMESTAMP | timestamp[us] | timestamp_ntz | timestamp |
| TIMESTAMPTZ | timestamp[us, tz] | timestamp (UTC session) | timestamptz |

Values are never formatted into SQL: identifiers are quoted
(``sstore.base.sql.ident``/``qualified``),
and PostgreSQL ``numeric`` without a precision reads back as Spark's ``decimal(38,18)``.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import math
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar

import duckdb
import pyarrow as pa

from sstore.base.extras import needs

with needs("spark"):
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException
    from pyspark.sql import DataFrame, DataFrameReader, Observation, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type, to_arrow_schema
    from pyspark.sql.types import StructField, StructType

from migrators import reader as reader_role
from migrators.errors import (
    IncompatibleSchemaError,
    MigrationError,
    PostgresUnavailable,
    UnsupportedTypeError,
)
from migrators.pg_errors import classify_sqlstate
from migrators.postgres import connect, target_columns
from migrators.spark_session import get_spark
from migrators.typemap import check_compatible, check_duckdb_types
from migrators.urls import PgUrl, parse
from sstore.base import retry
from sstore.base.errors import DeclarationError, SchemaError
from sstore.base.retry import Kind, RetryPolicy
from sstore.base.rows import conform_columns
from sstore.base.sql import ident, qualified
from sstore.engine import Engine

Bound = int | float | decimal.Decimal | datetime.date | datetime.datetime | str

JDBC_BATCH_SIZE = 10_000   # rows per INSERT batch (rewritten into multi-row INSERTs)
JDBC_FETCH_SIZE = 10_000   # rows per round trip on reads (PostgreSQL otherwise fetches all)
#: Reads whose connection fails transiently are tried this often (a Spark JDBC connect is
#: slow, so a few attempts cover a restarting server without hiding one that is down).
JDBC_READ_ATTEMPTS = 4

# Arrow types DuckDB produces that Spark has no type for, and the lossless type to send instead.
_FOR_SPARK = {
    pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64(),
    pa.uint64(): pa.decimal128(20, 0), pa.string_view(): pa.string(),
    pa.binary_view(): pa.binary(),
}

_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*){0,2}")


# ---------------------------------------------------------------------------------- PostgreSQL
def dataframe_to_postgres(df: DataFrame, url: str, table: str,
                          mode: Literal["append", "overwrite"] = "append",
                          batch_size: int = JDBC_BATCH_SIZE) -> int:
    """Write ``df`` into the PostgreSQL table ``table`` (``schema.table`` allowed); return the
    number of rows written.

    ``append`` adds rows; a missing table is created by Spark from ``df``'s schema (see the
    module's type table). ``overwrite`` empties an existing table with TRUNCATE and refills it,
    so the table keeps its DDL (keys, indexes, grants, the exact types of ``schemas/``), where
    Spark's plain overwrite would drop it and re-create it from Spark's types.

    Each Spark partition writes in its own transaction: a failure part-way leaves the
    partitions that had committed (and, for ``overwrite``, the table already emptied). Callers
    that need all-or-nothing write into a staging table and swap it in PostgreSQL. The row count
    is observed during the write itself, so ``df`` is computed once.
    """
    if mode not in ("append", "overwrite"):
        raise ValueError(f"mode must be 'append' or 'overwrite', got {mode!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    pg = parse(url)
    df = _check_target(df, url, table)
    observation = Observation(f"sstore_rows_{uuid.uuid4().hex}")
    observed = df.observe(observation, F.count(F.lit(1)).alias("rows"))
    writer = (observed.write.format("jdbc").mode(mode)
              .option("url", pg.jdbc)
              .option("dbtable", qualified(table))
              .option("batchsize", batch_size)
              .option("truncate", "true")
              .options(**_connection_properties(pg)))
    with _jdbc_errors(f"write table {table!r}", pg):
        writer.save()
    return int(observation.get.get("rows", 0))


def _check_target(df: DataFrame, url: str, table: str) -> DataFrame:
    """Refuse, before Spark writes a row, a target that exists and cannot hold ``df``'s values
    exactly: the same rule (``typemap.check_compatible``) as every other writer into PostgreSQL.
    Without it a ``timestamp(0)`` column took Spark's timestamps rounded by PostgreSQL, and a
    column of another type failed half-way, after some partitions had committed. A missing
    table is Spark's to create (from the module's type table).

    A ``numeric`` column of a smaller scale than a decimal column of ``df`` takes the values
    that have no more digits than it keeps and rounds the others without an error; the values
    are only known in Spark's executors, so the returned DataFrame fails its job
    (``raise_error``) at the first value that would round, rather than refusing every such
    column (a computed ``decimal(38,18)`` of prices in cents is common and right)."""
    schema = to_arrow_schema(df.schema, timezone="UTC")  # only the type matters, not the zone
    con = connect(url)
    try:
        existing = target_columns(con, table)
    finally:
        con.close()
    if not existing:
        return df
    check_compatible(table, schema, existing, "the DataFrame")
    for f in schema:
        data_type, _precision, scale = existing[f.name]
        if data_type == "numeric" and scale is not None and pa.types.is_decimal(f.type) \
                and f.type.scale > scale:
            column = F.col(f"`{f.name}`")
            message = (f"a value of column {f.name!r} has more than {scale} decimal digits, "
                       f"which the target {table}'s numeric column would round away; nothing "
                       f"of this partition was written")
            df = df.withColumn(f.name, F.when(column != F.round(column, scale),
                                              F.raise_error(F.lit(message)))
                               .otherwise(column))
    return df


def postgres_to_dataframe(url: str, table: str | None = None, query: str | None = None,
                          partition_column: str | None = None,
                          lower_bound: Bound | None = None, upper_bound: Bound | None = None,
                          num_partitions: int | None = None, spark: SparkSession | None = None,
                          *, fetch_size: int = JDBC_FETCH_SIZE,
                          retry: RetryPolicy | None = None) -> DataFrame:
    """A DataFrame over a PostgreSQL table or query (exactly one of ``table``, ``query``).

    With ``partition_column`` (numeric, date or timestamp) Spark reads ``num_partitions``
    ranges of it over as many connections (default: Spark's parallelism). The bounds only
    decide the ranges' stride, rows outside them are still read; without bounds the column's
    min and max are read first. Spark uses fewer partitions when the range is narrower than
    ``num_partitions`` (one for an empty table). ``query`` takes no parameters: JDBC sources
    cannot bind them; filter the DataFrame instead (Spark pushes filters down as SQL it
    escapes itself).

    The DataFrame is lazy: connection and schema errors surface here (as ``PostgresUnavailable``
    or ``MigrationError``), errors while rows are read surface in the action that reads them.
    ``retry``: how long a server that is away is tried here (default: ``JDBC_READ_ATTEMPTS``
    tries, 0.5 s doubling to 4 s between them), for callers that must fail sooner.
    """
    if (table is None) == (query is None):
        raise ValueError("give exactly one of table= or query=")
    if (lower_bound is None) != (upper_bound is None):
        raise ValueError("give both lower_bound and upper_bound, or neither")
    if partition_column is None and (num_partitions is not None or lower_bound is not None):
        raise ValueError("num_partitions and bounds need a partition_column")
    spark = spark or get_spark()
    pg = parse(reader_role.reader_url(url))  # as the reader (``_reader``)
    _read("check the reader role", pg, lambda: reader_role.ensure(url), retry)
    source = qualified(table) if table is not None else f"({_bare(query or '')}) AS sstore_query"
    what = f"read {table!r}" if table is not None else "run a query"
    reader = _reader(spark, pg, source, fetch_size)
    if partition_column is not None:
        parts = num_partitions if num_partitions is not None else \
            spark.sparkContext.defaultParallelism
        if parts < 1:
            raise ValueError(f"num_partitions must be positive, got {parts}")
        if lower_bound is None:
            lower_bound, upper_bound = _read(
                f"read the range of {partition_column!r}", pg,
                lambda: _min_max(spark, pg, source, partition_column, fetch_size), retry)
        if lower_bound is not None and upper_bound is not None and parts > 1:
            reader = (reader.option("partitionColumn", partition_column)
                      .option("lowerBound", _bound_text(lower_bound, math.floor))
                      .option("upperBound", _bound_text(upper_bound, math.ceil))
                      .option("numPartitions", parts))
    return _read(what, pg, reader.load, retry)


T = TypeVar("T")


def _read(action: str, pg: PgUrl, fn: Callable[[], T], policy: RetryPolicy | None = None) -> T:
    """A JDBC read (idempotent), its transient failures retried through the one retry helper
    (by ``policy``, default ``JDBC_READ_ATTEMPTS`` tries from 0.5 s to 4 s apart).
    Writes are not retried here: a JDBC write commits per partition, so trying it again could
    write rows twice."""
    def attempt() -> T:
        with _jdbc_errors(action, pg):
            return fn()
    try:
        return retry.call(attempt, policy or RetryPolicy(JDBC_READ_ATTEMPTS, 0.5, 4.0),
                          f"Spark: {action}")
    except retry.GaveUp as exc:
        raise PostgresUnavailable(str(exc)) from exc.__cause__


def _reader(spark: SparkSession, pg: PgUrl, source: str, fetch_size: int) -> DataFrameReader:
    """A JDBC read as the reader role (``migrators.reader``), its sessions read-only: both
    set at connection start (libpq's ``options``, which the JDBC driver sends too)."""
    role = reader_role.role().replace("\\", "\\\\").replace(" ", "\\ ")
    session = f"-c role={role} -c default_transaction_read_only=on"
    return (spark.read.format("jdbc")
            .option("url", pg.jdbc)
            .option("dbtable", source)
            .option("fetchsize", fetch_size)
            .option("preferTimestampNTZ", "true")  # timestamp stays without zone, see above
            .options(**_connection_properties(pg), options=session))


def _min_max(spark: SparkSession, pg: PgUrl, source: str, column: str, fetch_size: int
             ) -> tuple[Any, Any]:
    """The partition column's range, read through the same driver as the data. Arrow (not
    ``collect``) keeps timestamps as instants or as wall-clock values, as they are."""
    col = ident(column)
    bounds = f"(SELECT min({col}) AS lo, max({col}) AS hi FROM {source}) AS sstore_bounds"
    row = _reader(spark, pg, bounds, fetch_size).load().toArrow().to_pylist()[0]
    return row["lo"], row["hi"]


def _bound_text(value: Bound, rounding: Callable[[Any], int]) -> str:
    """A bound as Spark's JDBC source parses it: an integer (Spark reads numeric bounds as
    longs, so fractional ones are widened outward), or an ISO date or timestamp."""
    if isinstance(value, bool):
        raise ValueError("a boolean column cannot partition a read")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (float, decimal.Decimal)):
        return str(int(rounding(value)))
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def _bare(query: str) -> str:
    """The query without a trailing semicolon, so that it can be a subquery."""
    return query.strip().rstrip(";").strip()


def _connection_properties(pg: PgUrl) -> dict[str, str]:
    # reWriteBatchedInserts: the driver sends a batch as multi-row INSERTs, several times faster.
    return {**pg.jdbc_properties(), "reWriteBatchedInserts": "true"}


@contextlib.contextmanager
def _jdbc_errors(action: str, pg: PgUrl) -> Iterator[None]:
    """Turn Spark's JDBC failures into sstore's transient/terminal errors, naming the server
    (without its password) and PostgreSQL's own message."""
    try:
        yield
    except (PySparkException, Py4JError) as exc:
        states, root = _java_causes(exc)
        message = f"Spark could not {action} at {pg.redacted()}: {root}"
        condition = exc.getCondition() if isinstance(exc, PySparkException) else None
        if condition == "FAILED_JDBC.CONNECTION" or any(
                classify_sqlstate(s) is Kind.TRANSIENT for s in states):
            raise PostgresUnavailable(message) from exc
        raise MigrationError(message) from exc


def _java_causes(exc: BaseException) -> tuple[list[str], str]:
    """SQLSTATEs found along the Java cause chain, and the innermost message."""
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    states: list[str] = []
    root = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for _ in range(32):  # a cause chain is short; the bound guards against cycles
        if java is None:
            break
        with contextlib.suppress(Py4JError):
            state = java.getSQLState()  # only java.sql.SQLException has it
            if state:
                states.append(str(state))
        with contextlib.suppress(Py4JError):
            text = java.getMessage()
            if text:
                root = " ".join(str(text).split())
        try:
            java = java.getCause()
        except Py4JError:
            break
    return states, root


# ---------------------------------------------------------------------------------- engine
def dataframe_to_engine(df: DataFrame, engine: Engine, table: str,
                        mode: Literal["append", "replace"] = "append") -> int:
    """Copy ``df`` into the engine's DuckDB table ``table`` in one ACID transaction; return the
    number of rows copied.

    A missing table is created from ``df``'s types. ``append`` inserts by column name;
    ``replace`` deletes the existing rows first, in the same transaction, so readers see the
    old or the new contents and the table keeps its declaration (keys, defaults). Streams are
    refused: their rows enter through ``Engine.ingest``, which gives them batch-ids. The rows
    pass through the driver as one Arrow table. Not available on a weak-durability engine
    (its ad hoc transactions are logged as statements, and these rows would not be).
    """
    if mode not in ("append", "replace"):
        raise ValueError(f"mode must be 'append' or 'replace', got {mode!r}")
    if engine.graph.is_stream(table) or table in engine.graph.windows:
        raise DeclarationError(f"{table!r} is a stream or window of the engine: its rows enter "
                               f"through Engine.ingest, which gives them batch-ids")
    arrow = df.toArrow()
    source = f"sstore_spark_{uuid.uuid4().hex}"
    target, relation = qualified(table), ident(source)
    exists = bool(engine.query("SELECT 1 FROM duckdb_tables() WHERE table_name = ? AND "
                               "schema_name = current_schema()", table).num_rows)
    if exists:  # INSERT would let DuckDB round 2.7 into an INTEGER 3: refuse what changes
        try:
            arrow = conform_columns(arrow, engine.query(f"SELECT * FROM {target} LIMIT 0").schema,
                                    f"engine table {table!r}")
        except SchemaError as exc:
            raise IncompatibleSchemaError(str(exc)) from None
    with engine.transaction() as tx:
        tx.register(source, arrow)
        if not exists:  # DuckDB 2.0.0 loses rows of a table made empty and filled in one tx
            tx.execute(f"CREATE TABLE {target} AS SELECT * FROM {relation}")
            return int(arrow.num_rows)
        if mode == "replace":
            tx.execute(f"DELETE FROM {target}")
        try:
            tx.execute(f"INSERT INTO {target} BY NAME SELECT * FROM {relation}")
        except (duckdb.BinderException, duckdb.ConversionException) as exc:
            raise IncompatibleSchemaError(f"engine table {table!r} cannot take the "
                                          f"DataFrame's rows: {exc}") from exc
    return int(arrow.num_rows)


def engine_to_dataframe(engine: Engine, sql_or_table: str, spark: SparkSession | None = None,
                        *, params: Sequence[Any] | Mapping[str, Any] | None = None
                        ) -> DataFrame:
    """A DataFrame of a query over the engine's committed state, or of a whole table.

    A bare (optionally schema-qualified) name is a table; anything else is DuckDB SQL, with
    ``params`` bound. The result is read under the engine's lock, as one consistent snapshot,
    then handed to Spark as Arrow. Types Spark lacks are widened without loss (unsigned
    integers); a type with no Spark counterpart (INTERVAL, ...) raises
    ``UnsupportedTypeError`` naming the column.
    """
    text = sql_or_table.strip()
    sql = f"SELECT * FROM {qualified(text)}" if _TABLE_NAME.fullmatch(text) else sql_or_table
    rows = engine.query(sql, params=params)  # before Spark starts: a bad query fails fast
    described = engine.query(f"DESCRIBE {sql}", params=params)  # TIMETZ, BIT look like others
    check_duckdb_types("the query's", list(zip(described.column("column_name").to_pylist(),
                                               described.column("column_type").to_pylist())))
    return arrow_to_spark(spark or get_spark(), rows)


def arrow_to_spark(spark: SparkSession, table: pa.Table) -> DataFrame:
    """A DataFrame of an Arrow table, the one way sstore hands Arrow rows to Spark.

    Columns whose type Spark cannot read are cast to a lossless one it can (unsigned integers
    widened, see the module's type table), and the schema is ``spark_schema``'s, so naive
    timestamps stay naive; a type with no Spark counterpart raises ``UnsupportedTypeError``
    naming the column. The rows pass through the driver (fine for what fits in its memory)."""
    arrow = _for_spark(table)
    return spark.createDataFrame(arrow, schema=spark_schema(arrow.schema))


def _for_spark(table: pa.Table) -> pa.Table:
    """Cast top-level columns whose Arrow type Spark cannot read to a lossless one it can."""
    if not any(field.type in _FOR_SPARK for field in table.schema):
        return table
    schema = pa.schema([field.with_type(_FOR_SPARK.get(field.type, field.type))
                        for field in table.schema])
    return table.cast(schema)


def spark_schema(schema: pa.Schema) -> StructType:
    """Spark's schema for an Arrow schema, keeping naive timestamps naive (``timestamp_ntz``);
    Spark's own inference would make them instants in the session's zone. Nullability is the
    Arrow field's. Types Spark lacks raise ``UnsupportedTypeError`` (``arrow_to_spark`` widens
    the unsigned ones first)."""
    fields = []
    for field in schema:
        try:
            spark_type = from_arrow_type(field.type, prefer_timestamp_ntz=True)
        except Exception as exc:  # pyspark raises several types for "unsupported"
            raise UnsupportedTypeError(f"column {field.name!r}: Arrow type {field.type} has no "
                                       f"Spark type; cast it in the query") from exc
        fields.append(StructField(field.name, spark_type, nullable=field.nullable))
    return StructType(fields)
