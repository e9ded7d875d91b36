"""Weak durability replays what was committed live, or refuses loudly (issue 34, item 7).

Replay reruns the procedures and ad hoc transactions from the input log. It reproduces the live
state only if they do the same thing again: GC that ran live is logged and replayed at the same
point (so an ad hoc read of a stream sees what it saw live), and every logged transaction
carries a digest of what it did (``sstore.base.digest``), recomputed at replay: a difference stops
the restart with ``ReplayMismatchError`` naming the transaction, and the engine stays closed,
its snapshot untouched."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from sstore import Engine, ReplayMismatchError, SStoreError


def events_and_archive(engine: Engine) -> None:
    engine.stream("events", {"k": "INTEGER", "v": "BIGINT"})
    engine.execute("CREATE TABLE IF NOT EXISTS archive (k INTEGER, v BIGINT)")
    engine.execute("CREATE TABLE IF NOT EXISTS seen (n BIGINT)")

    @engine.procedure(input="events")
    def count(tx, batch):
        tx.execute("INSERT INTO seen SELECT count(*) FROM batch")


def test_a_deterministic_ad_hoc_read_of_a_collected_stream_replays_the_same(tmp_path: Path
                                                                             ) -> None:
    """Live, GC removed the processed batches before the ad hoc INSERT ... SELECT ran, so it
    archived nothing; replay ran no GC, so the same statement archived 15 rows."""
    log = str(tmp_path / "in.log")
    engine = Engine(":memory:", input_log=log, gc_every=1, gc_min_seconds=0)
    events_and_archive(engine)
    for b in range(3):
        engine.ingest("events", [(b, i) for i in range(5)])
        engine.run_until_idle()
    with engine.transaction() as tx:
        tx.execute("INSERT INTO archive SELECT k, v FROM events")
    live = engine.query("SELECT count(*) AS n FROM archive").to_pylist()
    engine.ingest("events", [(9, 9)])
    del engine  # no close, no checkpoint: as if the process died
    again = Engine(":memory:", input_log=log, gc_every=1, gc_min_seconds=0)
    events_and_archive(again)
    assert again.query("SELECT count(*) AS n FROM archive").to_pylist() == live
    again.run_until_idle()
    assert again.query("SELECT count(*) AS n FROM seen").to_pylist() == [{"n": 4}]
    again.close()


def test_a_gc_with_a_sink_acknowledgement_replays_the_same(tmp_path: Path) -> None:
    """GC's bounds depend on consumer acknowledgements, which weak durability does not log:
    the logged GC replays what it removed live, not what replay's consumers would allow."""
    log = str(tmp_path / "in.log")

    def declare(engine: Engine) -> None:
        engine.stream("events", {"k": "INTEGER", "v": "BIGINT"})
        engine.execute("CREATE TABLE IF NOT EXISTS archive (k INTEGER, v BIGINT)")
        engine.consumer("events", "sink")

    engine = Engine(":memory:", input_log=log)
    declare(engine)
    for b in range(3):
        engine.ingest("events", [(b, i) for i in range(5)])
    engine.acknowledge("sink", 2)
    engine.collect_garbage()
    with engine.transaction() as tx:
        tx.execute("INSERT INTO archive SELECT k, v FROM events")
    live = engine.query("SELECT count(*) AS n FROM archive").to_pylist()
    assert live == [{"n": 5}]
    del engine
    again = Engine(":memory:", input_log=log)
    declare(again)
    assert again.query("SELECT count(*) AS n FROM archive").to_pylist() == live
    again.close()


def randomized(engine: Engine) -> None:
    engine.stream("s", {"k": "INTEGER"})

    @engine.procedure(input="s", output="scored")
    def score(tx, batch):
        return [{"k": k, "r": random.random()} for k in batch.column("k").to_pylist()]


