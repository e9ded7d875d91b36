"""**sstore_maintenance**: every 10 minutes, move an engine's output streams into PostgreSQL
and report how far each target is.

`migrate_streams` (`sstore.maintenance.migrate_streams`: what `sstore migrate` does, for every
target; exactly once, continuing from the watermarks) → `report_status` (the state file's
procedures, streams and errors; per target the stream's last batch, the watermark, whether the
target lags, its rows). The targets are the TPC-DI DimTrade sinks of `schema` unless the
`targets` parameter lists others. While another process has the state file open (a
`tpcdi_incremental` run), both tasks report "busy" and succeed: that run migrates its own.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

from sstore import maintenance
from sstore.airflow_errors import TASK_DEFAULTS, airflow_errors
from sstore.workloads.tpcdi import orchestration as etl

log = logging.getLogger(__name__)
PARAMS = ("data_dir", "state_path", "schema", "postgres_conn_id")


def settings() -> tuple[etl.Settings, list[maintenance.StreamTarget]]:
    """The run's settings and migration targets, from its parameters."""
    params = get_current_context()["params"]
    config = etl.Settings.from_params(params)
    return config, etl.maintenance_targets(config, params.get("targets"))


@dag(dag_id="sstore_maintenance", schedule=dt.timedelta(minutes=10),
     start_date=dt.datetime(2025, 1, 1, tzinfo=dt.UTC), catchup=False, max_active_runs=1,
     dagrun_timeout=dt.timedelta(minutes=9), default_args=TASK_DEFAULTS, tags=["sstore"],
     doc_md=__doc__,
     params={**{name: Param(**etl.PARAMS[name]) for name in PARAMS},
             "targets": Param(None, type=["null", "array"],
                              description='Streams to move, e.g. [{"stream": "s", "table": '
                                          '"public.s", "mode": "append", "key": []}]; '
                                          "empty: the TPC-DI sinks of schema.")})
def sstore_maintenance() -> None:
    @task
    @airflow_errors
    def migrate_streams() -> dict[str, Any]:
        """Move every committed batch the targets lack."""
        config, targets = settings()
        return maintenance.migrate_streams(config.state, config.url, targets).to_dict()

    @task
    @airflow_errors
    def report_status() -> dict[str, Any]:
        """Engine status and, per target, the lag of PostgreSQL."""
        config, targets = settings()
        report = maintenance.status_report(config.state, config.url, targets)
        log.info("%s", maintenance.format_report(report))
        return report

    migrate_streams() >> report_status()


sstore_maintenance()
