"""``--mode spark-streaming``: the DimTrade dataflow on Spark Structured Streaming.

Its warehouse equals the engine mode's row for row (DimTrade, DImessages, the rejected lines),
and a query restarted from its checkpoint that re-runs a micro-batch the warehouse already
committed writes nothing twice (batchId in the watermark, ``migrators.delivery``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from sstore.cli import main
from sstore.workloads.tpcdi import dimensions
from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.spark_streaming.query import BATCH_STREAM
from sstore.workloads.tpcdi.spark_streaming.run import (
    ResumeMismatch,
    SparkStreamingDimTrade,
)
from sstore.workloads.tpcdi.streaming.events import batch1_events
from sstore.workloads.tpcdi.streaming.pipeline import StreamingDimTrade
from sstore.workloads.tpcdi.warehouse import TABLES, create_warehouse
from tests.conftest import SPARK_TEST_JVM_OPTIONS, WarehouseServer

BATCH_SIZE = 1500
# Batch3 lines each mode must reject: an update of a trade that never existed, an unknown
# status, an unparsable time, an unknown symbol
BAD_LINES = (
    "U|999001|99999991|2017-07-09 10:06:00|CMPT|TLB|1|AAAAAAAAAAAABEC|100|10.50|7||10.40|1|1|1",
    "I|999002|99999992|2017-07-09 10:00:00|XXXX|TLB|1|AAAAAAAAAAAABEC|100|10.50|7|Ann||||",
    "I|999003|99999993|2017-07-09 25:00:00|PNDG|TLB|1|AAAAAAAAAAAABEC|100|10.50|7|Ann||||",
    "I|999004|99999994|2017-07-09 10:00:00|PNDG|TLB|1|NO-SUCH-SYMBOL|100|10.50|7|Ann||||",
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tpcdi")
    generate(0.01, out, seed=11)
    with open(out / "Batch3" / "Trade.txt", "a", encoding="utf-8", newline="") as f:
        f.write("".join(line + "\r\n" for line in BAD_LINES))
    return out


def rows(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url) as con:
        return con.execute(sql).fetchall()


#: The warehouse tables the engine and Spark Structured Streaming must fill alike, with the
#: columns compared (a reject's reason is worded by each engine) and a total order
COMPARED = (("dimtrade", "*", "tradeid"), ("dimessages", "*", "messagedata, batchid"),
            ("rejects", "source_file, batch_id, line_number, raw_line",
             "batch_id, source_file, line_number"))


#: the historical dimensions as ``engine_warehouse`` built them, kept in the template database
#: for the twins (dropped from each copy once its twin has them)
HISTORICAL = "historical_dimensions"


def engine_warehouse(spark, data: Path, url: str, tmp_path: Path) -> None:
    """The engine mode's warehouse in ``tpcdi_engine``, and in ``HISTORICAL`` the historical
    dimensions it started from (the same job every mode runs, once)."""
    for schema in ("tpcdi_engine", HISTORICAL):
        create_warehouse(url, schema)
    dimensions.build_historical(spark, data, url, "tpcdi_engine")
    with psycopg.connect(url) as con:
        for table in TABLES:
            con.execute(f"INSERT INTO {HISTORICAL}.{table} OVERRIDING SYSTEM VALUE "
                        f"SELECT * FROM tpcdi_engine.{table}")
    engine = StreamingDimTrade(data, url, str(tmp_path / "state.duckdb"), "tpcdi_engine",
                               batch_size=BATCH_SIZE)
    try:
        engine.refresh_lookups()
        with engine.attached():
            engine.stream(batch1_events(data), "historical (Batch1)")
        for batch in (2, 3):
            engine.run_incremental(batch, spark)
    finally:
        engine.close()


def _admin(server: WarehouseServer) -> str:
    auth = server.user + (f":{server.password}" if server.password else "")
    return f"postgresql://{auth}@{server.host}:{server.port}"


@pytest.fixture(scope="module")
def engine_template(spark, data: Path, warehouse_server: WarehouseServer,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database holding ``engine_warehouse``, built once for the module (its dimensions and
    its engine run take as long as a test's Spark run); each test gets a copy of it
    (``engine_and_twin``). Its name is per process, as pytest-postgresql's databases are."""
    name = f"sstore_test_{os.getpid()}_engine"
    admin = _admin(warehouse_server)
    with psycopg.connect(f"{admin}/postgres", autocommit=True) as con:
        con.execute(f"DROP DATABASE IF EXISTS {name}")
        con.execute(f"CREATE DATABASE {name}")
    try:
        engine_warehouse(spark, data, f"{admin}/{name}", tmp_path_factory.mktemp("engine"))
        yield name
    finally:
        with psycopg.connect(f"{admin}/postgres", autocommit=True) as con:
            con.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def engine_and_twin(engine_template: str, warehouse_server: WarehouseServer,
                    request: pytest.FixtureRequest) -> Iterator[Callable[[str], str]]:
    """``(twin) -> url``: a database of the test's own, a copy of the template: the engine
    mode's warehouse in ``tpcdi_engine``, and ``twin`` with the same historical dimensions and
    nothing else (the state ``engine_warehouse`` once left in a fresh database per test)."""
    admin = _admin(warehouse_server)
    name = f"{engine_template}_{request.node.name[:20].lower()}"
    made: list[str] = []

    def make(twin: str) -> str:
        with psycopg.connect(f"{admin}/postgres", autocommit=True) as con:
            con.execute(f"DROP DATABASE IF EXISTS {name}")
            # the template's sessions are gone (engine, sinks, Spark's JDBC): else this waits
            con.execute(f"CREATE DATABASE {name} TEMPLATE {engine_template}")
        made.append(name)
        url = f"{admin}/{name}"
        create_warehouse(url, twin)
        with psycopg.connect(url) as con:
            for table in TABLES:
                con.execute(f"INSERT INTO {twin}.{table} OVERRIDING SYSTEM VALUE "
                            f"SELECT * FROM {HISTORICAL}.{table}")
            con.execute(f"DROP SCHEMA {HISTORICAL} CASCADE")
        return url

    yield make
    with psycopg.connect(f"{admin}/postgres", autocommit=True) as con:
        for made_name in made:
            con.execute(f"DROP DATABASE IF EXISTS {made_name} WITH (FORCE)")


