"""docker-compose.yml and docker/airflow.Dockerfile, checked as files (no Docker engine here):
the services exist and are wired the way docs/airflow.md says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))


def test_compose_has_postgres_airflow_and_spark() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", "airflow-init", "airflow-apiserver",
                             "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
                             "spark-master", "spark-worker"}
    assert services["postgres"]["image"].startswith("postgres:")
    commands = {name: services[name]["command"] for name in services if name.startswith("airflow-")}
    assert commands["airflow-apiserver"] == "api-server"
    assert commands["airflow-scheduler"] == "scheduler"
    assert commands["airflow-dag-processor"] == "dag-processor"
    assert commands["airflow-triggerer"] == "triggerer"
    assert "airflow-init.sh" in " ".join(commands["airflow-init"])
    for name in commands:
        service = services[name]
        assert service["build"]["dockerfile"] == "docker/airflow.Dockerfile"
        assert "./dags:/opt/airflow/dags:ro" in service["volumes"]
        env = service["environment"]
        assert env["SSTORE_SPARK_MASTER"].startswith("${SSTORE_SPARK_MASTER:-}")
        assert env["AIRFLOW_CONN_SSTORE_WAREHOUSE"].endswith("@postgres:5432/postgres")
        needs = service["depends_on"]
        assert needs["postgres"] == {"condition": "service_healthy"}
        if name != "airflow-init":
            assert needs["airflow-init"] == {"condition": "service_completed_successfully"}
    assert services["spark-master"]["entrypoint"] == ["spark-class"]
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]
    assert services["spark-worker"]["image"] == services["airflow-scheduler"]["image"]


def test_dockerfile_installs_sstore_on_airflow_3_with_java() -> None:
    text = (ROOT / "docker" / "airflow.Dockerfile").read_text(encoding="utf-8")
    version = re.search(r"ARG AIRFLOW_VERSION=(3\.\d+\.\d+)", text)
    assert version is not None
    assert "FROM apache/airflow:${AIRFLOW_VERSION}-python3.11" in text
    assert "default-jre-headless" in text and "libpostgresql-jdbc-java" in text
    assert '-e "/opt/sstore/src[spark]"' in text
    # DAG tasks import sstore as a library: the image preloads jemalloc for them
    assert "libjemalloc2" in text and "LD_PRELOAD=/usr/local/lib/libjemalloc.so.2" in text
    assert f"AIRFLOW_VERSION:-{version.group(1)}" in (ROOT / "docker-compose.yml").read_text()
    init = (ROOT / "docker" / "airflow-init.sh").read_text(encoding="utf-8")
    assert "airflow db migrate" in init


def test_spark_workers_read_the_drivers_data_volume() -> None:
    """docs/scaling.md runs ``--mode spark-streaming`` on the cluster with its input and
    checkpoint (the watched inbox the executors read) on the ``sstore-data`` volume: the
    worker must mount it where the driver (the Airflow scheduler) does, and the driver must
    be reachable by its name."""
    services = compose()["services"]
    driver = services["airflow-scheduler"]
    worker = services["spark-worker"]
    mounts = [m for m in driver["volumes"] if m.startswith("sstore-data:")]
    assert mounts == ["sstore-data:/opt/sstore/data"]
    assert mounts[0] in worker["volumes"]
    assert driver["hostname"] == "airflow-scheduler"
    assert "ports" not in worker  # so `--scale spark-worker=N` starts N of them
    scaling = (ROOT / "docs" / "scaling.md").read_text(encoding="utf-8")
    assert "--checkpoint /opt/sstore/data/" in scaling and "spark://spark-master:7077" in scaling
