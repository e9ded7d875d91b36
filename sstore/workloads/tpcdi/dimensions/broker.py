"""DimBroker from HR.csv: the employees with EmployeeJobCode 314, one row each, never changed.

EffectiveDate is the first DimDate date (1950-01-01), EndDate 9999-12-31, IsCurrent true,
BatchID 1. SK_BrokerID numbers the brokers in BrokerID order. An EmployeeID that appears on
several lines keeps its last line; the earlier ones are rejected.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sstore.workloads.tpcdi.sources import SourceRead

from .frames import END_OF_TIME, FIRST_DAY, number, to_spark
from .reference import unique_rows

BROKER_JOB_CODE = 314
COLUMNS = ("sk_brokerid", "brokerid", "managerid", "firstname", "lastname", "middleinitial",
           "branch", "office", "phone", "iscurrent", "batchid", "effectivedate", "enddate")


def dim_broker(spark: SparkSession, hr: SourceRead, first_day: dt.date = FIRST_DAY
               ) -> tuple[DataFrame, DataFrame]:
    """DimBroker rows and the HR lines rejected for a duplicate EmployeeID."""
    employees, rejects = unique_rows(to_spark(spark, hr.table, order=()), ["employeeid"],
                                     hr.source, 1, "EmployeeID")
    brokers = employees.where(F.col("employeejobcode") == BROKER_JOB_CODE).select(
        F.col("employeeid").alias("brokerid"),
        F.col("managerid"),
        F.col("employeefirstname").alias("firstname"),
        F.col("employeelastname").alias("lastname"),
        F.col("employeemi").alias("middleinitial"),
        F.col("employeebranch").alias("branch"),
        F.col("employeeoffice").alias("office"),
        F.col("employeephone").alias("phone"),
        F.lit(True).alias("iscurrent"),
        F.lit(1).alias("batchid"),
        F.lit(first_day).alias("effectivedate"),
        F.lit(END_OF_TIME).alias("enddate"))
    return number(brokers, "sk_brokerid", ["brokerid"]).select(*COLUMNS), rejects
