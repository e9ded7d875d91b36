"""The library under the Airflow DAGs, without Airflow: ``sstore.maintenance`` (migrate an
engine's streams, report) and the settings and data-set steps of
``sstore.workloads.tpcdi.orchestration``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from sstore import Engine
from sstore.base.errors import DeclarationError
from sstore.maintenance import (
    StreamTarget,
    format_report,
    migrate_streams,
    status_report,
)
from sstore.workloads.tpcdi import orchestration as etl
from sstore.workloads.tpcdi.streaming.batch_ids import ID_STRIDE, engine_batch_id
from sstore.workloads.tpcdi.streaming.pipeline import sinks

TARGET = StreamTarget("readings", "public.readings")


def readings(path: str, batches: int) -> None:
    """A state file whose stream ``readings`` has ``batches`` batches of 5 rows, held for the
    migrator of ``public.readings``."""
    engine = Engine(path)
    try:
        engine.stream("readings", {"id": "BIGINT"})
        engine.hold("readings", "migrator:public.readings")
        for b in range(batches):
            engine.ingest("readings", pa.table({"id": list(range(b * 5, b * 5 + 5))}))
    finally:
        engine.close()


def test_migrate_streams_moves_each_batch_once(pg_url: str, tmp_path: Path) -> None:
    state = str(tmp_path / "s.duckdb")
    readings(state, 2)
    first = migrate_streams(state, pg_url, [TARGET])
    assert (first.status, first.rows, first.streams[0].watermark) == ("migrated", 10, 2)
    readings(state, 1)  # a third batch (ids 0..4 again: the rows need not be new)
    second = migrate_streams(state, pg_url, [TARGET])
    assert (second.rows, second.streams[0].batches) == (5, 1)
    assert migrate_streams(state, pg_url, [TARGET]).rows == 0
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT count(*) FROM public.readings").fetchone()[0] == 15
    report = status_report(state, pg_url, [TARGET])
    assert report["status"] == "ok"
    assert report["targets"][0] == {**TARGET.to_dict(), "last_batch": 3, "watermark": 3,
                                         "behind": False, "rows": 15}
    assert "up to date" in format_report(report)


def test_a_missing_or_busy_state_file_is_reported_not_failed(pg_url: str,
                                                             tmp_path: Path) -> None:
    missing = str(tmp_path / "none.duckdb")
    assert migrate_streams(missing, pg_url, [TARGET]).status == "missing"
    assert status_report(missing, pg_url, [TARGET])["status"] == "missing"
    state = str(tmp_path / "s.duckdb")
    readings(state, 1)
    hold_open = ("import sys; from sstore import Engine; e = Engine(sys.argv[1]); "
                 "print('open', flush=True); sys.stdin.read(); e.close()")
    holder = subprocess.Popen([sys.executable, "-c", hold_open, state], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        busy = migrate_streams(state, pg_url, [TARGET])
        assert busy.status == "busy" and "lock" in busy.detail.lower()
        report = status_report(state, pg_url, [TARGET])
        assert report["status"] == "busy"
        assert report["targets"][0]["behind"] is None  # the engine's side is unknown
    finally:
        holder.communicate("", timeout=60)
    assert migrate_streams(state, pg_url, [TARGET]).rows == 5


def test_unknown_streams_and_bad_targets_are_refused(pg_url: str, tmp_path: Path) -> None:
    state = str(tmp_path / "s.duckdb")
    readings(state, 1)
    with pytest.raises(DeclarationError, match="no stream 'nope'"):
        migrate_streams(state, pg_url, [StreamTarget("nope", "public.nope")])
    with pytest.raises(DeclarationError, match="merge needs key"):
        StreamTarget("readings", "public.r", "merge")
    target = StreamTarget.from_mapping({"stream": "s", "table": "a.b", "mode": "merge",
                                        "key": "id"})
    assert target == StreamTarget("s", "a.b", "merge", ("id",))


def test_settings_come_from_params_connections_and_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSTORE_POSTGRES_URL", "postgresql://env@db:5433/warehouse")
    found = {"wh": etl.connection_url("pg", 6543, "etl user", "p@ss/word", "dw")}
    assert found["wh"] == "postgresql://etl%20user:p%40ss%2Fword@pg:6543/dw"
    settings = etl.Settings.from_params({"data_dir": "/data", "postgres_conn_id": "wh",
                                         "batch_size": 50}, found.get)
    assert (settings.url, settings.state, settings.batch_size, settings.schema) == \
        (found["wh"], "/data/STATE.duckdb", 50, "tpcdi")
    assert "p@ss" not in str(settings.redacted())
    assert etl.Settings.from_params({"postgres_conn_id": "other"}, found.get).url == \
        "postgresql://env@db:5433/warehouse"
    monkeypatch.delenv("SSTORE_POSTGRES_URL")
    assert etl.warehouse_url("other", found.get) == "postgresql://postgres@127.0.0.1:5432/postgres"
    assert etl.warehouse_url("", found.get) == etl.DEFAULT_URL


def test_the_data_set_is_found_or_generated(tmp_path: Path) -> None:
    settings = etl.Settings(data_dir=str(tmp_path / "tpcdi"), scale_factor=0.01, seed=5)
    with pytest.raises(FileNotFoundError, match="no TPC-DI data set"):
        etl.incremental_batches(settings)
    made = etl.prepare_source(settings)
    assert made == {"data_dir": settings.data_dir, "generated": True, "batches": [1, 2, 3]}
    assert etl.prepare_source(settings)["generated"] is False
    assert etl.incremental_batches(settings) == [2, 3]
    (tmp_path / "tpcdi" / "Batch5").mkdir()
    with pytest.raises(FileNotFoundError, match="without gaps"):
        etl.incremental_batches(settings)


def test_a_directory_of_other_files_is_never_generated_over(tmp_path: Path) -> None:
    """A user's data set laid out differently (``batch1/trade.txt``) is refused by name; a
    synthetic one used to be generated beside it and loaded instead, with success."""
    mine = tmp_path / "mine"
    (mine / "batch1").mkdir(parents=True)
    (mine / "batch1" / "trade.txt").write_text("1|2|3\n")
    settings = etl.Settings(data_dir=str(mine), scale_factor=0.01, seed=5)
    with pytest.raises(etl.NotADataSet, match="batch1.*no Batch1/Trade.txt"):
        etl.prepare_source(settings)
    assert sorted(p.name for p in mine.iterdir()) == ["batch1"]  # nothing written there
    empty = tmp_path / "empty"
    empty.mkdir()
    made = etl.prepare_source(etl.Settings(data_dir=str(empty), scale_factor=0.01, seed=5))
    assert made["generated"] is True


def test_engine_batch_ids_come_from_the_data() -> None:
    assert engine_batch_id(1, 1) == ID_STRIDE + 1
    assert engine_batch_id(3, 200) == 3 * ID_STRIDE + 200 > engine_batch_id(2, ID_STRIDE - 1)
    with pytest.raises(ValueError):
        engine_batch_id(2, ID_STRIDE)
    assert [t.table for t in sinks("dw")] == ["dw.dimtrade", "dw.dimessages", "dw.rejects"]
    assert etl.maintenance_targets(etl.Settings(schema="dw")) == list(sinks("dw"))