def test_a_procedure_whose_output_differs_at_replay_is_refused(tmp_path: Path) -> None:
    log = str(tmp_path / "in.log")
    engine = Engine(":memory:", input_log=log)
    randomized(engine)
    engine.ingest("s", [(1,), (2,)])
    engine.run_until_idle()
    engine.ingest("s", [(3,)])
    del engine
    again = Engine(":memory:", input_log=log)
    randomized(again)
    with pytest.raises(ReplayMismatchError, match=r"procedure 'score' on batch 1 .*differ"):
        again.run_until_idle()
    with pytest.raises(SStoreError, match="closed"):  # never a half-replayed state
        again.query("SELECT * FROM scored")


def test_the_last_transaction_executions_are_checked_too(tmp_path: Path) -> None:
    """No input follows the TE: its digest is logged on its own after the commit."""
    log = str(tmp_path / "in.log")
    engine = Engine(":memory:", input_log=log)
    randomized(engine)
    engine.ingest("s", [(1,)])
    engine.run_until_idle()
    snapshot = engine.checkpoint()
    before = Path(snapshot).read_bytes()
    engine.ingest("s", [(2,)])
    engine.run_until_idle()
    del engine
    again = Engine(":memory:", input_log=log)
    randomized(again)
    with pytest.raises(ReplayMismatchError, match=r"procedure 'score' on batch 2"):
        again.run_until_idle()
    assert Path(snapshot).read_bytes() == before  # the last good checkpoint, as it was


def test_a_parameter_taken_from_the_clock_is_refused_at_replay(tmp_path: Path) -> None:
    log = str(tmp_path / "in.log")

    def declare(engine: Engine) -> None:
        engine.stream("s", {"k": "INTEGER"})
        engine.execute("CREATE TABLE IF NOT EXISTS stamps (k INTEGER, stamped DOUBLE)")

        @engine.procedure(input="s")
        def stamp(tx, batch):
            tx.execute("INSERT INTO stamps SELECT k, ? FROM batch", time.time())

    engine = Engine(":memory:", input_log=log)
    declare(engine)
    engine.ingest("s", [(1,)])
    engine.run_until_idle()
    del engine
    time.sleep(0.01)
    again = Engine(":memory:", input_log=log)
    declare(again)
    with pytest.raises(ReplayMismatchError, match=r"procedure 'stamp' on batch 1"):
        again.run_until_idle()


def test_an_ad_hoc_transaction_that_does_otherwise_at_replay_is_refused(tmp_path: Path
                                                                        ) -> None:
    """The ad hoc statement is deterministic, but what it reads was not logged (``load_table``
    is not): live it inserted 3 rows, at replay none. Refused, not silently different."""
    log = str(tmp_path / "in.log")
    engine = Engine(":memory:", input_log=log)
    engine.execute("CREATE TABLE IF NOT EXISTS copy (k INTEGER)")
    import pyarrow as pa
    engine.load_table("replica", pa.table({"k": [1, 2, 3]}))
    with engine.transaction() as tx:
        tx.execute("INSERT INTO copy SELECT k FROM replica")
    del engine
    again = Engine(":memory:", input_log=log)
    again.execute("CREATE TABLE IF NOT EXISTS copy (k INTEGER)")
    again.execute("CREATE TABLE IF NOT EXISTS replica (k INTEGER)")
    with pytest.raises(ReplayMismatchError, match=r"ad hoc transaction .* statement 1"):
        again.query("SELECT * FROM copy")


