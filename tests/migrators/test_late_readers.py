"""A procedure declared after batches of its inputs were collected (removed by GC, or never
stored because every reader of the time read them in its group commit, or chained away) starts
after them, and is never handed one of them as an EMPTY batch: its output would say "batch b
of that input had no rows" where it had some.
"""

from __future__ import annotations

import pytest

from sstore import Engine


def declare(engine: Engine, *, join: bool) -> None:
    engine.stream("a", {"x": "BIGINT"})
    engine.stream("b", {"y": "BIGINT"})

    @engine.procedure(input="a")
    def read_a(tx, batch):
        pass

    @engine.procedure(input="b")
    def read_b(tx, batch):
        pass

    if join:
        engine.execute("CREATE TABLE IF NOT EXISTS joined (batch_id BIGINT, from_a BIGINT, "
                       "from_b BIGINT)")

        @engine.procedure(input=["a", "b"])
        def join_ab(tx, batches):
            tx.execute("INSERT INTO joined VALUES (?, ?, ?)", tx.batch_id,
                       batches["a"].num_rows, batches["b"].num_rows)


@pytest.mark.parametrize("group_commit", [True, False], ids=["group", "one-te"])
def test_a_later_procedure_of_two_inputs_collected_to_different_batches_starts_after_both(
        state_path: str, group_commit: bool) -> None:
    """``a`` is collected through batch 5, ``b`` through 3. A procedure of both, declared after
    a restart, used to run batch 4 with ``b``'s batch 4 and, for ``a``, an empty batch in
    place of the two rows GC had removed: it starts after batch 5, like a procedure of one
    input starts after what was collected of it."""
    engine = Engine(state_path, group_commit=group_commit)
    declare(engine, join=False)
    for k in range(1, 6):
        engine.ingest("a", [(k,), (k,)], batch_id=k)
    for k in range(1, 4):
        engine.ingest("b", [(k,)], batch_id=k)
    engine.run_until_idle()
    engine.collect_garbage()
    assert engine.collected_through("a") == 5 and engine.collected_through("b") == 3
    engine.close()

    again = Engine(state_path, group_commit=group_commit)
    declare(again, join=True)
    again.ingest("b", [(4,)], batch_id=4)
    again.ingest("a", [(6,), (6,)], batch_id=6)
    again.ingest("b", [(6,)], batch_id=6)
    again.run_until_idle()
    assert again.query("SELECT * FROM joined ORDER BY ALL").to_pylist() == [
        {"batch_id": 6, "from_a": 2, "from_b": 1}]
    again.close()


def test_a_procedure_of_two_inputs_declared_from_the_start_gets_every_batch(
        state_path: str) -> None:
    """The seam that holds: declared with the dataflow, the procedure keeps its inputs'
    batches until it has read them (across a restart too), batches of one input only get
    an empty batch of the other (ids of a border stream only increase: it can never come)."""
    engine = Engine(state_path)
    declare(engine, join=True)
    engine.ingest("a", [(1,), (1,)], batch_id=1)
    engine.ingest("b", [(2,)], batch_id=2)
    engine.close()
    again = Engine(state_path)
    declare(again, join=True)
    again.ingest_and_run("a", [(3,)], batch_id=3)
    again.ingest_and_run("b", [(3,), (3,), (3,)], batch_id=3)
    again.run_until_idle()
    assert again.query("SELECT * FROM joined ORDER BY ALL").to_pylist() == [
        {"batch_id": 1, "from_a": 2, "from_b": 0},
        {"batch_id": 2, "from_a": 0, "from_b": 1},
        {"batch_id": 3, "from_a": 1, "from_b": 3}]
    again.close()
