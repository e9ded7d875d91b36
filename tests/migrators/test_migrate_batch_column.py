"""`sstore migrate` into a table a sink created with a batch column (``_batch_id``).

A program's sink (``StreamToPostgres(..., batch_column="_batch_id")``) writes each row's batch
id into the target; that column is what a split object's guard, a cached copy's top-up and a
backfill's replace-by-batch read. `sstore migrate` had no batch-column option, so the same
stream moved into the same table by the command line (which is what ``BatchesLostError`` tells
a user to run with ``--accept-gap``) wrote its rows with ``_batch_id`` NULL, exit 0: anything
filtering or replacing by batch id missed them. Now the command line takes the target's
``_batch_id`` column as its batch column (or ``--batch-column COL``), and a library sink
without a batch column refuses such a target by the column's name instead of leaving it NULL.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from migrators import IncompatibleSchemaError, cast
from migrators.engine_to_postgres import StreamToPostgres
from sstore import Engine
from sstore.polystore import Polystore
from sstore.polystore.cost import CostModel

TARGET = "public.orders_bc"
STREAM = "orders_in"
SQL = "SELECT count(*) AS n, sum(o_id) AS s FROM orders"


def pg(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url) as con:
        cur = con.execute(sql)
        return cur.fetchall() if cur.description else []


def sstore_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-m", "sstore.cli", *args], check=False,
                          capture_output=True, text=True, env=env, timeout=120)


def migrate(state: str, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return sstore_cli("migrate", state, "--stream", STREAM, "--table", TARGET,
                      "--postgres", url, *extra)


def new_engine(state: str) -> Engine:
    engine = Engine(state)
    engine.stream(STREAM, {"o_id": "INTEGER", "o_c_id": "INTEGER"})
    return engine


def batch_ids(url: str) -> list[tuple]:
    """(batch id, rows) in the target, NULL batch ids included."""
    return pg(url, f"SELECT _batch_id, count(*) FROM {TARGET} GROUP BY 1 ORDER BY 1 NULLS LAST")


@pytest.fixture
def delivered_by_sink(tmp_path: Path, pg_url: str) -> str:
    """Batches 1-2 delivered by a program's sink with ``batch_column="_batch_id"``; batch 3
    committed since, not delivered; the program stopped. Returns the state file."""
    state = str(tmp_path / "s.duckdb")
    engine = new_engine(state)
    StreamToPostgres(engine, STREAM, pg_url, TARGET, batch_column="_batch_id")
    engine.ingest(STREAM, [(1, 1), (2, 2)], batch_id=1)
    engine.ingest(STREAM, [(3, 3)], batch_id=2)
    StreamToPostgres(engine, STREAM, pg_url, TARGET, batch_column="_batch_id").run_once()
    engine.ingest(STREAM, [(4, 4)], batch_id=3)
    engine.close()
    assert batch_ids(pg_url) == [(1, 2), (2, 1)]
    return state


def test_sstore_migrate_writes_the_batch_ids_the_sinks_table_has(delivered_by_sink: str,
                                                                 pg_url: str) -> None:
    """The seam: before, batch 3 arrived with ``_batch_id`` NULL ([(1, 2), (2, 1), (None, 1)])."""
    done = migrate(delivered_by_sink, pg_url)
    assert done.returncode == 0, done.stderr
    assert batch_ids(pg_url) == [(1, 2), (2, 1), (3, 1)]
    with Engine.open_existing(delivered_by_sink) as engine:  # and the program's sink goes on
        engine.ingest(STREAM, [(5, 5)], batch_id=4)
        StreamToPostgres(engine, STREAM, pg_url, TARGET, batch_column="_batch_id").run_once()
    assert batch_ids(pg_url) == [(1, 2), (2, 1), (3, 1), (4, 1)]


def test_the_accept_gap_command_batches_lost_error_prints(delivered_by_sink: str,
                                                          pg_url: str, tmp_path: Path) -> None:
    """What ``BatchesLostError`` tells the user to run, after the table was recreated as the
    sink makes it and the engine collected batches 1-2: batch 3 keeps its batch id, and the
    split object answers it once."""
    with Engine.open_existing(delivered_by_sink) as engine:
        engine.collect_garbage()
        assert engine.collected_through(STREAM) == 2
    pg(pg_url, f"DROP TABLE {TARGET}")
    pg(pg_url, f"CREATE TABLE {TARGET} (_batch_id BIGINT, o_id INTEGER, o_c_id INTEGER)")
    refused = migrate(delivered_by_sink, pg_url)
    assert refused.returncode == 1 and "batches 1..2" in refused.stderr
    accepted = migrate(delivered_by_sink, pg_url, "--accept-gap")
    assert accepted.returncode == 0, accepted.stderr
    assert batch_ids(pg_url) == [(3, 1)]
    with Engine.open_existing(delivered_by_sink) as engine:
        with Polystore(str(tmp_path / "catalog.json"), costs=CostModel()) as ps:
            ps.attach_engine("stream", engine)
            ps.add_postgres("pg", pg_url)
            ps.split("orders", {"stream": STREAM, "pg": TARGET})
            assert ps.query(SQL).to_pylist() == [{"n": 1, "s": 4}]
            engine.ingest(STREAM, [(5, 5)], batch_id=4)
            assert ps.query(SQL).to_pylist() == [{"n": 2, "s": 9}]


def test_an_explicit_batch_column(tmp_path: Path, pg_url: str) -> None:
    """``--batch-column COL`` names it: a missing table is created with it first; a table
    without it is refused by its name, nothing written."""
    state = str(tmp_path / "s.duckdb")
    engine = new_engine(state)
    engine.ingest(STREAM, [(1, 1)], batch_id=1)
    engine.close()
    done = migrate(state, pg_url, "--batch-column", "batch")
    assert done.returncode == 0, done.stderr
    assert pg(pg_url, f"SELECT batch, o_id, o_c_id FROM {TARGET}") == [(1, 1, 1)]
    pg(pg_url, "CREATE TABLE public.other (o_id INTEGER, o_c_id INTEGER)")
    refused = sstore_cli("migrate", state, "--stream", STREAM, "--table", "public.other",
                         "--postgres", pg_url, "--batch-column", "batch")
    assert refused.returncode == 1
    assert "no column 'batch'" in refused.stderr
    assert pg(pg_url, "SELECT count(*) FROM public.other") == [(0,)]


def test_without_a_batch_column_target_migrate_writes_none(tmp_path: Path, pg_url: str) -> None:
    """Nothing to detect: a table made by `sstore migrate` itself has no batch column, as
    before."""
    state = str(tmp_path / "s.duckdb")
    engine = new_engine(state)
    engine.ingest(STREAM, [(1, 1)], batch_id=1)
    engine.close()
    for _ in range(2):
        done = migrate(state, pg_url)
        assert done.returncode == 0, done.stderr
    assert pg(pg_url, f"SELECT * FROM {TARGET}") == [(1, 1)]


def test_a_library_sink_without_a_batch_column_refuses_such_a_table(
        delivered_by_sink: str, pg_url: str) -> None:
    """A sink told no batch column (and ``cast``, which makes one) would leave the target's
    ``_batch_id`` NULL: refused by the column's name before the watermark is touched."""
    with Engine.open_existing(delivered_by_sink) as engine:
        with pytest.raises(IncompatibleSchemaError, match=r"_batch_id.*batch_column"):
            StreamToPostgres(engine, STREAM, pg_url, TARGET).run_once()
        with pytest.raises(IncompatibleSchemaError, match="_batch_id"):
            cast(engine, pg_url, stream=STREAM, table=TARGET)
        assert batch_ids(pg_url) == [(1, 2), (2, 1)]
        assert pg(pg_url, "SELECT batch_id FROM sstore.watermarks") == [(2,)]
        cast(engine, pg_url, stream=STREAM, table=TARGET, batch_column="_batch_id")
    assert batch_ids(pg_url) == [(1, 2), (2, 1), (3, 1)]