def test_deterministic_work_replays_without_a_word(tmp_path: Path) -> None:
    """The digests never refuse what replays the same: SQL whose rows come out in another
    order (a GROUP BY), several procedures, windows, ad hoc transactions and checkpoints."""
    log = str(tmp_path / "in.log")

    def declare(engine: Engine) -> None:
        engine.stream("s", {"k": "INTEGER", "v": "BIGINT"})
        engine.window("w", "s", batches=2, slide=1)
        engine.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BIGINT)")

        @engine.procedure(input="s", output="sums")
        def summing(tx, batch):
            tx.execute("INSERT INTO t SELECT k, sum(v) FROM batch GROUP BY k "
                       "ON CONFLICT (k) DO UPDATE SET v = t.v + excluded.v")
            return tx.sql("SELECT k, sum(v) AS v FROM batch GROUP BY k")

        engine.sql_procedure("double", "SELECT k, v * 2 AS v FROM batch", input="sums",
                             output="doubled")
        engine.sql_procedure("halve", "SELECT k, v // 2 AS v FROM batch", input="doubled",
                             output="halved")

        @engine.procedure(input="w", output="window_sums")
        def wsum(tx, batch):
            return tx.sql("SELECT count(*) AS n, sum(v) AS v FROM batch")

    engine = Engine(":memory:", input_log=log, gc_every=1, gc_min_seconds=0)
    declare(engine)
    for b in range(12):
        engine.ingest("s", [(k % 7, b * 1000 + k) for k in range(3000)])
        engine.run_until_idle()
        if b == 5:
            engine.checkpoint()
        if b % 3 == 0:
            with engine.transaction() as tx:
                tx.execute("UPDATE t SET v = v + 1 WHERE k = ?", b % 7)
    want = engine.query("SELECT * FROM t ORDER BY k").to_pylist()
    del engine
    again = Engine(":memory:", input_log=log, gc_every=1, gc_min_seconds=0)
    declare(again)
    again.run_until_idle()
    assert again.query("SELECT * FROM t ORDER BY k").to_pylist() == want
    again.close()


def test_ad_hoc_queries_replay_without_a_word(tmp_path: Path) -> None:
    """Replay runs every logged statement with ``execute``; a query the block ran with ``sql``
    or ``fetchall`` answers the same there (an aggregate's one integer included)."""
    log = str(tmp_path / "in.log")

    def declare(engine: Engine) -> None:
        engine.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER, v VARCHAR)")

    engine = Engine(":memory:", input_log=log)
    declare(engine)
    with engine.transaction() as tx:
        tx.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
        n = tx.sql("SELECT count(*) AS n FROM t").column("n")[0].as_py()
        rows = tx.fetchall("SELECT k FROM t WHERE k > ?", 1)
        one = tx.fetchone("SELECT max(k) FROM t")
        tx.execute("INSERT INTO t VALUES (?, ?)", n + len(rows) + one[0], "d")
    del engine
    again = Engine(":memory:", input_log=log)
    declare(again)
    assert again.query("SELECT max(k) AS k FROM t").to_pylist() == [{"k": 8}]
    again.close()


def test_a_hugeint_aggregate_read_with_sql_replays_without_a_word(tmp_path: Path) -> None:
    """``sum`` of a BIGINT is a HUGEINT: an Arrow decimal through ``sql``, a Python int
    through ``execute`` at replay; both answer one row."""
    log = str(tmp_path / "in.log")
    engine = Engine(":memory:", input_log=log)
    engine.execute("CREATE TABLE IF NOT EXISTS t (k BIGINT)")
    with engine.transaction() as tx:
        tx.execute("INSERT INTO t VALUES (1), (2)")
        total = tx.sql("SELECT sum(k) AS total FROM t").column("total")[0].as_py()
        tx.execute("INSERT INTO t VALUES (?)", int(total))
    del engine
    again = Engine(":memory:", input_log=log)
    again.execute("CREATE TABLE IF NOT EXISTS t (k BIGINT)")
    assert again.query("SELECT sum(k) AS s FROM t").to_pylist() == [{"s": 6}]
    again.close()


