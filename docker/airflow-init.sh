#!/usr/bin/env bash
# One-off setup of the compose deployment (the airflow-init service): Airflow's metadata
# database in the PostgreSQL server (created if missing, so an existing pgdata volume works
# too), its tables (airflow db migrate), and the directory the TPC-DI DAGs read and generate.
set -euo pipefail
python - <<'PY'
import os

import psycopg

with psycopg.connect(os.environ["SSTORE_POSTGRES_URL"], autocommit=True) as con:
    if not con.execute("SELECT 1 FROM pg_database WHERE datname = 'airflow'").fetchone():
        con.execute("CREATE DATABASE airflow")
        print("created database airflow")
PY
airflow db migrate
mkdir -p "${SSTORE_TPCDI_DIR:-/opt/sstore/data/tpcdi}"
echo "Airflow is ready: http://127.0.0.1:8080 (dags: tpcdi_historical, tpcdi_incremental, sstore_maintenance)"
