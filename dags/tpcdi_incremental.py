"""**tpcdi_incremental**: the TPC-DI incremental batches (Batch2, Batch3, ...) through the
sstore engine's streaming DimTrade dataflow into the PostgreSQL warehouse.

`locate_batches` (every `BatchN/` directory with N ≥ 2) → `stream_batches` (per batch, in
order: its DimCustomer/DimAccount changes in PySpark, then its Trade.txt through the five
stored procedures; sinks move the results into the warehouse exactly once) → `migrate_streams`
(catch-up of whatever the engine holds that the warehouse lacks) → `audit` (all batches loaded).

Run `tpcdi_historical` first. Running this again changes nothing: engine batch-ids come from
the data, the engine's state file remembers what it took, and watermark rows in PostgreSQL
what the warehouse has.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

from sstore.airflow_errors import TASK_DEFAULTS, airflow_errors
from sstore.workloads.tpcdi import orchestration as etl

PARAMS = ("data_dir", "schema", "postgres_conn_id", "spark_master", "state_path", "batch_size")


def settings() -> etl.Settings:
    """The run's settings, from its parameters and the warehouse connection."""
    return etl.Settings.from_params(get_current_context()["params"])


@dag(dag_id="tpcdi_incremental", schedule=None, start_date=dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
     catchup=False, max_active_runs=1, default_args=TASK_DEFAULTS, tags=["sstore", "tpcdi"],
     doc_md=__doc__,
     params={name: Param(**etl.PARAMS[name]) for name in PARAMS})
def tpcdi_incremental() -> None:
    @task
    @airflow_errors
    def locate_batches() -> list[int]:
        """The incremental batch numbers of the data set."""
        return etl.incremental_batches(settings())

    @task
    @airflow_errors
    def stream_batches(batches: list[int]) -> list[dict[str, Any]]:
        """Dimension changes, then trades through the engine, batch by batch."""
        return etl.stream_batches(settings(), batches)

    @task
    @airflow_errors
    def migrate_streams() -> dict[str, Any]:
        """Move what the engine's output streams hold that the warehouse lacks."""
        return etl.migrate(settings())

    @task
    @airflow_errors
    def audit() -> dict[str, Any]:
        """The DimTrade audit of the batches loaded; fails the run if a check fails."""
        return etl.audit(settings())

    streamed = stream_batches(locate_batches())
    streamed >> migrate_streams() >> audit()


tpcdi_incremental()
