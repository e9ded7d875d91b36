"""A procedure's SQL that writes a stream's table is refused (``sstore.dataflow.stream_writes``).

Found by a hostile pass: ``INSERT INTO alerts ...`` inside the procedure that outputs
``alerts`` committed; the downstream procedure and the subscribers got the batch it returned
(empty) while a sink read the inserted row from the table: one batch, two contents, exit 0."""

from __future__ import annotations

import pytest

from sstore import Engine
from sstore.dataflow.stream_writes import StreamWriteError, written_tables


@pytest.mark.parametrize("statement", [
    "INSERT INTO alerts SELECT v FROM batch WHERE v > 10",
    "insert or replace into \"Alerts\" select v from batch",
    "WITH hot AS (SELECT v FROM batch) INSERT INTO alerts SELECT v FROM hot",
    "UPDATE main.alerts SET v = 0",
    "DELETE FROM alerts",
    "TRUNCATE alerts",
    "INSERT INTO readings SELECT v FROM batch",  # its own input stream
])
def test_a_procedure_writing_a_stream_table_fails_and_nothing_is_half_seen(
        engine: Engine, statement: str) -> None:
    engine.stream("readings", {"v": "INTEGER"})
    engine.stream("alerts", {"v": "INTEGER"})
    engine.execute("CREATE TABLE pages (v INTEGER)")

    @engine.procedure(input="readings", output="alerts")
    def detect(tx, batch):
        tx.execute(statement)

    @engine.procedure(input="alerts")
    def page(tx, batch):
        tx.execute("INSERT INTO pages SELECT v FROM batch")

    seen: list[int] = []
    engine.subscribe("alerts", lambda b, t: seen.append(t.num_rows))
    engine.ingest("readings", [(5,), (50,)])
    engine.run_until_idle()
    halted = {p.name: p.halted for p in engine.status().procedures}
    assert "StreamWriteError" in halted["detect"] and \
        "writes stream" in halted["detect"] and halted["page"] is None
    assert engine.query("SELECT count(*) AS n FROM alerts").column("n")[0].as_py() == 0
    assert engine.query("SELECT count(*) AS n FROM readings").column("n")[0].as_py() == 2
    assert seen == []


def test_returning_the_rows_and_writing_state_tables_still_work(engine: Engine) -> None:
    engine.stream("readings", {"v": "INTEGER"})
    engine.execute("CREATE TABLE alerts_seen (v INTEGER)")

    @engine.procedure(input="readings", output="alerts")
    def detect(tx, batch):
        tx.execute("INSERT INTO alerts_seen SELECT v FROM batch WHERE v > 10")
        return tx.sql("SELECT v FROM batch WHERE v > 10")

    engine.ingest("readings", [(5,), (50,)])
    engine.run_until_idle()
    assert engine.latest("alerts")[1].column("v").to_pylist() == [50]
    assert engine.query("SELECT v FROM alerts_seen").column("v").to_pylist() == [50]


def test_an_ad_hoc_transaction_cannot_write_a_stream_table(engine: Engine) -> None:
    engine.stream("readings", {"v": "INTEGER"})
    engine.ingest("readings", [(5,)])
    with pytest.raises(StreamWriteError, match="this transaction writes stream 'readings'"):
        with engine.transaction() as tx:
            tx.execute("DELETE FROM readings")
    assert engine.query("SELECT count(*) AS n FROM readings").column("n")[0].as_py() == 1


@pytest.mark.parametrize("statement, written", [
    ("COPY alerts TO 'out.csv'", set()),  # reads the table
    ("COPY alerts FROM 'in.csv'", {"alerts"}),
    ("DROP TABLE IF EXISTS alerts", {"alerts"}),
    ("CREATE OR REPLACE TABLE main.alerts AS SELECT 1 AS v", {"alerts"}),
    ('create or replace table "Alerts" (v INTEGER)', {"alerts"}),
    ("CREATE OR REPLACE VIEW alerts_view AS SELECT 1", set()),
    ("CREATE TABLE IF NOT EXISTS alerts (v INTEGER)", set()),  # a no-op or an error
    ("ALTER TABLE alerts ADD COLUMN x INTEGER", {"alerts"}),
    ("INSERT INTO other.alerts SELECT 1", set()),  # another schema's table
    ("INSERT INTO revenue SELECT v FROM alerts", {"revenue"}),
    ("SELECT * FROM alerts", set()),
])
def test_which_tables_a_statement_writes(statement: str, written: set[str]) -> None:
    assert written_tables(statement) == written


