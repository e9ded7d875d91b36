"""The Airflow DAGs in dags/: they import cleanly, and each one runs end to end with
``dag.test()`` against the real PostgreSQL (a fresh database per test) and local Spark.

Airflow reads its configuration when first imported, so the module fixture sets AIRFLOW_HOME
(a temporary directory with a SQLite metadata database) before anything imports it; nothing in
this module imports Airflow at collection time. ``dag.test()`` runs the tasks in this process,
so they share the session's Spark.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from sstore import Engine
from sstore.workloads.tpcdi.audit import load_facts
from sstore.workloads.tpcdi.warehouse import TABLES

DAGS = Path(__file__).resolve().parents[2] / "dags"
EXPECTED = {
    "tpcdi_historical": ["prepare_source", "create_warehouse", "build_dimensions",
                         "load_trades", "audit"],
    "tpcdi_incremental": ["locate_batches", "stream_batches", "migrate_streams", "audit"],
    "sstore_maintenance": ["migrate_streams", "report_status"],
    "tpcdi_backfill": ["choose_batches", "backfill_batches", "audit"],
}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Airflow configured for this module (metadata DB migrated), and its DagBag of dags/."""
    home = tmp_path_factory.mktemp("airflow_home")
    env = {"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db"}
    if "airflow" in sys.modules and os.environ.get("AIRFLOW_HOME") != str(home):
        pytest.fail("airflow was imported before its test environment was set")
    patch = pytest.MonkeyPatch()
    for name, value in env.items():
        patch.setenv(name, value)
    # Airflow configures logging on import (root at INFO, its own handlers): undone afterwards,
    # so later tests (and Spark's py4j at exit) log as before
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    from airflow.models import DagBag
    from airflow.utils import db

    db.resetdb()
    yield DagBag(dag_folder=str(DAGS))
    patch.undo()
    root.handlers[:] = handlers
    root.setLevel(level)


def run(bag: Any, dag_id: str, **conf: Any) -> Any:
    """One ``dag.test()`` run with ``conf`` as its parameters; the DagRun, asserted done."""
    dagrun = bag.get_dag(dag_id).test(run_conf=conf)
    states = {ti.task_id: str(ti.state) for ti in dagrun.get_task_instances()}
    assert str(dagrun.state) == "success", f"{dag_id}: {states}"
    assert set(states) == set(EXPECTED[dag_id])
    return dagrun


