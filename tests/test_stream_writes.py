"""A procedure's SQL that writes a stream's table is refused (``sstore.stream_writes``).

Found by a hostile pass: ``INSERT INTO alerts ...`` inside the procedure that outputs
``alerts`` committed; the downstream procedure and the subscribers got the batch it returned
(empty) while a sink read the inserted row from the table: one batch, two contents, exit 0."""

from __future__ import annotations

import pytest

from sstore import Engine
from sstore.stream_writes import StreamWriteError, written_tables


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
    ("ALTER TABLE alerts ADD COLUMN x INTEGER", {"alerts"}),
    ("INSERT INTO other.alerts SELECT 1", set()),  # another schema's table
    ("INSERT INTO revenue SELECT v FROM alerts", {"revenue"}),
    ("SELECT * FROM alerts", set()),
])
def test_which_tables_a_statement_writes(statement: str, written: set[str]) -> None:
    assert written_tables(statement) == written
