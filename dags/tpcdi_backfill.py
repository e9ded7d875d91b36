"""**tpcdi_backfill**: rebuild TPC-DI batches of the streamed DimTrade with Spark and swap them
into the PostgreSQL warehouse, one transaction per batch, with a version per batch.

`choose_batches` (the `batches` parameter, each sealed by the stream; empty: every sealed
batch; a batch the stream has not finished fails the run at once, nothing changed) →
`backfill_batches` (per batch: Spark replays its trades from the source files, the result is
staged by COPY, then the batch's DimTrade rows and alerts are replaced and its version in
`sstore.intervals` bumped, in one COMMIT; readers never see it half replaced; the stream may
keep loading later batches meanwhile) → `audit`.

Running it again writes the same rows and bumps the versions. See docs/tpcdi.md, "Backfill".
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

from sstore.airflow_errors import TASK_DEFAULTS, airflow_errors
from sstore.workloads.tpcdi import orchestration as etl

PARAMS = ("data_dir", "schema", "postgres_conn_id", "spark_master", "batches")


def settings() -> etl.Settings:
    """The run's settings, from its parameters and the warehouse connection."""
    return etl.Settings.from_params(get_current_context()["params"])


@dag(dag_id="tpcdi_backfill", schedule=None, start_date=dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
     catchup=False, max_active_runs=1, default_args=TASK_DEFAULTS, tags=["sstore", "tpcdi"],
     doc_md=__doc__,
     params={name: Param(**etl.PARAMS[name]) for name in PARAMS})
def tpcdi_backfill() -> None:
    @task
    @airflow_errors
    def choose_batches() -> list[int]:
        """The batches to rebuild; refuses one the stream has not finished."""
        return etl.backfill_batches_to_run(settings(),
                                           get_current_context()["params"]["batches"] or [])

    @task
    @airflow_errors
    def backfill_batches(batches: list[int]) -> list[dict[str, Any]]:
        """Spark rebuild, then one swap transaction per batch."""
        return etl.backfill(settings(), batches)

    @task
    @airflow_errors
    def audit() -> dict[str, Any]:
        """The DimTrade audit of the batches loaded; fails the run if a check fails."""
        return etl.audit(settings())

    backfill_batches(choose_batches()) >> audit()


tpcdi_backfill()
