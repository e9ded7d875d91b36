"""Ad hoc OLTP transactions share the state with stream transactions: no lost update."""

from __future__ import annotations

import threading

import pytest

from sstore import Engine, TransactionStateError
from sstore.execution.transaction import TxState


def counter_engine(path: str) -> Engine:
    eng = Engine(path)
    eng.stream("ticks", {"n": "INTEGER"})
    eng.execute("CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value BIGINT)")
    eng.execute("INSERT INTO counter VALUES (1, 0) ON CONFLICT DO NOTHING")

    @eng.procedure(input="ticks")
    def add_ticks(tx, batch):
        # read-modify-write in Python on purpose: a lost update would show here
        (value,) = tx.fetchone("SELECT value FROM counter WHERE id = 1")
        (added,) = tx.fetchone("SELECT coalesce(sum(n), 0) FROM batch")
        tx.execute("UPDATE counter SET value = ? WHERE id = 1", value + added)

    return eng


def test_concurrent_oltp_and_stream_lose_no_update(state_path: str) -> None:
    eng = counter_engine(state_path)
    stop = threading.Event()
    runner = threading.Thread(target=eng.run, args=(stop,), kwargs={"poll_seconds": 0.01})
    runner.start()

    def oltp_worker() -> None:
        for _ in range(150):
            with eng.transaction() as tx:
                (value,) = tx.fetchone("SELECT value FROM counter WHERE id = 1")
                tx.execute("UPDATE counter SET value = ? WHERE id = 1", value + 1000)

    workers = [threading.Thread(target=oltp_worker) for _ in range(2)]
    for w in workers:
        w.start()
    for _ in range(150):
        eng.ingest("ticks", [(1,), (2,)])
    for w in workers:
        w.join()
    while eng.status().procedures[0].pending:
        stop.wait(0.01)
    stop.set()
    runner.join()
    value = eng.query("SELECT value FROM counter WHERE id = 1").column(0)[0].as_py()
    assert value == 2 * 150 * 1000 + 150 * 3
    eng.close()


def test_failed_oltp_transaction_rolls_back(engine: Engine) -> None:
    engine.execute("CREATE TABLE acct (id INTEGER PRIMARY KEY,"
                   " balance BIGINT CHECK (balance >= 0))")
    engine.execute("INSERT INTO acct VALUES (1, 100), (2, 0)")
    with pytest.raises(Exception, match="CHECK"):
        with engine.transaction() as tx:
            tx.execute("UPDATE acct SET balance = balance + 150 WHERE id = 2")
            tx.execute("UPDATE acct SET balance = balance - 150 WHERE id = 1")
    assert engine.query("SELECT balance FROM acct ORDER BY id").column(0).to_pylist() == [100, 0]


def test_transaction_handle_is_dead_after_commit(engine: Engine) -> None:
    engine.execute("CREATE TABLE t (x INTEGER)")
    with engine.transaction() as tx:
        tx.execute("INSERT INTO t VALUES (1)")
    assert tx.state is TxState.COMMITTED
    with pytest.raises(TransactionStateError, match="committed"):
        tx.execute("INSERT INTO t VALUES (2)")
    assert engine.query("SELECT count(*) FROM t").column(0)[0].as_py() == 1


def test_a_query_does_not_wait_for_a_running_transaction_execution(state_path: str) -> None:
    """Queries read a committed snapshot on a cursor of their own: a sink reading its batches
    is not held up by the next batch's TEs (and sees none of their uncommitted writes)."""
    import threading
    import time

    engine = Engine(state_path)
    engine.stream("inp", {"x": "INTEGER"})
    engine.execute("CREATE TABLE IF NOT EXISTS seen (x INTEGER)")
    inside = threading.Event()
    release = threading.Event()

    @engine.procedure(input="inp")
    def slow(tx, batch):
        tx.execute("INSERT INTO seen SELECT x FROM batch")
        inside.set()
        release.wait(10)

    engine.ingest("inp", [(1,)])
    runner = threading.Thread(target=engine.run_until_idle)
    runner.start()
    try:
        assert inside.wait(10)
        began = time.monotonic()
        rows = engine.query("SELECT count(*) AS n FROM seen").to_pylist()
        assert time.monotonic() - began < 2, "the query waited for the TE"
        assert rows == [{"n": 0}]  # the TE has not committed
    finally:
        release.set()
        runner.join()
    assert engine.query("SELECT count(*) AS n FROM seen").to_pylist() == [{"n": 1}]
    engine.close()
