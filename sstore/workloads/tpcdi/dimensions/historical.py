"""``build_historical``: every table Batch1 needs, from the Batch1 files, in one transaction.

Order follows the lookups: reference tables, DimBroker, DimCompany, DimSecurity (needs
DimCompany), the checked CustomerMgmt actions, DimCustomer, DimAccount (needs DimCustomer and
DimBroker). Each table is computed once in Spark and kept as Arrow (``frames.materialize``);
then one PostgreSQL transaction empties and refills them all and replaces the rejects of these
files (``store.replace_tables``). A failure anywhere leaves the warehouse as it was, and the
same data set always gives the same rows, surrogate keys included. Versions of later batches
go with the truncation: apply Batch2 and Batch3 again after a rebuild.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from os import PathLike
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from sstore.workloads.tpcdi import sources
from sstore.workloads.tpcdi.warehouse import create_warehouse, row_counts

from .account import dim_account
from .actions import accepted, check_actions, refused
from .broker import dim_broker
from .company import dim_company
from .customer import dim_customer
from .frames import FIRST_DAY, collect_rejects, materialize
from .reference import REFERENCE, reference_table
from .report import DimensionReport, Steps, count_sources
from .security import dim_security
from .store import replace_tables

#: The source files whose rejects the dimension loads own (a regex on the path): a rebuild
#: replaces them all, since it also drops the versions of later batches.
DIMENSION_FILES = (r"(^|/)(Date\.txt|Time\.txt|StatusType\.txt|TradeType\.txt|Industry\.txt|"
                   r"TaxRate\.txt|HR\.csv|CustomerMgmt\.xml|FINWIRE(\d{4}Q[1-4])?|"
                   r"Customer\.txt|Account\.txt|BatchDate\.txt)$")
_READERS = {"dimdate": ("Date.txt", sources.read_date),
            "dimtime": ("Time.txt", sources.read_time),
            "statustype": ("StatusType.txt", sources.read_status_type),
            "tradetype": ("TradeType.txt", sources.read_trade_type),
            "industry": ("Industry.txt", sources.read_industry),
            "taxrate": ("TaxRate.txt", sources.read_tax_rate)}
TABLES = (*REFERENCE, "dimbroker", "dimcompany", "dimsecurity", "dimcustomer", "dimaccount")
#: Tables later jobs look up: kept as DataFrames over their computed rows.
_LOOKED_UP = frozenset({"industry", "taxrate", "dimbroker", "dimcompany", "dimcustomer"})


def _first_day(dates: pa.Table) -> dt.date:
    first = pc.min(dates["datevalue"]).as_py() if dates.num_rows else None
    return first or FIRST_DAY


def build_historical(spark: SparkSession, data_dir: str | PathLike[str], url: str,
                     schema: str = "tpcdi") -> DimensionReport:
    """Load the reference tables and the Batch1 dimensions from ``data_dir/Batch1`` into the
    warehouse ``schema`` at ``url`` (created if missing); re-runnable."""
    started = time.perf_counter()
    steps = Steps()
    batch1 = Path(data_dir) / "Batch1"
    steps.run("create warehouse", lambda: create_warehouse(url, schema))
    rows_in: dict[str, int] = {}
    tables: dict[str, pa.Table] = {}
    frames: dict[str, DataFrame] = {}
    rejects: list[pa.Table | DataFrame] = []

    def read(name: str, reader: Callable[[Path], sources.SourceRead]) -> sources.SourceRead:
        got = steps.run(f"read {name}", lambda: reader(batch1 / name))
        rows_in[name] = got.rows_in
        rejects.append(got.rejects)
        return got

    def keep(table: str, df: DataFrame, rule_rejects: DataFrame | None = None) -> None:
        tables[table], refused_rows, frame = steps.run(table, lambda: materialize(
            spark, df, rule_rejects, lookup=table in _LOOKED_UP))
        rejects.append(refused_rows)
        if frame is not None:
            frames[table] = frame

    for table, (name, reader) in _READERS.items():
        keep(table, *reference_table(spark, table, read(name, reader)))
    statustype = {r["st_id"]: r["st_name"] for r in tables["statustype"].to_pylist()}

    keep("dimbroker", *dim_broker(spark, read("HR.csv", sources.read_hr),
                                  _first_day(tables["dimdate"])))

    finwire = steps.run("read FINWIRE", lambda: sources.read_finwire(batch1))
    rows_in["FINWIRE"] = finwire.rows_in
    rejects.append(finwire.rejects)
    fw_source = str(batch1 / "FINWIRE")
    keep("dimcompany", *dim_company(spark, finwire.cmp, frames["industry"], statustype,
                                    fw_source))
    keep("dimsecurity", *dim_security(spark, finwire.sec, frames["dimcompany"], statustype,
                                      fw_source))

    mgmt = read("CustomerMgmt.xml", sources.read_customer_mgmt)
    _, _, checked = steps.run("customer actions", lambda: materialize(
        spark, check_actions(spark, mgmt, frames["dimbroker"]), lookup=True))
    rejects.append(refused(checked, mgmt.source))
    actions = accepted(checked)
    keep("dimcustomer", dim_customer(actions, frames["taxrate"], statustype))
    keep("dimaccount", dim_account(actions, frames["dimcustomer"], frames["dimbroker"],
                                   statustype))

    all_rejects = steps.run("rejects", lambda: collect_rejects(rejects))
    steps.run("write", lambda: replace_tables(url, schema, {t: tables[t] for t in TABLES},
                                              all_rejects, DIMENSION_FILES))
    counts = row_counts(url, schema)
    return DimensionReport(schema=schema, batch_id=1,
                           rows={t: counts.get(t, 0) for t in TABLES},
                           sources=count_sources(rows_in, all_rejects),
                           seconds=round(time.perf_counter() - started, 3),
                           steps=steps.seconds)

