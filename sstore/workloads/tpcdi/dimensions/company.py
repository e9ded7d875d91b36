"""DimCompany from FINWIRE CMP records: one version per CIK and posting date.

Each CMP record is a complete description of its company (FINWIRE never sends partial
records), so a version is its record: CompanyID = CIK, Name, Status = StatusType name of the
status code, Industry = Industry name of IndustryID, EffectiveDate = the date of PTS. Several
records of one CIK on one date make one version, the last posted. SPrating outside the 22
Standard & Poor's codes is NULL (and so is IsLowGrade); IsLowGrade is true for ratings that do
not start with 'A' or 'BBB'. A record whose status code StatusType does not know is rejected.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .frames import (
    chain,
    describe,
    last_per_day,
    number,
    rejects_frame,
    status_name,
    to_spark,
)

SP_RATINGS = ("AAA", "AA+", "AA", "AA-", "A+", "A", "A-", "BBB+", "BBB", "BBB-", "BB+", "BB",
              "BB-", "B+", "B", "B-", "CCC+", "CCC", "CCC-", "CC", "C", "D")
COLUMNS = ("sk_companyid", "companyid", "status", "name", "industry", "sprating", "islowgrade",
           "ceo", "addressline1", "addressline2", "postalcode", "city", "stateprov", "country",
           "description", "foundingdate", "iscurrent", "batchid", "effectivedate", "enddate")


def dim_company(spark: SparkSession, cmp: pa.Table, industry: DataFrame,
                statustype: Mapping[str, str], source: str) -> tuple[DataFrame, DataFrame]:
    """DimCompany rows and the CMP records rejected by its rules (``source`` names them)."""
    records = to_spark(spark, cmp, order=("pts",)).withColumn(
        "status_name", status_name("status", statustype))
    rejects = rejects_frame(
        records.where(F.col("status_name").isNull()), source, 1,
        describe(("CMP PTS", "pts"), ("CIK", "cik"), ("CompanyName", "companyname"),
                 ("Status", "status")),
        F.concat(F.lit("unknown CMP Status "), F.col("status")))
    names = industry.select(F.col("in_id"), F.col("in_name").alias("industry"))
    rating = F.when(F.col("sprating").isin(*SP_RATINGS), F.col("sprating"))
    versions = (records.where(F.col("status_name").isNotNull())
                .withColumn("effectivedate", F.to_date("pts"))
                .transform(lambda df: last_per_day(df, ["cik"], "effectivedate"))
                .join(F.broadcast(names), F.col("industryid") == F.col("in_id"), "left")
                .select(
                    F.col("cik").alias("companyid"),
                    F.col("status_name").alias("status"),
                    F.col("companyname").alias("name"),
                    F.col("industry"),
                    rating.alias("sprating"),
                    (~(rating.startswith("A") | rating.startswith("BBB"))).alias("islowgrade"),
                    F.col("ceoname").alias("ceo"),
                    F.col("addrline1").alias("addressline1"),
                    F.col("addrline2").alias("addressline2"),
                    F.col("postalcode"), F.col("city"),
                    F.col("stateprovince").alias("stateprov"),
                    F.col("country"), F.col("description"), F.col("foundingdate"),
                    F.lit(1).alias("batchid"),
                    F.col("effectivedate")))
    versions = chain(versions, ["companyid"])
    return number(versions, "sk_companyid", ["companyid", "effectivedate"]).select(*COLUMNS), \
        rejects