def _count(engine: Engine, table: str) -> int:
    return engine.query(f"SELECT count(*) AS n FROM {table}").column("n")[0].as_py()


@pytest.mark.parametrize("statement", [
    "INSERT INTO readings VALUES (1, 99)",  # a row no procedure would ever process
    "DELETE FROM readings WHERE _batch_id = 1",  # a batch the consumer has not acknowledged
    "UPDATE readings SET v = 0",
    "CREATE OR REPLACE TABLE readings AS SELECT 1 AS _batch_id, 7 AS v",
    "CREATE TABLE IF NOT EXISTS notes (v INTEGER); DELETE FROM readings",  # nothing runs
])
def test_execute_cannot_write_a_stream_table_before_or_after_start(
        state_path: str, statement: str) -> None:
    """Issue 34, item 6: ``Engine.execute`` took ``INSERT INTO <stream>`` (a row never
    processed) and ``DELETE`` of batches a consumer had not acknowledged, which
    ``transaction()`` refuses. The same guard, before and after the engine starts."""
    with Engine(state_path) as engine:
        engine.stream("readings", {"v": "INTEGER"})
        engine.consumer("readings", "sink")
        engine.ingest("readings", [(5,)])
        with pytest.raises(StreamWriteError, match="writes stream 'readings'"):
            engine.execute(statement)
        assert _count(engine, "readings") == 1
        assert engine.query("SELECT v FROM readings").column("v").to_pylist() == [5]
    with Engine(state_path) as engine:  # not started yet: the state file's streams count
        with pytest.raises(StreamWriteError, match="writes stream 'readings'"):
            engine.execute(statement)
        engine.stream("readings", {"v": "INTEGER"})
        engine.consumer("readings", "sink")
        assert _count(engine, "readings") == 1
        assert engine.query("SELECT count(*) AS n FROM duckdb_tables() WHERE table_name = "
                            "'notes'").column("n")[0].as_py() == 0


def test_load_table_cannot_write_a_stream_table(engine: Engine) -> None:
    import pyarrow as pa
    engine.stream("readings", {"v": "INTEGER"})
    engine.ingest("readings", [(5,)])
    with pytest.raises(StreamWriteError, match="writes stream 'readings'"):
        engine.load_table("readings", pa.table({"_batch_id": [1], "v": [7]}), "replace")
    assert engine.query("SELECT v FROM readings").column("v").to_pylist() == [5]


def test_execute_still_declares_and_writes_state_tables(state_path: str) -> None:
    with Engine(state_path) as engine:
        engine.execute("CREATE TABLE totals (k INTEGER, n INTEGER)")
        engine.execute("INSERT INTO totals VALUES (1, 0)")
        engine.stream("readings", {"v": "INTEGER"})
        engine.execute("CREATE TABLE IF NOT EXISTS totals (k INTEGER, n INTEGER); "
                       "UPDATE totals SET n = n + 1")
        engine.ingest("readings", [(5,)])
        engine.execute("INSERT INTO totals SELECT v, 0 FROM readings")  # reads a stream
        engine.execute("CREATE INDEX IF NOT EXISTS totals_k ON totals (k)")
        engine.execute("DELETE FROM totals WHERE k = 5")
        assert engine.query("SELECT k, n FROM totals").to_pylist() == [{"k": 1, "n": 1}]


def test_ingest_along_cannot_write_another_stream_table(engine: Engine) -> None:
    """``ingest(along=...)`` hands out a transaction too: same guard, nothing ingested."""
    engine.stream("readings", {"v": "INTEGER"})
    engine.stream("alerts", {"v": "INTEGER"})
    engine.execute("CREATE TABLE notes (v INTEGER)")
    engine.ingest("alerts", [(1,)])
    with pytest.raises(StreamWriteError, match="this transaction writes stream 'alerts'"):
        engine.ingest("readings", [(5,)], along=lambda tx: tx.execute("DELETE FROM alerts"))
    engine.ingest("readings", [(6,)], along=lambda tx: tx.execute("INSERT INTO notes VALUES (6)"))
    assert engine.query("SELECT v FROM readings").column("v").to_pylist() == [6]
    assert _count(engine, "alerts") == 1 and _count(engine, "notes") == 1
