"""Spark plumbing shared by the dimension jobs: Arrow in and out, version chains, keys, rejects.

Every rule that makes the dimension tables deterministic lives here, once:

- ``to_spark`` numbers rows in their total source order (``seq``), so "the last record of a
  day" and "the value carried forward" never depend on how Spark partitions the data;
- ``last_per_day`` keeps one version per natural key and date (the last one);
- ``chain`` ends each version where the next begins (``9999-12-31`` for the last);
- ``number`` assigns surrogate keys with ``row_number`` over a total order of natural key and
  EffectiveDate (never ``monotonically_increasing_id``, whose values depend on partitioning).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import StructField, StructType

from sstore.workloads.tpcdi.sources import REJECT_SCHEMA

FIRST_DAY = dt.date(1950, 1, 1)      # the first DimDate date: DimBroker's EffectiveDate
END_OF_TIME = dt.date(9999, 12, 31)  # EndDate of a current version
REJECT_COLUMNS = tuple(REJECT_SCHEMA.names)


def to_spark(spark: SparkSession, table: pa.Table, order: Sequence[str] | None = None
             ) -> DataFrame:
    """A DataFrame of an Arrow table. With ``order``, rows are sorted by those columns (ties
    keep file order; ``()`` keeps file order) and numbered 0, 1, ... in a ``seq`` column: the
    total order every "last" and "carried forward" rule uses. Timestamps stay without zone;
    ``time32`` (which Spark cannot read from Arrow) is widened to ``time64``."""
    if order is not None:
        position = pa.array(np.arange(table.num_rows, dtype=np.int64))
        table = table.append_column("seq", position)
        table = table.sort_by([(c, "ascending") for c in (*order, "seq")])
        table = table.set_column(table.num_columns - 1, "seq", position)
    columns, fields = [], []
    for field, column in zip(table.schema, table.columns):
        if pa.types.is_time32(field.type):
            field, column = field.with_type(pa.time64("us")), pc.cast(column, pa.time64("us"))
        columns.append(column)
        fields.append(StructField(field.name, from_arrow_type(field.type,
                                                              prefer_timestamp_ntz=True)))
    return spark.createDataFrame(pa.table(columns, names=table.column_names),
                                 schema=StructType(fields))


@overload
def materialize(spark: SparkSession, rows: DataFrame, rejects: DataFrame | None = None, *,
                lookup: Literal[True]) -> tuple[pa.Table, pa.Table, DataFrame]: ...


@overload
def materialize(spark: SparkSession, rows: DataFrame, rejects: DataFrame | None = None,
                lookup: bool = False) -> tuple[pa.Table, pa.Table, DataFrame | None]: ...


def materialize(spark: SparkSession, rows: DataFrame, rejects: DataFrame | None = None,
                lookup: bool = False) -> tuple[pa.Table, pa.Table, DataFrame | None]:
    """Compute a job in one Spark action: its rows and its rule rejects (one query, so the
    lineage they share is computed once) as Arrow, and with ``lookup`` a DataFrame over the
    computed rows for the jobs that look them up (no later action recomputes the lineage)."""
    if rejects is None:
        table, refused = rows.toArrow(), REJECT_SCHEMA.empty_table()
    else:
        both = (rows.withColumn("_rejected", F.lit(False))
                .unionByName(rejects.withColumn("_rejected", F.lit(True)),
                             allowMissingColumns=True).toArrow())
        flag = both["_rejected"]
        table = both.filter(pc.invert(flag)).select(rows.columns)
        refused = both.filter(flag).select(REJECT_COLUMNS).cast(REJECT_SCHEMA)
    return table, refused, to_spark(spark, table) if lookup else None


def last_per_day(df: DataFrame, key: Sequence[str], day: str, order: str = "seq"
                 ) -> DataFrame:
    """One row per natural key and day: the last by ``order``. The TPC-DI rule "when several
    versions start on the same date keep only the last" (no EffectiveDate = EndDate rows)."""
    w = Window.partitionBy(*key, day).orderBy(F.col(order).desc())
    return df.withColumn("_last", F.row_number().over(w)).where("_last = 1").drop("_last")


