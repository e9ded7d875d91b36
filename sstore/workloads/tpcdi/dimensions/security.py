"""DimSecurity from FINWIRE SEC records, split where the issuing company changes.

A SEC record names its company by CIK (CoNameOrCIK all digits) or by name; the record's company
is the DimCompany version of that CIK or name valid on the record's date (several companies of
one name: the smallest CIK). A record without one, or with a status code StatusType does not
know, is rejected. Records of one Symbol and date make one version (the last posted).

Each version then points to a company *version*, and the audit wants the security version to
lie inside it. So a security version [E, End) whose company gets new versions at dates
E < c1 < c2 < ... < End is cut into [E, c1), [c1, c2), ..., each with its own SK_SecurityID and
the SK_CompanyID valid on its first day; the values are the record's in every piece. The
pieces are the overlaps of the security version with its company's versions (which, from the
company's first record on, cover every day), so one range join makes them.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from .frames import (
    END_OF_TIME,
    chain,
    describe,
    last_per_day,
    number,
    rejects_frame,
    status_name,
    to_spark,
)

COLUMNS = ("sk_securityid", "symbol", "issue", "status", "name", "exchangeid", "sk_companyid",
           "sharesoutstanding", "firsttrade", "firsttradeonexchange", "dividend", "iscurrent",
           "batchid", "effectivedate", "enddate")


def _company_versions(dimcompany: DataFrame) -> DataFrame:
    return dimcompany.select(
        F.col("sk_companyid"), F.col("companyid"), F.col("name").alias("company_name"),
        F.col("effectivedate").alias("c_eff"), F.col("enddate").alias("c_end"))


def _resolve(records: DataFrame, companies: DataFrame) -> DataFrame:
    """``records`` with ``cik``: the company valid on each record's day, by CIK or by name
    (NULL when there is none)."""
    def valid(prefix: str) -> Column:
        return ((F.col(f"{prefix}c_eff") <= F.col("day"))
                & (F.col("day") < F.col(f"{prefix}c_end")))
    by_cik = companies.select(*[F.col(c).alias(f"k_{c}") for c in companies.columns])
    by_name = companies.select(*[F.col(c).alias(f"n_{c}") for c in companies.columns])
    first = Window.partitionBy("seq").orderBy(F.col("n_companyid").asc_nulls_last())
    return (records
            .join(F.broadcast(by_cik), (F.col("co_cik") == F.col("k_companyid")) & valid("k_"),
                  "left")
            .join(F.broadcast(by_name), F.col("co_cik").isNull()
                  & (F.col("co_name") == F.col("n_company_name")) & valid("n_"), "left")
            .withColumn("_n", F.row_number().over(first)).where("_n = 1")
            .select(*records.columns,
                    F.coalesce(F.col("k_companyid"), F.col("n_companyid")).alias("cik")))


def dim_security(spark: SparkSession, sec: pa.Table, dimcompany: DataFrame,
                 statustype: Mapping[str, str], source: str) -> tuple[DataFrame, DataFrame]:
    """DimSecurity rows and the SEC records rejected by its rules (``source`` names them)."""
    companies = _company_versions(dimcompany)
    records = _resolve(to_spark(spark, sec, order=("pts",))
                       .withColumn("status_name", status_name("status", statustype))
                       .withColumn("day", F.to_date("pts")), companies)
    reason = (F.when(F.col("status_name").isNull(),
                     F.concat(F.lit("unknown SEC Status "), F.col("status")))
              .when(F.col("cik").isNull(),
                    F.concat(F.lit("no company "), F.col("conameorcik"), F.lit(" valid on "),
                             F.col("day").cast("string"))))
    raw = describe(("SEC PTS", "pts"), ("Symbol", "symbol"), ("Status", "status"),
                   ("CoNameOrCIK", "conameorcik"))
    rejects = rejects_frame(records.where(reason.isNotNull()), source, 1, raw, reason)

    versions = chain(last_per_day(records.where(reason.isNull()), ["symbol"], "day")
                     .withColumnRenamed("day", "effectivedate"), ["symbol"])
    # The company versions overlapping a security version tile it (a company, once posted,
    # has a version on every later day): one piece per overlap.
    pieces = versions.join(
        F.broadcast(companies),
        (F.col("cik") == F.col("companyid")) & (F.col("c_eff") < F.col("enddate"))
        & (F.col("effectivedate") < F.col("c_end")))
    end = F.least(F.col("enddate"), F.col("c_end"))
    rows = pieces.select(
        F.col("symbol"), F.col("issuetype").alias("issue"),
        F.col("status_name").alias("status"), F.col("name"),
        F.col("exid").alias("exchangeid"), F.col("sk_companyid"),
        F.col("shout").alias("sharesoutstanding"), F.col("firsttradedate").alias("firsttrade"),
        F.col("firsttradeexchg").alias("firsttradeonexchange"), F.col("dividend"),
        (end == F.lit(END_OF_TIME)).alias("iscurrent"), F.lit(1).alias("batchid"),
        F.greatest(F.col("effectivedate"), F.col("c_eff")).alias("effectivedate"),
        end.alias("enddate"))
    return number(rows, "sk_securityid", ["symbol", "effectivedate"]).select(*COLUMNS), rejects
