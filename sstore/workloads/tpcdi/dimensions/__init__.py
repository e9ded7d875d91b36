"""TPC-DI dimensions for DimTrade, built in PySpark into the PostgreSQL warehouse.

``build_historical(spark, data_dir, url, schema)`` loads the reference tables (DimDate, DimTime,
StatusType, TradeType, Industry, TaxRate) and the Batch1 dimensions (DimBroker, DimCompany,
DimSecurity, DimCustomer, DimAccount); ``apply_batch(spark, data_dir, url, schema, batch_id)``
adds the versions of an incremental batch (Customer.txt, Account.txt). Both pipelines of
DimTrade (Spark mode and streaming mode) use them, so the tables are deterministic: the same
data set gives the same rows and surrogate keys on every run. Modules, one job each:

- ``frames``: Spark plumbing (Arrow in/out, same-day merging, version chains, keys)
- ``store``: PostgreSQL writes (binary COPY, one transaction per load)
- ``reference``, ``broker``, ``company``, ``security``: the tables from reference files,
  HR.csv and FINWIRE
- ``actions``, ``customer``, ``account``: CustomerMgmt.xml checked, DimCustomer, DimAccount
- ``historical``, ``incremental``: the two loads; ``report``: what they did
"""

from __future__ import annotations

from sstore.base.extras import needs

with needs("spark"):
    from .historical import build_historical
    from .incremental import apply_batch
from .report import DimensionReport, SourceCount
from .store import DimensionLoadError

__all__ = ["DimensionLoadError", "DimensionReport", "SourceCount", "apply_batch",
           "build_historical"]
