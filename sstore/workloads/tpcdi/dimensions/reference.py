"""Reference tables: DimDate (Date.txt), DimTime (Time.txt), StatusType, TradeType, Industry,
TaxRate. The readers already name and type the columns as the warehouse does, so the job is
one rule: a key appears once (the last line wins; earlier duplicates are rejected, as the
primary key would refuse them)."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from sstore.workloads.tpcdi.sources import SourceRead

from .frames import rejects_frame, to_spark

#: table -> (natural key, columns in table order)
REFERENCE = {
    "dimdate": ("sk_dateid", (
        "sk_dateid", "datevalue", "datedesc", "calendaryearid", "calendaryeardesc",
        "calendarqtrid", "calendarqtrdesc", "calendarmonthid", "calendarmonthdesc",
        "calendarweekid", "calendarweekdesc", "dayofweeknum", "dayofweekdesc", "fiscalyearid",
        "fiscalyeardesc", "fiscalqtrid", "fiscalqtrdesc", "holidayflag")),
    "dimtime": ("sk_timeid", (
        "sk_timeid", "timevalue", "hourid", "hourdesc", "minuteid", "minutedesc", "secondid",
        "seconddesc", "markethoursflag", "officehoursflag")),
    "statustype": ("st_id", ("st_id", "st_name")),
    "tradetype": ("tt_id", ("tt_id", "tt_name", "tt_is_sell", "tt_is_mrkt")),
    "industry": ("in_id", ("in_id", "in_name", "in_sc_id")),
    "taxrate": ("tx_id", ("tx_id", "tx_name", "tx_rate")),
}


def unique_rows(df: DataFrame, key: Sequence[str], source: str, batch_id: int,
                describe_key: str) -> tuple[DataFrame, DataFrame]:
    """Rows with a unique ``key`` (the last in ``seq`` order) and the earlier duplicates as
    rejects."""
    w = Window.partitionBy(*key).orderBy(F.col("seq").desc())
    ranked = df.withColumn("_dup", F.row_number().over(w) > 1)
    raw = F.concat_ws(" ", *[F.concat(F.lit(f"{k.upper()}="), F.col(k).cast("string"))
                             for k in key])
    rejects = rejects_frame(ranked.where("_dup"), source, batch_id, raw,
                            F.lit(f"duplicate {describe_key}: a later line wins"))
    return ranked.where("NOT _dup").drop("_dup", "seq"), rejects


def reference_table(spark: SparkSession, table: str, read: SourceRead, batch_id: int = 1
                    ) -> tuple[DataFrame, DataFrame]:
    """One reference table as the warehouse stores it, and its duplicate-key rejects."""
    key, columns = REFERENCE[table]
    df = to_spark(spark, read.table, order=())
    rows, rejects = unique_rows(df, [key], read.source, batch_id, key.upper())
    return rows.select(*columns), rejects
