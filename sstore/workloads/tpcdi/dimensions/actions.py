"""CustomerMgmt.xml actions, checked before they become DimCustomer and DimAccount versions.

Actions are put in one total order, ActionTS then file position (``seq``), and an action is
refused (to ``rejects``, with the reason) when it cannot be applied in that order:

- an unknown ActionType;
- NEW or ADDACCT whose account has no CA_B_ID, or a CA_B_ID (NEW, ADDACCT, UPDACCT) that is not
  a DimBroker (HR job code 314): SK_BrokerID could not be filled;
- NEW or ADDACCT of a CA_ID created earlier; NEW of a C_ID created earlier;
- ADDACCT, UPDCUST, INACT of a C_ID not created earlier (by an accepted NEW);
- ADDACCT, UPDACCT, CLOSEACCT without a CA_ID, or UPDACCT, CLOSEACCT of a CA_ID not created
  earlier (by an accepted NEW or ADDACCT).

Refusals cascade in that order (a refused NEW makes its customer's later actions refer to a
customer that does not exist). Accepted actions get ``owner``: the customer an account action
belongs to, the C_ID of the action that created the account (an UPDACCT cannot move it).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from sstore.workloads.tpcdi.sources import SourceRead

from .frames import describe, rejects_frame, to_spark

NEW, ADDACCT, UPDACCT, CLOSEACCT, UPDCUST, INACT = (
    "NEW", "ADDACCT", "UPDACCT", "CLOSEACCT", "UPDCUST", "INACT")
KINDS = (NEW, ADDACCT, UPDACCT, CLOSEACCT, UPDCUST, INACT)
CUSTOMER_KINDS = (NEW, UPDCUST, INACT)
ACCOUNT_KINDS = (NEW, ADDACCT, UPDACCT, CLOSEACCT)


def _is(*kinds: str) -> Column:
    return F.col("actiontype").isin(*kinds)


def _first(when: Column, partition: str, value: Column | None = None) -> Column:
    """The ``seq`` (or ``value``) of the first row of ``partition`` where ``when`` holds."""
    w = Window.partitionBy(partition)
    if value is None:
        return F.min(F.when(when, F.col("seq"))).over(w)
    return F.min(F.when(when, F.struct(F.col("seq"), value.alias("v")))).over(w)["v"]


def check_actions(spark: SparkSession, read: SourceRead, brokers: DataFrame) -> DataFrame:
    """Every action with ``seq``, ``owner`` and ``reason`` (NULL when it can be applied);
    split with ``accepted`` and ``refused``."""
    broker_ids = brokers.select(F.col("brokerid").alias("_broker"))
    df = (to_spark(spark, read.table, order=("actionts",))
          .join(F.broadcast(broker_ids), F.col("ca_b_id") == F.col("_broker"), "left")
          .withColumn("_bad_broker", F.col("ca_b_id").isNotNull() & F.col("_broker").isNull()))
    has_account = F.col("ca_id").isNotNull()
    creates = _is(NEW, ADDACCT) & has_account
    df = df.withColumn("_dup_account", creates & (F.col("seq") > _first(creates, "ca_id")))
    broker_trouble = ((creates & F.col("ca_b_id").isNull())
                      | (_is(NEW, ADDACCT, UPDACCT) & F.col("_bad_broker")))
    new_ok = _is(NEW) & ~broker_trouble & ~F.col("_dup_account")
    df = df.withColumn("_customer_from", _first(new_ok, "c_id"))
    customer_known = F.col("_customer_from") < F.col("seq")
    added_ok = (_is(ADDACCT) & has_account & ~broker_trouble & ~F.col("_dup_account")
                & customer_known)
    created = (new_ok & (F.col("seq") == F.col("_customer_from")) & has_account) | added_ok
    df = (df.withColumn("_account_from", _first(created, "ca_id"))
          .withColumn("_account_owner", _first(created, "ca_id", F.col("c_id"))))
    account_known = F.col("_account_from") < F.col("seq")
    ca_b_id, ca_id, c_id = (F.col(c).cast("string") for c in ("ca_b_id", "ca_id", "c_id"))
    reason = (
        F.when(~_is(*KINDS), F.concat(F.lit("unknown ActionType "), F.col("actiontype")))
        .when(_is(ADDACCT, UPDACCT, CLOSEACCT) & ~has_account,
              F.concat(F.col("actiontype"), F.lit(" without an Account CA_ID")))
        .when(creates & F.col("ca_b_id").isNull(), F.lit("account without CA_B_ID"))
        .when(_is(NEW, ADDACCT, UPDACCT) & F.col("_bad_broker"),
              F.concat(F.lit("CA_B_ID "), ca_b_id, F.lit(" is not a broker (HR job code 314)")))
        .when(F.col("_dup_account"), F.concat(F.lit("CA_ID "), ca_id,
                                              F.lit(" was created before")))
        .when(_is(NEW) & (F.col("seq") != F.col("_customer_from")),
              F.concat(F.lit("C_ID "), c_id, F.lit(" was created before")))
        .when(_is(ADDACCT, UPDCUST, INACT) & ~F.coalesce(customer_known, F.lit(False)),
              F.concat(F.lit("C_ID "), c_id, F.lit(" does not exist at this time")))
        .when(_is(UPDACCT, CLOSEACCT) & ~F.coalesce(account_known, F.lit(False)),
              F.concat(F.lit("CA_ID "), ca_id, F.lit(" does not exist at this time"))))
    return (df.withColumn("reason", reason)
            .withColumn("owner", F.when(_is(UPDACCT, CLOSEACCT), F.col("_account_owner"))
                        .otherwise(F.col("c_id")))
            .drop("_broker", "_bad_broker", "_dup_account", "_customer_from", "_account_from",
                  "_account_owner"))


def accepted(checked: DataFrame) -> DataFrame:
    """The actions ``check_actions`` let through."""
    return checked.where(F.col("reason").isNull()).drop("reason")


def refused(checked: DataFrame, source: str) -> DataFrame:
    """The actions ``check_actions`` refused, as rejects rows."""
    return rejects_frame(
        checked.where(F.col("reason").isNotNull()), source, 1,
        describe(("ActionType", "actiontype"), ("ActionTS", "actionts"), ("C_ID", "c_id"),
                 ("CA_ID", "ca_id")), F.col("reason"))
