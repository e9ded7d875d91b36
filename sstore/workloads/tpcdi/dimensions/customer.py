"""DimCustomer: Batch1 versions from CustomerMgmt.xml, and the column rules every batch shares.

Batch1: a version per NEW, UPDCUST and INACT action of a customer, EffectiveDate = the date of
ActionTS, Status Active (NEW, UPDCUST) or Inactive (INACT). An UPDCUST carries only what
changed: an item it leaves out keeps its last value, an item present but empty becomes NULL
(DIGen's reading of its own template). Several actions of one customer on one date make one
version: the state after the last of them.

Columns (``customer_columns``, also for Customer.txt rows): Gender 'M' or 'F' (upper-cased
C_GNDR) else 'U'; Tier C_TIER as a number (NULL if it is none); Phone1..3 from the phone parts as
TPC-DI formats them, '+c (aaa) lll' / '(aaa) lll' / 'lll' by the parts present, then the
extension appended; National/Local tax rate and its name from TaxRate by C_NAT_TX_ID and
C_LCL_TX_ID. AgencyID, CreditRating, NetWorth, MarketingNameplate come from Prospect.csv,
which DimTrade does not need: they stay NULL.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .actions import CUSTOMER_KINDS, INACT
from .frames import carry_forward, chain, last_per_day, number, status_name

_PHONE_PARTS = ("ctry", "area", "local", "ext")
FIELDS = ("c_tax_id", "c_l_name", "c_f_name", "c_m_name", "c_gndr", "c_tier", "c_dob",
          "c_adline1", "c_adline2", "c_zipcode", "c_city", "c_state_prov", "c_ctry",
          *(f"c_{p}_{n}" for n in (1, 2, 3) for p in _PHONE_PARTS),
          "c_email_1", "c_email_2", "c_lcl_tx_id", "c_nat_tx_id")
COLUMNS = ("sk_customerid", "customerid", "taxid", "status", "lastname", "firstname",
           "middleinitial", "gender", "tier", "dob", "addressline1", "addressline2",
           "postalcode", "city", "stateprov", "country", "phone1", "phone2", "phone3", "email1",
           "email2", "nationaltaxratedesc", "nationaltaxrate", "localtaxratedesc",
           "localtaxrate", "iscurrent", "batchid", "effectivedate", "enddate")


def present(column: str) -> Column:
    """Whether an action carries ``column``: a value, or an empty element (``empty_fields``)."""
    empty = F.coalesce(F.col("empty_fields"), F.array().cast("array<string>"))
    return F.col(column).isNotNull() | F.array_contains(empty, column)


def phone(n: int) -> Column:
    """TPC-DI's Phone<n> from C_CTRY_<n>, C_AREA_<n>, C_LOCAL_<n>, C_EXT_<n>."""
    ctry, area, local, ext = (F.col(f"c_{p}_{n}") for p in _PHONE_PARTS)
    base = (F.when(ctry.isNotNull() & area.isNotNull() & local.isNotNull(),
                   F.concat(F.lit("+"), ctry, F.lit(" ("), area, F.lit(") "), local))
            .when(area.isNotNull() & local.isNotNull(),
                  F.concat(F.lit("("), area, F.lit(") "), local))
            .when(local.isNotNull(), local))
    return F.when(ext.isNotNull(), F.concat(base, ext)).otherwise(base)


def customer_columns(df: DataFrame, taxrate: DataFrame, statustype: Mapping[str, str],
                     batch_id: int) -> DataFrame:
    """DimCustomer's columns (without SK_CustomerID, EndDate, IsCurrent) from rows with the
    Customer.txt column names, ``c_st_id`` and ``effectivedate``."""
    nat = taxrate.select(F.col("tx_id").alias("_nat"), F.col("tx_name").alias("_nat_name"),
                         F.col("tx_rate").alias("_nat_rate"))
    lcl = taxrate.select(F.col("tx_id").alias("_lcl"), F.col("tx_name").alias("_lcl_name"),
                         F.col("tx_rate").alias("_lcl_rate"))
    gender = F.upper(F.col("c_gndr"))
    return (df.join(F.broadcast(nat), F.col("c_nat_tx_id") == F.col("_nat"), "left")
            .join(F.broadcast(lcl), F.col("c_lcl_tx_id") == F.col("_lcl"), "left")
            .select(
                F.col("c_id").alias("customerid"),
                F.col("c_tax_id").alias("taxid"),
                status_name("c_st_id", statustype).alias("status"),
                F.col("c_l_name").alias("lastname"),
                F.col("c_f_name").alias("firstname"),
                F.col("c_m_name").alias("middleinitial"),
                F.when(gender.isin("M", "F"), gender).otherwise(F.lit("U")).alias("gender"),
                F.expr("try_cast(trim(c_tier) AS smallint)").alias("tier"),
                F.col("c_dob").alias("dob"),
                F.col("c_adline1").alias("addressline1"),
                F.col("c_adline2").alias("addressline2"),
                F.col("c_zipcode").alias("postalcode"),
                F.col("c_city").alias("city"),
                F.col("c_state_prov").alias("stateprov"),
                F.col("c_ctry").alias("country"),
                phone(1).alias("phone1"), phone(2).alias("phone2"), phone(3).alias("phone3"),
                F.col("c_email_1").alias("email1"),
                F.col("c_email_2").alias("email2"),
                F.col("_nat_name").alias("nationaltaxratedesc"),
                F.col("_nat_rate").alias("nationaltaxrate"),
                F.col("_lcl_name").alias("localtaxratedesc"),
                F.col("_lcl_rate").alias("localtaxrate"),
                F.lit(batch_id).alias("batchid"),
                F.col("effectivedate")))


def dim_customer(actions: DataFrame, taxrate: DataFrame, statustype: Mapping[str, str]
                 ) -> DataFrame:
    """Batch1 DimCustomer from the checked CustomerMgmt actions (``actions.checked_actions``)."""
    events = (actions.where(F.col("actiontype").isin(*CUSTOMER_KINDS))
              .withColumn("c_st_id", F.when(F.col("actiontype") == INACT, F.lit("INAC"))
                          .otherwise(F.lit("ACTV"))))
    state = carry_forward(events.select("c_id", "seq", "actionts", "c_st_id", "empty_fields",
                                        *FIELDS),
                          ["c_id"], {c: present(c) for c in FIELDS})
    days = last_per_day(state.withColumn("effectivedate", F.to_date("actionts")), ["c_id"],
                        "effectivedate")
    versions = chain(customer_columns(days, taxrate, statustype, 1), ["customerid"])
    return number(versions, "sk_customerid", ["customerid", "effectivedate"]).select(*COLUMNS)