def result(dagrun: Any, task_id: str) -> Any:
    """What a task of the run returned (its XCom)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(XComModel.get_many(
            run_id=dagrun.run_id, dag_ids=dagrun.dag_id, task_ids=task_id,
            key="return_value")).first()
        assert row is not None, f"{task_id} returned nothing"
        return XComModel.deserialize_value(row)


def snapshot(url: str, schema: str) -> dict[str, list[tuple]]:
    """Every warehouse table, sorted on all columns, and the watermark rows."""
    out: dict[str, list[tuple]] = {}
    with psycopg.connect(url) as con:
        for table in TABLES:
            columns = con.execute(
                "SELECT count(*) FROM information_schema.columns WHERE table_schema = %s AND "
                "table_name = %s", (schema, table)).fetchone()[0]
            order = ", ".join(str(i) for i in range(1, columns + 1))
            out[table] = con.execute(f"SELECT * FROM {schema}.{table} ORDER BY {order}"
                                     ).fetchall()
        out["watermarks"] = con.execute("SELECT source, target, batch_id, rows_total FROM "
                                        "sstore.watermarks ORDER BY 1, 2").fetchall()
    return out


def test_every_dag_imports_with_its_tasks(airflow: Any) -> None:
    assert airflow.import_errors == {}
    assert set(airflow.dag_ids) == set(EXPECTED)
    for dag_id, tasks in EXPECTED.items():
        dag = airflow.get_dag(dag_id)
        assert sorted(dag.task_ids) == sorted(tasks)
        assert dag.catchup is False and dag.max_active_runs == 1
        dag.check_cycle()
        assert "postgres_conn_id" in dag.params and "schema" in dag.params
    assert airflow.get_dag("tpcdi_historical").get_task("audit").upstream_task_ids == \
        {"load_trades"}
    assert airflow.get_dag("tpcdi_incremental").get_task("stream_batches").upstream_task_ids \
        == {"locate_batches"}
    assert airflow.get_dag("sstore_maintenance").schedule == dt.timedelta(minutes=10)
    assert airflow.get_dag("tpcdi_backfill").get_task("audit").upstream_task_ids == \
        {"backfill_batches"}


def test_tpcdi_dags_load_the_warehouse_exactly_once(airflow: Any, spark: Any, pg_url: str,
                                                    tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # the warehouse comes from the Airflow connection the DAGs default to
    monkeypatch.setenv("AIRFLOW_CONN_SSTORE_WAREHOUSE", pg_url)
    monkeypatch.delenv("SSTORE_POSTGRES_URL", raising=False)
    data, state = tmp_path / "tpcdi", str(tmp_path / "state.duckdb")
    conf = {"data_dir": str(data), "state_path": state, "schema": "dw"}

    # historical: the data set is generated (the directory is empty), Spark loads Batch1
    historical = run(airflow, "tpcdi_historical", scale_factor=0.01, seed=11, **conf)
    assert result(historical, "prepare_source") == {"data_dir": str(data), "generated": True,
                                                    "batches": [1, 2, 3]}
    loaded = result(historical, "load_trades")
    facts = load_facts(pg_url, "dw", data)
    assert loaded["trades_inserted"] == facts.total("T_NEW", 1) > 0
    audit = result(historical, "audit")
    assert audit["ok"] and audit["batches"] == [1] and audit["passed"] > 15
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT count(*) FROM dw.dimtrade").fetchone()[0] == \
            facts.total("T_NEW", 1)

    # incremental: Batch2 and Batch3 through the engine, on top of Spark's Batch1
    incremental = run(airflow, "tpcdi_incremental", batch_size=5, **conf)
    assert result(incremental, "locate_batches") == [2, 3]
    streamed = result(incremental, "stream_batches")
    assert [b["batch"] for b in streamed] == [2, 3]
    assert all(b["events"] > 0 and b["engine_batches"] > 1 for b in streamed)
    audit = result(incremental, "audit")
    assert audit["ok"] and audit["batches"] == [1, 2, 3] and audit["failed"] == []
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT count(*) FROM dw.dimtrade").fetchone()[0] == \
            facts.total("T_NEW")
    loaded_once = snapshot(pg_url, "dw")

    # again: nothing is sent twice, the warehouse stays as it was
    again = run(airflow, "tpcdi_incremental", batch_size=7, **conf)
    assert [(b["batch"], b["events"], b["engine_batches"])
            for b in result(again, "stream_batches")] == [(2, 0, 0), (3, 0, 0)]
    assert result(again, "migrate_streams")["rows"] == 0
    assert snapshot(pg_url, "dw") == loaded_once

    # maintenance on the same state file: nothing to move, every target up to date
    upkeep = run(airflow, "sstore_maintenance", data_dir=str(data), state_path=state,
                 schema="dw")
    assert result(upkeep, "migrate_streams")["status"] == "migrated"
    report = result(upkeep, "report_status")
    assert report["status"] == "ok"
    assert [t["behind"] for t in report["targets"]] == [False, False, False]
    assert report["targets"][0]["rows"] == facts.total("T_NEW")
    assert snapshot(pg_url, "dw") == loaded_once

    # backfill: Batch1 came from Spark's bulk load, not the stream: refused at once, nothing
    # changed; Batch2 rebuilt by Spark and swapped in: the same rows, version 2
    refused = airflow.get_dag("tpcdi_backfill").test(
        run_conf={"data_dir": str(data), "schema": "dw", "batches": [1, 2]})
    assert str(refused.state) == "failed"
    chosen = {ti.task_id: ti for ti in refused.get_task_instances()}["choose_batches"]
    assert str(chosen.state) == "failed" and chosen.try_number == 1
    filled = run(airflow, "tpcdi_backfill", data_dir=str(data), schema="dw", batches=[2])
    assert result(filled, "choose_batches") == {"batches": [2], "batch_range": None,
                                                "dates": None}
    [done] = result(filled, "backfill_batches")
    assert (done["batch"], done["version"]) == (2, 2)
    assert [t["table"] for t in done["tables"]] == ["dw.dimtrade", "dw.dimessages"]
    assert all(t["rows_deleted"] == t["rows_inserted"] == t["rows_after"] > 0
               for t in done["tables"])
    assert result(filled, "audit")["ok"]
    assert snapshot(pg_url, "dw") == loaded_once

    # a batch range in one transaction; two ways of naming the interval at once: refused
    both = airflow.get_dag("tpcdi_backfill").test(
        run_conf={"data_dir": str(data), "schema": "dw", "batches": [2],
                  "from_date": "2017-07-07", "to_date": "2017-07-08"})
    assert str(both.state) == "failed"
    # (dag.test keeps the previous run's conf in the DAG's params: the others reset here)
    ranged = run(airflow, "tpcdi_backfill", data_dir=str(data), schema="dw", batch_range="2-3",
                 batches=[], from_date="", to_date="")
    [done] = result(ranged, "backfill_batches")
    assert done["versions"] == {"batch 2": 3, "batch 3": 2}
    assert snapshot(pg_url, "dw") == loaded_once


def test_maintenance_moves_what_an_engine_left_behind(airflow: Any, pg_url: str,
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    state = str(tmp_path / "readings.duckdb")
    engine = Engine(state)
    engine.stream("readings", {"id": "BIGINT", "value": "DOUBLE"})
    engine.hold("readings", "migrator:public.readings")  # as an attached sink would
    for batch in range(3):
        engine.ingest("readings", pa.table({"id": [batch * 10 + i for i in range(10)],
                                            "value": [0.5 * i for i in range(10)]}))
    engine.close()
    conf = {"state_path": state, "postgres_conn_id": "no_such_connection",
            "targets": [{"stream": "readings", "table": "public.readings"}]}
    monkeypatch.setenv("SSTORE_POSTGRES_URL", pg_url)  # no such connection: the env decides
    first = run(airflow, "sstore_maintenance", **conf)
    second = run(airflow, "sstore_maintenance", **conf)
    assert result(first, "migrate_streams")["rows"] == 30
    assert result(second, "migrate_streams")["rows"] == 0
    [target] = result(second, "report_status")["targets"]
    assert (target["last_batch"], target["watermark"], target["behind"], target["rows"]) == \
        (3, 3, False, 30)
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT count(DISTINCT id) FROM public.readings").fetchone()[0] == 30


# -- errors: terminal fails the task at once, transient is Airflow's to retry ------------------
def test_every_task_maps_errors_and_has_retries(airflow: Any) -> None:
    for dag_id in EXPECTED:
        for task in airflow.get_dag(dag_id).tasks:
            assert task.retries >= 1, f"{dag_id}.{task.task_id} has no retries"
            assert getattr(task.python_callable, "maps_sstore_errors", False), \
                f"{dag_id}.{task.task_id} is not wrapped in sstore.airflow_errors"


def test_a_terminal_error_fails_the_task_without_retries(airflow: Any, tmp_path: Path) -> None:
    """No data set: ``locate_batches`` raises FileNotFoundError (terminal), so the task fails
    on its first try although it has retries, and the run fails."""
    empty = tmp_path / "no_data"
    empty.mkdir()
    dag = airflow.get_dag("tpcdi_incremental")
    dagrun = dag.test(run_conf={"data_dir": str(empty), "state_path": str(tmp_path / "s.duckdb"),
                                "schema": "dw"})
    assert str(dagrun.state) == "failed"
    tis = {ti.task_id: ti for ti in dagrun.get_task_instances()}
    located = tis["locate_batches"]
    assert str(located.state) == "failed" and located.try_number == 1
    assert dag.get_task("locate_batches").retries == 2
    assert {str(tis[t].state) for t in ("stream_batches", "migrate_streams", "audit")} == \
        {"upstream_failed"}


def test_airflow_errors_maps_real_sstore_errors(airflow: Any, tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from migrators.errors import PostgresUnavailable
    from migrators.postgres import connect
    from sstore.airflow_errors import airflow_errors
    from sstore.base.errors import DeclarationError
    from sstore.base.retry import GaveUp, RetryPolicy, call
    from sstore.execution.stopping import Stopped
    from sstore.maintenance import StreamTarget
    from sstore.workloads.tpcdi import orchestration as etl

    def unreachable() -> None:
        connect("postgresql://postgres@127.0.0.1:1/postgres")  # nothing listens on port 1

    def keeps_failing() -> None:
        call(unreachable, RetryPolicy(attempts=2, first_delay=0.01), "reach PostgreSQL")

    def bad_target() -> None:
        StreamTarget("s", "public.s", mode="merge")  # merge without a key

    def no_data() -> None:
        etl.incremental_batches(etl.Settings(data_dir=str(tmp_path)))

    def stopping() -> None:
        raise Stopped("stopped")

    with pytest.raises(PostgresUnavailable):  # transient: Airflow retries the task
        airflow_errors(unreachable)()
    with pytest.raises(GaveUp):
        airflow_errors(keeps_failing)()
    for terminal, cause in ((bad_target, DeclarationError), (no_data, FileNotFoundError)):
        with pytest.raises(AirflowFailException, match="terminal, not retried") as failed:
            airflow_errors(terminal)()
        assert isinstance(failed.value.__cause__, cause)
    with pytest.raises(Stopped):
        airflow_errors(stopping)()
