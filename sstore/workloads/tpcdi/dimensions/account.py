"""DimAccount, Batch1: versions from the account actions and from every customer version.

Account actions: NEW and ADDACCT open an account (Active), UPDACCT changes the items it carries
(absent items keep their values; Active), CLOSEACCT closes it (Inactive). Customer actions:
UPDCUST and INACT of the owner give each account the owner has at that moment (open or
closed) a new version, so that it points to the customer's new version; INACT also makes it
Inactive. Several events of one account on one date make one version, the state after the
last; a version's customer is the owner's DimCustomer version valid on its EffectiveDate, its
broker the DimBroker of CA_B_ID, and it is Inactive whenever that customer version is.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .actions import ACCOUNT_KINDS, ADDACCT, CLOSEACCT, INACT, NEW, UPDCUST
from .customer import present
from .frames import carry_forward, chain, last_per_day, number, status_name

FIELDS = ("ca_b_id", "ca_name", "ca_tax_st")
COLUMNS = ("sk_accountid", "accountid", "sk_brokerid", "sk_customerid", "status",
           "accountdesc", "taxstatus", "iscurrent", "batchid", "effectivedate", "enddate")


def account_rows(df: DataFrame, customers: DataFrame, brokers: DataFrame,
                 statustype: Mapping[str, str], batch_id: int) -> DataFrame:
    """DimAccount's columns (without SK_AccountID, EndDate, IsCurrent) from account states
    ``ca_id, owner, ca_b_id, ca_name, ca_tax_st, ca_st_id, effectivedate``: the owner's
    customer version valid on the EffectiveDate, the broker's current DimBroker row."""
    cust = customers.select(
        F.col("sk_customerid"), F.col("customerid"), F.col("status").alias("_c_status"),
        F.col("effectivedate").alias("_c_eff"), F.col("enddate").alias("_c_end"))
    brk = brokers.where("iscurrent").select(F.col("brokerid"), F.col("sk_brokerid"))
    inactive = status_name(F.lit("INAC"), statustype)
    return (df.join(cust, (F.col("owner") == F.col("customerid"))
                    & (F.col("_c_eff") <= F.col("effectivedate"))
                    & (F.col("effectivedate") < F.col("_c_end")))
            .join(F.broadcast(brk), F.col("ca_b_id") == F.col("brokerid"))
            .select(
                F.col("ca_id").alias("accountid"), F.col("sk_brokerid"),
                F.col("sk_customerid"),
                F.when(F.col("_c_status") == inactive, inactive)
                .otherwise(status_name("ca_st_id", statustype)).alias("status"),
                F.col("ca_name").alias("accountdesc"),
                F.col("ca_tax_st").alias("taxstatus"),
                F.lit(batch_id).alias("batchid"), F.col("effectivedate")))


def dim_account(actions: DataFrame, dimcustomer: DataFrame, dimbroker: DataFrame,
                statustype: Mapping[str, str]) -> DataFrame:
    """Batch1 DimAccount from the checked CustomerMgmt actions and the built DimCustomer and
    DimBroker."""
    own = (actions.where(F.col("actiontype").isin(*ACCOUNT_KINDS) & F.col("ca_id").isNotNull())
           .select("ca_id", "owner", "seq", "actionts", "empty_fields", *FIELDS,
                   F.when(F.col("actiontype") == CLOSEACCT, F.lit("INAC"))
                   .otherwise(F.lit("ACTV")).alias("ca_st_id")))
    opened = (actions.where(F.col("actiontype").isin(NEW, ADDACCT) & F.col("ca_id").isNotNull())
              .select("ca_id", F.col("owner").alias("_owner"), F.col("seq").alias("_opened")))
    by_customer = (actions.where(F.col("actiontype").isin(UPDCUST, INACT))
                   .select("c_id", "owner", "seq", "actionts", "actiontype")
                   .join(opened, (F.col("c_id") == F.col("_owner"))
                         & (F.col("_opened") < F.col("seq")))
                   .select("ca_id", "owner", "seq", "actionts",
                           F.lit(None).cast("array<string>").alias("empty_fields"),
                           *[F.lit(None).cast(own.schema[c].dataType).alias(c) for c in FIELDS],
                           F.when(F.col("actiontype") == INACT, F.lit("INAC")).alias("ca_st_id")))
    events = own.unionByName(by_customer)
    carried = {c: present(c) for c in FIELDS} | {"ca_st_id": F.col("ca_st_id").isNotNull()}
    state = carry_forward(events, ["ca_id"], carried)
    days = last_per_day(state.withColumn("effectivedate", F.to_date("actionts")), ["ca_id"],
                        "effectivedate")
    versions = chain(account_rows(days, dimcustomer, dimbroker, statustype, 1), ["accountid"])
    return number(versions, "sk_accountid", ["accountid", "effectivedate"]).select(*COLUMNS)
