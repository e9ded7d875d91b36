"""**tpcdi_historical**: the TPC-DI historical load (Batch1) into the PostgreSQL warehouse.

`prepare_source` (generate the data set when `data_dir` has none) → `create_warehouse` →
`build_dimensions` (PySpark: reference tables, DimBroker, DimCompany, DimSecurity, DimCustomer,
DimAccount) → `load_trades` (PySpark: Batch1's DimTrade and DImessages) → `audit` (TPC-DI
Appendix A, Batch1's numbers).

Each task calls one step of `sstore.workloads.tpcdi.orchestration`; every step may run again
(the dimension load is deterministic, the trade load is guarded by a watermark). Trigger it by
hand; then run `tpcdi_incremental`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, chain, dag, get_current_context, task

from sstore.airflow_errors import TASK_DEFAULTS, airflow_errors
from sstore.workloads.tpcdi import orchestration as etl

PARAMS = ("data_dir", "scale_factor", "seed", "schema", "postgres_conn_id", "spark_master",
          "state_path", "rebuild")


def settings() -> etl.Settings:
    """The run's settings, from its parameters and the warehouse connection."""
    return etl.Settings.from_params(get_current_context()["params"])


@dag(dag_id="tpcdi_historical", schedule=None, start_date=dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
     catchup=False, max_active_runs=1, default_args=TASK_DEFAULTS, tags=["sstore", "tpcdi"],
     doc_md=__doc__,
     params={name: Param(**etl.PARAMS[name]) for name in PARAMS})
def tpcdi_historical() -> None:
    @task
    @airflow_errors
    def prepare_source() -> dict[str, Any]:
        """Locate the TPC-DI data set, or generate it."""
        return etl.prepare_source(settings())

    @task
    @airflow_errors
    def create_warehouse() -> dict[str, Any]:
        """Create the warehouse schema (dropped first when `rebuild`)."""
        return etl.create_warehouse(settings(), bool(get_current_context()["params"]["rebuild"]))

    @task
    @airflow_errors
    def build_dimensions() -> dict[str, Any]:
        """Reference tables and Batch1 dimensions, in PySpark."""
        return etl.build_dimensions(settings())

    @task
    @airflow_errors
    def load_trades() -> dict[str, Any]:
        """Batch1's DimTrade and DImessages, in PySpark."""
        return etl.load_historical_trades(settings())

    @task
    @airflow_errors
    def audit() -> dict[str, Any]:
        """The DimTrade audit of the batches loaded; fails the run if a check fails."""
        return etl.audit(settings())

    chain(prepare_source(), create_warehouse(), build_dimensions(), load_trades(), audit())


tpcdi_historical()