def chain(df: DataFrame, key: Sequence[str], start: str = "effectivedate") -> DataFrame:
    """EndDate = the next version's EffectiveDate (9999-12-31 for the last), IsCurrent =
    (EndDate = 9999-12-31). Needs unique (key, start)."""
    w = Window.partitionBy(*key).orderBy(start)
    return (df.withColumn("enddate", F.coalesce(F.lead(start).over(w), F.lit(END_OF_TIME)))
            .withColumn("iscurrent", F.col("enddate") == F.lit(END_OF_TIME)))


def number(df: DataFrame, sk: str, order: Sequence[str], offset: int = 0) -> DataFrame:
    """Surrogate keys offset+1, offset+2, ... in the total order ``order`` (natural key then
    EffectiveDate: unique, so the numbering is the same on every run and partitioning)."""
    w = Window.orderBy(*order)
    return df.withColumn(sk, F.row_number().over(w).cast("long") + F.lit(offset))


def carry_forward(df: DataFrame, key: Sequence[str], present: Mapping[str, Column],
                  order: str = "seq") -> DataFrame:
    """Each column of ``present`` takes its last *present* value up to and including the row,
    per key in ``order``: an absent item means "unchanged". ``present[c]`` says whether the
    row carries ``c`` (a NULL carried on purpose is a value, so presence is not non-NULL)."""
    w = (Window.partitionBy(*key).orderBy(order)
         .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    return df.select(*[c for c in df.columns if c not in present], *[
        F.last(F.when(is_there, F.struct(F.col(c).alias("v"))), ignorenulls=True)
        .over(w)["v"].alias(c) for c, is_there in present.items()])


def rejects_frame(df: DataFrame, source_file: str, batch_id: int, raw: Column,
                  reason: Column) -> DataFrame:
    """Rows refused by a dimension rule, in the rejects table's columns. The readers name the
    line; a rule that refuses a row after parsing describes the record instead."""
    return df.select(F.lit(source_file).alias("source_file"),
                     F.lit(batch_id).cast("int").alias("batch_id"),
                     F.lit(None).cast("long").alias("line_number"),
                     raw.alias("raw_line"), reason.alias("reason"))


def describe(*parts: tuple[str, str]) -> Column:
    """``"LABEL=value LABEL=value"`` of a record, for ``raw_line`` of a rule reject."""
    pieces: list[Column] = []
    for label, column in parts:
        pieces.append(F.concat(F.lit(f"{label}="), F.coalesce(F.col(column).cast("string"),
                                                              F.lit(""))))
    return F.concat_ws(" ", *pieces)


def collect_rejects(frames: Iterable[DataFrame | pa.Table]) -> pa.Table:
    """All rejects (reader tables and rule DataFrames) as one Arrow table; the DataFrames are
    computed in one Spark job."""
    frames = list(frames)
    tables = [f for f in frames if isinstance(f, pa.Table)]
    rules = [f for f in frames if isinstance(f, DataFrame)]
    if rules:
        union = rules[0]
        for more in rules[1:]:
            union = union.unionByName(more)
        tables.append(union.toArrow())
    return pa.concat_tables([t.select(REJECT_COLUMNS).cast(REJECT_SCHEMA) for t in tables]
                            + [REJECT_SCHEMA.empty_table()])


def status_name(code: Column | str, names: Mapping[str, str]) -> Column:
    """StatusType.ST_NAME of a status code (NULL when StatusType does not know the code).
    StatusType has six rows, so it travels as a literal map rather than as a join."""
    pairs = [F.lit(x) for k, v in sorted(names.items()) for x in (k, v)]
    return F.element_at(F.create_map(*pairs), F.col(code) if isinstance(code, str) else code) \
        if names else F.lit(None).cast("string")
