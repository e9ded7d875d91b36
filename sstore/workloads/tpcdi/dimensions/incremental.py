"""``apply_batch``: the DimCustomer and DimAccount versions of an incremental batch (2, 3, ...).

All new versions start on the batch's BatchDate and are current; the versions they replace end
there (EndDate = BatchDate, IsCurrent false), in one PostgreSQL transaction.

- Customer.txt: every row is a new version of its C_ID (full row; Status from C_ST_ID).
- Account.txt: every row is a new version of its CA_ID (full row), pointing to the current
  DimCustomer row of CA_C_ID *after* this batch's customer versions, and to the DimBroker of
  CA_B_ID; Inactive when that customer is.
- Every other account of a customer that got a new version gets one too (same values, the new
  SK_CustomerID; Inactive if the customer now is), so that each account version lies inside
  its customer version.

A C_ID or CA_ID on several lines of one file keeps its last line (CDC_DSN order). A row is
rejected when its status code is unknown, or (Account.txt) when its customer or broker does not
exist. New surrogate keys continue above the largest existing one, in natural-key order, so a
batch applied to the same warehouse always gets the same keys. Applying a batch again first
takes its earlier versions out (``store.undo_batch``); a batch cannot be applied again once a
later one builds on it, and its BatchDate must be after every EffectiveDate already there.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from migrators.postgres import connect
from sstore.base.sql import ident
from sstore.workloads.tpcdi import sources

from .account import COLUMNS as ACCOUNT_COLUMNS
from .account import account_rows
from .customer import COLUMNS as CUSTOMER_COLUMNS
from .customer import customer_columns
from .frames import (
    END_OF_TIME,
    collect_rejects,
    describe,
    last_per_day,
    materialize,
    number,
    rejects_frame,
    status_name,
    to_spark,
)
from .report import DimensionReport, Steps, count_sources
from .store import DimensionLoadError, add_versions, read_rows, scalar, undo_batch

INCREMENTAL_FILES = r"(^|/)(Customer\.txt|Account\.txt|BatchDate\.txt)$"
TYPE2 = {"dimcustomer": "customerid", "dimaccount": "accountid"}   # table -> natural key
_SK = {"dimcustomer": "sk_customerid", "dimaccount": "sk_accountid"}


def _batch_date(path: Path) -> dt.date:
    read = sources.read_batch_date(path)
    if read.table.num_rows != 1:
        raise DimensionLoadError(f"{path} must hold exactly one date, found "
                                 f"{read.table.num_rows} (and {read.rejects.num_rows} bad lines)")
    day: dt.date = read.table["batchdate"][0].as_py()  # a DATE column: as_py answers a date
    return day


@dataclass(frozen=True)
class _State:
    """What the batch starts from, read in its transaction: StatusType, TaxRate, DimBroker,
    the current DimCustomer and DimAccount versions, the largest SKs."""

    statustype: dict[str, str]
    taxrate: DataFrame
    brokers: DataFrame
    customers: DataFrame
    accounts: DataFrame
    last_sk: dict[str, int]

    @classmethod
    def read(cls, spark: SparkSession, cur: psycopg.Cursor, schema: str) -> _State:
        def frame(table: str, where: str = "TRUE") -> DataFrame:
            return to_spark(spark, read_rows(cur, schema, table, where))

        s = ident(schema)
        return cls(dict(cur.execute(f"SELECT st_id, st_name FROM {s}.statustype").fetchall()),
                   frame("taxrate"), frame("dimbroker"), frame("dimcustomer", "iscurrent"),
                   frame("dimaccount", "iscurrent"),
                   {t: int(scalar(cur, f"SELECT coalesce(max({ident(sk)}), 0) FROM "
                                       f"{s}.{ident(t)}")) for t, sk in _SK.items()})


def apply_batch(spark: SparkSession, data_dir: str | PathLike[str], url: str,
                schema: str = "tpcdi", batch_id: int = 2) -> DimensionReport:
    """Add the DimCustomer and DimAccount versions of ``data_dir/Batch<batch_id>``, in one
    PostgreSQL transaction (held while Spark computes them: readers see the warehouse before
    or after the batch, never between)."""
    if batch_id < 2:
        raise ValueError(f"incremental batches are 2, 3, ...; got {batch_id}")
    started = time.perf_counter()
    steps = Steps()
    folder = Path(data_dir) / f"Batch{batch_id}"
    day = _batch_date(folder / "BatchDate.txt")
    customer_read = steps.run("read Customer.txt",
                              lambda: sources.read_customer(folder / "Customer.txt", batch_id))
    account_read = steps.run("read Account.txt",
                             lambda: sources.read_account(folder / "Account.txt", batch_id))
    s = ident(schema)
    with connect(url) as con, con.cursor() as cur:
        steps.run("undo earlier run", lambda: undo_batch(cur, schema, TYPE2, batch_id))
        latest = scalar(cur, f"SELECT max(d) FROM (SELECT max(effectivedate) AS d FROM "
                             f"{s}.dimcustomer UNION ALL SELECT max(effectivedate) FROM "
                             f"{s}.dimaccount) AS t")
        if latest is not None and latest >= day:
            raise DimensionLoadError(f"BatchDate {day} of batch {batch_id} is not after the "
                                     f"latest EffectiveDate {latest} in {schema}")
        state = steps.run("read state", lambda: _State.read(spark, cur, schema))
        customers, customer_rejects, new_customers = steps.run("dimcustomer", lambda: (
            materialize(spark, *_customers(spark, state, customer_read, day, batch_id),
                        lookup=True)))
        accounts, account_rejects, _ = steps.run("dimaccount", lambda: materialize(
            spark, *_accounts(spark, state, account_read, new_customers, day, batch_id)))
        rejects = collect_rejects([customer_read.rejects, account_read.rejects,
                                   customer_rejects, account_rejects])
        ended = steps.run("write", lambda: add_versions(
            cur, schema, {"dimcustomer": ("customerid", customers),
                          "dimaccount": ("accountid", accounts)},
            day, rejects, INCREMENTAL_FILES, batch_id))
    return DimensionReport(
        schema=schema, batch_id=batch_id,
        rows={"dimcustomer": customers.num_rows, "dimaccount": accounts.num_rows},
        sources=count_sources({"Customer.txt": customer_read.rows_in,
                               "Account.txt": account_read.rows_in}, rejects),
        seconds=round(time.perf_counter() - started, 3), ended=ended, steps=steps.seconds)


def _customers(spark: SparkSession, state: _State, read: sources.SourceRead, day: dt.date,
               batch_id: int) -> tuple[DataFrame, DataFrame]:
    """New DimCustomer versions from Customer.txt, and the rows refused."""
    rows = last_per_day(to_spark(spark, read.table, order=("cdc_dsn",))
                        .withColumn("effectivedate", F.lit(day)), ["c_id"], "effectivedate")
    statustype = state.statustype
    known = status_name("c_st_id", statustype).isNotNull()
    rejects = rejects_frame(
        rows.where(~known), read.source, batch_id,
        describe(("CDC_FLAG", "cdc_flag"), ("CDC_DSN", "cdc_dsn"), ("C_ID", "c_id"),
                 ("C_ST_ID", "c_st_id")),
        F.concat(F.lit("unknown C_ST_ID "), F.coalesce(F.col("c_st_id"), F.lit("(empty)"))))
    versions = (customer_columns(rows.where(known), state.taxrate, statustype, batch_id)
                .withColumn("enddate", F.lit(END_OF_TIME)).withColumn("iscurrent", F.lit(True)))
    return number(versions, "sk_customerid", ["customerid"],
                  state.last_sk["dimcustomer"]).select(
        *CUSTOMER_COLUMNS), rejects


def _accounts(spark: SparkSession, state: _State, read: sources.SourceRead,
              new_customers: DataFrame, day: dt.date, batch_id: int
              ) -> tuple[DataFrame, DataFrame]:
    """New DimAccount versions from Account.txt and from the customers' new versions."""
    statustype, brokers = state.statustype, state.brokers
    old_customers, old_accounts = state.customers, state.accounts
    keep = ["sk_customerid", "customerid", "status", "effectivedate", "enddate"]
    customers = (old_customers.join(new_customers.select("customerid"), "customerid",
                                    "left_anti").select(*keep)
                 .unionByName(new_customers.select(*keep)))
    rows = (last_per_day(to_spark(spark, read.table, order=("cdc_dsn",))
                         .withColumn("effectivedate", F.lit(day)), ["ca_id"], "effectivedate")
            .withColumnRenamed("ca_c_id", "owner"))
    owners = customers.select(F.col("customerid").alias("_owner"))
    broker_ids = brokers.where("iscurrent").select(F.col("brokerid").alias("_broker"))
    checked = (rows.join(F.broadcast(owners), F.col("owner") == F.col("_owner"), "left")
               .join(F.broadcast(broker_ids), F.col("ca_b_id") == F.col("_broker"), "left"))
    reason = (F.when(status_name("ca_st_id", statustype).isNull(),
                     F.concat(F.lit("unknown CA_ST_ID "),
                              F.coalesce(F.col("ca_st_id"), F.lit("(empty)"))))
              .when(F.col("_owner").isNull(),
                    F.concat(F.lit("no DimCustomer for CA_C_ID "),
                             F.coalesce(F.col("owner").cast("string"), F.lit("(empty)"))))
              .when(F.col("_broker").isNull(),
                    F.concat(F.lit("no DimBroker for CA_B_ID "),
                             F.coalesce(F.col("ca_b_id").cast("string"), F.lit("(empty)")))))
    checked = checked.withColumn("reason", reason)
    rejects = rejects_frame(
        checked.where(F.col("reason").isNotNull()), read.source, batch_id,
        describe(("CDC_FLAG", "cdc_flag"), ("CDC_DSN", "cdc_dsn"), ("CA_ID", "ca_id"),
                 ("CA_C_ID", "owner"), ("CA_B_ID", "ca_b_id")), F.col("reason"))
    columns = ["ca_id", "owner", "ca_b_id", "ca_name", "ca_tax_st", "ca_st_id", "effectivedate"]
    from_file = checked.where(F.col("reason").isNull()).select(*columns)
    # Accounts of customers with a new version that Account.txt does not mention.
    codes = {name: code for code, name in sorted(statustype.items(), reverse=True)}
    carried = (old_accounts
               .join(old_customers.select("sk_customerid", "customerid"), "sk_customerid")
               .join(new_customers.select("customerid"), "customerid", "left_semi")
               .join(from_file.select(F.col("ca_id").alias("accountid")), "accountid",
                     "left_anti")
               .join(brokers.select("sk_brokerid", "brokerid"), "sk_brokerid")
               .select(F.col("accountid").alias("ca_id"), F.col("customerid").alias("owner"),
                       F.col("brokerid").alias("ca_b_id"), F.col("accountdesc").alias("ca_name"),
                       F.col("taxstatus").cast("int").alias("ca_tax_st"),
                       status_name("status", codes).alias("ca_st_id"),
                       F.lit(day).alias("effectivedate")))
    versions = (account_rows(from_file.unionByName(carried), customers, brokers, statustype,
                             batch_id)
                .withColumn("enddate", F.lit(END_OF_TIME)).withColumn("iscurrent", F.lit(True)))
    return number(versions, "sk_accountid", ["accountid"],
                  state.last_sk["dimaccount"]).select(
        *ACCOUNT_COLUMNS), rejects

