"""Step 1 on Spark: event lines of a micro-batch -> typed trade events with a reason per bad line.

A line in the watched directory is ``line_no|tpcdi_batch|<the Trade.txt CDC line>``: the very
lines the engine ingests (``streaming.events``), with the two columns the engine gets beside
them. The fields and how each parses are ``streaming.parse.FIELDS``, the table the engine's
SP1 SQL is generated from, so both reject the same lines.
"""

from __future__ import annotations

from sstore.base.extras import needs

with needs("spark"):
    from pyspark.sql import Column, DataFrame, Window
    from pyspark.sql import functions as F

from sstore.workloads.tpcdi.dimtrade_spark_events import EVENT_COLUMNS
from sstore.workloads.tpcdi.streaming.parse import FIELDS, Field

_TYPES = {"VARCHAR": "string", "BIGINT": "bigint", "INTEGER": "int", "BOOLEAN": "boolean",
          "TIMESTAMP": "timestamp_ntz"}


def _spark_type(field: Field) -> str:
    return _TYPES.get(field.sql_type) or field.sql_type.lower()  # DECIMAL(8,2) -> decimal(8,2)


def _value(raw: Column, field: Field) -> Column:
    if field.parse == "timestamp":
        return F.try_to_timestamp(raw, F.lit("yyyy-MM-dd HH:mm:ss")).cast("timestamp_ntz")
    if field.parse == "bool01":
        return F.when(raw == "1", F.lit(True)).when(raw == "0", F.lit(False))
    if field.parse == "flag":
        return F.when(raw.isin("I", "U"), raw)
    if field.parse in ("int", "decimal"):
        return raw.try_cast(_spark_type(field))
    return raw


def parse_lines(df: DataFrame) -> DataFrame:
    """``value`` lines -> eid (line number), tpcdi_batch, line, the typed fields and
    ``reason`` (NULL if the line parsed). try_* functions throughout: Spark 4 runs in ANSI mode,
    where a plain cast of a bad number fails the whole micro-batch."""
    head = F.split(F.col("value"), r"\|", 3)
    fields = F.split(F.element_at(head, 3), r"\|")
    n = len(FIELDS)
    columns: dict[str, Column] = {}
    checks: list[Column] = []
    for i, fld in enumerate(FIELDS):
        raw = F.nullif(F.trim(F.try_element_at(fields, F.lit(i + 1))), F.lit(""))
        value = _value(raw, fld)
        columns[fld.name] = F.when(F.size(fields) == n, value).cast(_spark_type(fld))
        label = fld.name.upper()
        if fld.required:
            checks.append(F.when(raw.isNull(), F.lit(f"missing {label}")))
        if fld.parse != "text":
            checks.append(F.when(raw.isNotNull() & value.isNull(),
                                 F.concat(F.lit(f"bad {label}: "), raw)))
    reason = F.when(F.size(fields) != n, F.concat(F.lit(f"expected {n} fields, found "),
                                                  F.size(fields).cast("string")))
    return df.select(F.element_at(head, 1).cast("long").alias("eid"),
                     F.element_at(head, 2).cast("int").alias("tpcdi_batch"),
                     F.element_at(head, 3).alias("line"),
                     *[c.alias(name) for name, c in columns.items()],
                     F.coalesce(reason, *checks).alias("reason"))


def trade_events(parsed: DataFrame) -> DataFrame:
    """The rules' event rows: ``k`` is an event's position among its trade's, in CDC_DSN
    order (as ``dimtrade_spark_events.incremental_events`` numbers them)."""
    order = Window.partitionBy("t_id").orderBy("cdc_dsn", "eid")
    return parsed.withColumn("k", F.row_number().over(order)).select(*EVENT_COLUMNS)


def event_line(line_no: int, tpcdi_batch: int, line: str) -> str:
    """One line of an event file, as ``parse_lines`` reads it."""
    return f"{line_no}|{tpcdi_batch}|{line}\n"