def test_the_rows_digest_ignores_order_and_layout_but_not_values() -> None:
    """``sstore.base.digest.rows``: the same rows in another order or chunking, from a slice or
    hashed through either path (few rows: their text; more: their buffers), digest the same;
    a changed, moved or lost value does not."""
    import datetime
    import decimal

    import pyarrow as pa

    from sstore.base import digest

    table = pa.table({
        "k": pa.array([1, 2, None, 4] * 5, pa.int64()),
        "s": ["a", "bb", None, ""] * 5,
        "d": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("3"),
                       decimal.Decimal("-1")] * 5, pa.decimal128(10, 2)),
        "b": [True, None, False, True] * 5,
        "ts": pa.array([datetime.datetime(2024, 1, 1), None, None,
                        datetime.datetime(2025, 1, 1)] * 5),
        "l": [[1], [2, 3], None, []] * 5,
        "f": [0.1, 0.2, None, 1e300] * 5})
    for rows in (table.slice(0, 4), table):  # 4 rows: the text path; 20: the buffers
        want = digest.rows(rows)
        n = rows.num_rows
        assert digest.rows(rows.take(list(reversed(range(n))))) == want
        assert digest.rows(pa.concat_tables([rows.slice(0, 1), rows.slice(1)])) == want
        assert digest.rows(table.slice(n, n) if n == 4 else table) == want  # a slice
        s = rows.column("s").to_pylist()
        for changed in (["ab", "b"] + s[2:], ["bb", "a"] + s[2:], ["a", "bc"] + s[2:]):
            assert digest.rows(rows.set_column(1, "s", pa.array(changed))) != want
        assert digest.rows(rows.slice(1)) != want


def stamping(engine: Engine, sql: str) -> None:
    engine.stream("s", {"k": "INTEGER"})
    engine.execute("CREATE TABLE IF NOT EXISTS stamps (k INTEGER, stamp VARCHAR)")

    @engine.procedure(input="s")
    def stamp(tx, batch):
        tx.execute(sql)


@pytest.mark.parametrize("sql", [
    "INSERT INTO stamps SELECT k, now()::VARCHAR FROM batch",
    "INSERT INTO stamps SELECT k, CURRENT_TIMESTAMP::VARCHAR FROM batch",
    "INSERT INTO stamps SELECT k, random()::VARCHAR FROM batch",
    "INSERT INTO stamps SELECT k, gen_random_uuid()::VARCHAR FROM batch"])
def test_sql_that_writes_other_values_at_replay_is_refused_live(tmp_path: Path, sql: str
                                                                ) -> None:
    """As many rows at replay, other values: no digest sees it, so weak durability refuses
    the statement when it first runs (the procedure halts, nothing written)."""
    from sstore import NondeterministicError

    engine = Engine(":memory:", input_log=str(tmp_path / "in.log"))
    stamping(engine, sql)
    engine.ingest("s", [(1,)])
    engine.run_until_idle()
    halted = engine.status().halted()
    assert "NondeterministicError" in halted["stamp"] and "from the batch" in halted["stamp"]
    assert engine.query("SELECT count(*) AS n FROM stamps").to_pylist() == [{"n": 0}]
    with pytest.raises(NondeterministicError, match="ad hoc transaction calls .*parameter"):
        with engine.transaction() as tx:
            tx.execute(sql.replace("FROM batch", "FROM (SELECT 1 AS k)"))
    engine.close()


def test_the_same_words_in_literals_names_and_other_modes_are_not_refused(tmp_path: Path
                                                                          ) -> None:
    """Only calls are refused: a literal, a quoted column named "now", full durability."""
    sql = ("INSERT INTO stamps SELECT k, 'random() now() current_timestamp' || \"now\" "
           "FROM (SELECT k, 'x' AS \"now\" FROM batch) -- now()")
    engine = Engine(":memory:", input_log=str(tmp_path / "in.log"))
    stamping(engine, sql)
    engine.ingest("s", [(1,)])
    engine.run_until_idle()
    assert engine.query("SELECT count(*) AS n FROM stamps").to_pylist() == [{"n": 1}]
    engine.close()
    full = Engine(str(tmp_path / "state.duckdb"))
    stamping(full, "INSERT INTO stamps SELECT k, now()::VARCHAR FROM batch")
    full.ingest("s", [(1,)])
    full.run_until_idle()
    assert full.query("SELECT count(*) AS n FROM stamps").to_pylist() == [{"n": 1}]
    full.close()
