"""First batches larger than one DuckDB row group (122,880 rows) must be readable at once.

DuckDB 2.0.0 reads a table as empty in the process that made it when the table was created empty
(``CREATE TABLE ... AS ... LIMIT 0``) and filled in the same transaction with more than one row
group; the table stays unreadable for later batches too. The engine makes two tables on the fly,
an undeclared output stream and a dead-letter table, and must make both from their rows. A
``count(*)`` does not show the bug (it answers from metadata): these tests read the rows.
"""

from __future__ import annotations

import psycopg
import pyarrow as pa

from migrators.engine_to_postgres import StreamToPostgres
from sstore import Engine

ROWS = 130_000  # more than one row group


def keys(n: int, start: int = 0) -> pa.Table:
    return pa.table({"k": pa.array(range(start, start + n), pa.int64())})


def scanned(engine: Engine, sql: str) -> int:
    """Rows a query really returns (not a count the catalog could answer)."""
    return engine.query(sql).num_rows


def test_undeclared_output_stream_first_batch_reaches_postgres(state_path: str,
                                                               pg_url: str) -> None:
    eng = Engine(state_path)
    eng.stream("inp", {"k": "BIGINT"})

    @eng.procedure(input="inp", output="out")  # no eng.stream("out", ...): created on the fly
    def double(tx, batch):
        return tx.sql("SELECT k, k * 2 AS v FROM batch")

    eng.ingest("inp", keys(ROWS))
    eng.run_until_idle()
    assert eng.read_batches("out", 1, 1).num_rows == ROWS
    assert scanned(eng, "SELECT * FROM out WHERE _batch_id = 1") == ROWS
    eng.ingest("inp", keys(5, start=ROWS))  # later batches are readable too
    eng.run_until_idle()
    assert eng.read_batches("out", 1, 2).num_rows == ROWS + 5
    report = StreamToPostgres(eng, "out", pg_url, "s.out").run_once()
    assert report.rows == ROWS + 5
    with psycopg.connect(pg_url) as con:
        got = con.execute("SELECT count(*), count(DISTINCT k), sum(v) FROM s.out").fetchone()
    n = ROWS + 5
    assert got == (n, n, n * (n - 1))
    eng.close()


def test_dead_letter_table_keeps_a_large_first_batch(state_path: str) -> None:
    eng = Engine(state_path)
    eng.stream("inp", {"k": "BIGINT"})

    @eng.procedure(input="inp", output="out", on_error="dead_letter")
    def refuse(tx, batch):
        raise ValueError("no")

    eng.ingest("inp", keys(ROWS))
    eng.ingest("inp", keys(3, start=ROWS))
    eng.run_until_idle()
    dead = eng.query("SELECT _batch_id, _procedure, _error, k FROM inp__dead_letter "
                     "ORDER BY _batch_id, k")
    assert dead.num_rows == ROWS + 3
    assert dead.column("k").to_pylist() == list(range(ROWS + 3))
    assert set(dead.column("_procedure").to_pylist()) == {"refuse"}
    assert set(dead.column("_error").to_pylist()) == {"ValueError: no"}
    assert scanned(eng, "SELECT * FROM inp__dead_letter WHERE _batch_id = 1") == ROWS
    eng.close()