def assert_equals_the_engine(pg_url: str, schema: str) -> None:
    for table, columns, order in COMPARED:
        want = rows(pg_url, f"SELECT {columns} FROM tpcdi_engine.{table} ORDER BY {order}")
        got = rows(pg_url, f"SELECT {columns} FROM {schema}.{table} ORDER BY {order}")
        assert want, f"{table} is empty"
        assert got == want, f"{table} differs between the engine and {schema}"
    # the four bad lines, each with a reason (its wording is the engines' one difference)
    refused = rows(pg_url, f"SELECT raw_line, reason FROM {schema}.rejects WHERE batch_id = 3")
    assert sorted(line for line, _ in refused) == sorted(BAD_LINES)
    assert all(reason for _, reason in refused)


def test_spark_streaming_resumes_exactly_once_and_equals_the_engine(
        spark, data: Path, engine_and_twin: Callable[[str], str], tmp_path: Path) -> None:
    os.environ.pop("SSTORE_SPARK_MASTER", None)  # the mode's default, local[2], as the fixture
    pg_url = engine_and_twin("tpcdi_sss")

    # Batch1 only (its dimensions are there: not built again), then a crash between the
    # sink's COMMIT and the checkpoint's commit log: the last micro-batch is in PostgreSQL,
    # but Spark does not know it finished
    workdir = tmp_path / "sss"
    first = SparkStreamingDimTrade(data, pg_url, workdir, "tpcdi_sss", BATCH_SIZE, spark=spark,
                                   batches=(1,))
    try:
        report = first.run()
    finally:
        first.close()
    assert report.micro_batches >= 2 and report.replayed_batches == 0
    assert report.phases["dimensions (Spark)"] < 5  # skipped
    commits = workdir / "query" / "checkpoint" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)  # Hadoop's checksum of that file
    with psycopg.connect(pg_url) as con:
        watermark = con.execute("SELECT batch_id FROM sstore.watermarks WHERE stream = %s",
                                (BATCH_STREAM,)).fetchall()
    assert watermark == [(last + 1,)]  # Spark's batchId counts from 0, watermarks from 1

    with pytest.raises(ResumeMismatch, match="batch-size 1500"):
        SparkStreamingDimTrade(data, pg_url, workdir, "tpcdi_sss", 999, spark=spark)

    # resumed by the command: Spark re-runs the last micro-batch (skipped by its batchId),
    # the files already dropped are not dropped again, Batch2 and Batch3 follow
    result = CliRunner().invoke(main, [
        "tpcdi", "run", "--mode", "spark-streaming", "--input", str(data), "--postgres", pg_url,
        "--schema", "tpcdi_sss", "--checkpoint", str(workdir), "--batch-size", str(BATCH_SIZE),
        "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    resumed = json.loads(result.stdout[result.stdout.index("{"):])
    assert resumed["mode"] == "spark-streaming"
    assert resumed["replayed_batches"] == 1, resumed
    assert resumed["files_dropped"] == 2, resumed  # Batch2 and Batch3: one file each

    assert_equals_the_engine(pg_url, "tpcdi_sss")


def test_a_second_checkpoint_into_the_same_table_is_refused(spark, pg_url: str,
                                                            tmp_path: Path) -> None:
    """A new checkpoint numbers its micro-batches from 0 again: were it taken for the first
    one, its batches would be skipped as replays and lost. The protocol refuses it instead."""
    import pyarrow as pa

    from migrators import delivery, watermarks
    from sstore.workloads.tpcdi.spark_streaming.query import (
        SOURCE,
        StreamingQueryFailed,
        StructuredStreamingDimTrade,
    )
    from sstore.workloads.tpcdi.streaming.events import LINE_SCHEMA

    create_warehouse(pg_url, "tpcdi")
    with psycopg.connect(pg_url) as con:  # a first query delivered micro-batches 1..5
        watermarks.ensure_watermarks(con)
        first = delivery.SinkKey(f"{SOURCE} first-checkpoint", BATCH_STREAM, "tpcdi.dimtrade")
        delivery.deliver(con, first, 1, 5, lambda cur, _watermark: 0, after=None)
    job = StructuredStreamingDimTrade(spark, tmp_path, pg_url, "tpcdi", str(tmp_path / "q2"),
                                      "second_checkpoint")
    try:
        line = "I|1|7|2017-07-08 10:00:00|PNDG|TLB|1|SYMB|100|10.50|42|Ann||||"
        job.drop(pa.table({"line": [line], "line_no": [1], "source": ["Trade.txt"],
                           "tpcdi_batch": [2]}, schema=LINE_SCHEMA), "b2-0000000001.txt")
        with pytest.raises(StreamingQueryFailed, match="from another source"):
            job.wait_all()
    finally:
        job.close()
    assert rows(pg_url, "SELECT count(*) FROM tpcdi.dimtrade") == [(0,)]
    with psycopg.connect(pg_url) as con:  # no watermark row for the second checkpoint
        assert con.execute("SELECT count(*) FROM sstore.watermarks WHERE stream = %s",
                           (BATCH_STREAM,)).fetchone() == (1,)


# -- a standalone Spark cluster (master + one worker) as real processes, without Docker --------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    """The process and everything it started (the worker's executors and their Python
    workers share its process group): TERM, then KILL what is left."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


@dataclass(frozen=True)
class SparkCluster:
    master: str  # spark://127.0.0.1:<port>
    ui: str      # the master's web UI; its /json/ lists workers and applications


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A standalone master at ``spark://127.0.0.1:<port>`` and one worker (2 cores, as
    local[2]; 1 GB): the pip pyspark's own Master and Worker (``spark-class``), the deployment
    docker-compose.yml runs. Should an executor start Python, it is this venv's, importing
    sstore from this checkout."""
    import pyspark

    spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    logs = tmp_path_factory.mktemp("spark-cluster")
    port, webui = _free_port(), _free_port()
    master = f"spark://127.0.0.1:{port}"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_DAEMON_JAVA_OPTS": SPARK_TEST_JVM_OPTIONS,  # the master's and worker's JVMs
           "PYTHONPATH": os.pathsep.join(filter(None, (str(Path(__file__).parents[3]),
                                                       os.environ.get("PYTHONPATH"))))}
    commands = {
        "master": [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                   "--port", str(port), "--webui-port", str(webui)],
        "worker": [spark_class, "org.apache.spark.deploy.worker.Worker", master,
                   "--host", "127.0.0.1", "--webui-port", str(_free_port()),
                   "--memory", "1g", "--cores", "2", "--work-dir", str(logs / "work")],
    }
    processes: list[subprocess.Popen] = []
    try:
        for name, command in commands.items():
            with open(logs / f"{name}.log", "wb") as log:
                processes.append(subprocess.Popen(command, env=env, stdout=log,
                                                  stderr=subprocess.STDOUT,
                                                  start_new_session=True))
        deadline = time.monotonic() + 90
        while True:
            dead = [p.args[1] for p in processes if p.poll() is not None]
            assert not dead, f"{dead} exited; see {logs}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{webui}/json/", timeout=2) as r:
                    if json.load(r).get("aliveworkers") == 1:
                        break
            except OSError:
                pass  # the master's UI is not up yet
            assert time.monotonic() < deadline, f"no worker registered in 90 s; see {logs}"
            time.sleep(0.5)
        yield SparkCluster(master, f"http://127.0.0.1:{webui}")
    finally:
        for process in reversed(processes):
            _stop(process)


def test_spark_streaming_on_a_standalone_cluster_equals_the_engine(
        spark_cluster: SparkCluster, data: Path, engine_and_twin: Callable[[str], str],
        tmp_path: Path) -> None:
    """The command, in its own process as a user runs it, with ``SSTORE_SPARK_MASTER`` naming
    a standalone master: executors in other JVMs read the inbox files and the dimensions over
    JDBC (the PostgreSQL jar reaches them through ``spark.jars``), run the rules in this
    venv's Python, and the warehouse equals the engine mode's row for row."""
    pg_url = engine_and_twin("tpcdi_cluster")
    env = {**os.environ, "SSTORE_SPARK_MASTER": spark_cluster.master,
           "SPARK_LOCAL_IP": "127.0.0.1",
           # the executors' JVMs as the driver's (conftest): Spark prepends this default to
           # the spark.executor.extraJavaOptions the session sets
           "SPARK_SUBMIT_OPTS": f'{os.environ.get("SPARK_SUBMIT_OPTS", "")} '
                                f'"-Dspark.executor.defaultJavaOptions={SPARK_TEST_JVM_OPTIONS}"',

           "PYTHONPATH": os.pathsep.join(filter(None, (str(Path(__file__).parents[3]),
                                                       os.environ.get("PYTHONPATH"))))}
    driver_log = tmp_path / "driver.log"
    with open(driver_log, "wb") as log:
        # its own process group: on a timeout, the driver's JVM goes too
        driver = subprocess.Popen(
            [sys.executable, "-c", "from sstore.cli import main; main()", "-v", "tpcdi", "run",
             "--mode", "spark-streaming", "--input", str(data), "--postgres", pg_url,
             "--schema", "tpcdi_cluster", "--checkpoint", str(tmp_path / "sss"),
             "--batch-size", str(BATCH_SIZE), "--json"],
            env=env, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        try:
            stdout, _ = driver.communicate(timeout=420)
        finally:
            _stop(driver)
    assert driver.returncode == 0, driver_log.read_text()[-4000:]
    report = json.loads(stdout[stdout.index("{"):])
    assert report["mode"] == "spark-streaming" and report["replayed_batches"] == 0, report
    assert report["files_dropped"] >= 4, report  # Batch1 in several micro-batches, Batch2, 3
    # the work ran on the cluster: the master lists the command's application, finished,
    # with the worker's cores
    with urllib.request.urlopen(f"{spark_cluster.ui}/json/", timeout=5) as r:
        apps = json.load(r)["completedapps"]
    assert [(app["name"], app["cores"]) for app in apps] == [("sstore", 2)], apps
    assert_equals_the_engine(pg_url, "tpcdi_cluster")
