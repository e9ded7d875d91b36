"""**tpcdi_backfill**: rebuild intervals of the streamed DimTrade with Spark and swap them
into the PostgreSQL warehouse, one transaction per interval, with a version per interval.

`choose_batches` (one of: `batches`, each sealed by the stream, empty: every sealed batch;
`batch_range` "FIRST-LAST", all of it in ONE transaction; `from_date`/`to_date`, the trades
created and alerts raised on those days, rebuilt from every sealed batch; a batch the stream
has not finished, or two of these parameters at once, fail the run at once, nothing changed) →
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

PARAMS = ("data_dir", "schema", "postgres_conn_id", "spark_master", "batches", "batch_range",
          "from_date", "to_date")


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
    def choose_batches() -> dict[str, Any]:
        """The interval(s) to rebuild; refuses a batch the stream has not finished."""
        return etl.backfill_plan(settings(), get_current_context()["params"])

    @task
    @airflow_errors
    def backfill_batches(plan: dict[str, Any]) -> list[dict[str, Any]]:
        """Spark rebuild, then one swap transaction per batch (or for the range)."""
        return etl.backfill(settings(), plan)

    @task
    @airflow_errors
    def audit() -> dict[str, Any]:
        """The DimTrade audit of the batches loaded; fails the run if a check fails."""
        return etl.audit(settings())

    backfill_batches(choose_batches()) >> audit()


tpcdi_backfill()
