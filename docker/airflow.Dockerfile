# Airflow 3 with sstore installed: the image of the compose file's Airflow services, and of its
# Spark master and worker (same Python, same pyspark, so a cluster job's Python workers match
# the driver's). Build context: the repository root (docker compose build).
ARG AIRFLOW_VERSION=3.3.2
FROM apache/airflow:${AIRFLOW_VERSION}-python3.11
ARG AIRFLOW_VERSION

USER root
# Java for PySpark, the PostgreSQL JDBC driver Spark reads and writes the warehouse with, and
# jemalloc preloaded into every process of the image: DAG tasks import sstore as a library, so
# the sstore command's own switch (sstore/allocator.py) does not reach them.
RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless libpostgresql-jdbc-java procps \
      libjemalloc2 \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(find /usr/lib -name libjemalloc.so.2 | head -n 1)" /usr/local/lib/libjemalloc.so.2 \
 && mkdir -p /opt/sstore/src /opt/sstore/data/tpcdi \
 && chown -R airflow:0 /opt/sstore
ENV JAVA_HOME=/usr/lib/jvm/default-java \
    SSTORE_JDBC_JAR=/usr/share/java/postgresql.jar \
    SSTORE_TPCDI_DIR=/opt/sstore/data/tpcdi \
    LD_PRELOAD=/usr/local/lib/libjemalloc.so.2

USER airflow
# Editable install: the warehouse DDL is read from schemas/ beside the package sources.
COPY --chown=airflow:0 pyproject.toml README.md LICENSE /opt/sstore/src/
COPY --chown=airflow:0 sstore /opt/sstore/src/sstore
COPY --chown=airflow:0 migrators /opt/sstore/src/migrators
COPY --chown=airflow:0 schemas /opt/sstore/src/schemas
COPY --chown=airflow:0 docker/airflow-init.sh /opt/sstore/src/docker/airflow-init.sh
# Airflow pinned to the base image's version, so the project's requirements cannot move it.
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -e "/opt/sstore/src[spark]"
