"""Border ingest: batch-ids, idempotent re-sends, out-of-order and malformed input."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from sstore import DeclarationError, Engine, OutOfOrderBatchError, SchemaError, UnknownStreamError


def votes_engine(path: str) -> Engine:
    eng = Engine(path)
    eng.stream("votes", {"phone": "BIGINT", "contestant": "INTEGER", "note": "VARCHAR"})
    return eng


def stored(eng: Engine) -> list[tuple[int, int, int]]:
    return [tuple(r.values()) for r in eng.query(
        "SELECT _batch_id, phone, contestant FROM votes ORDER BY _batch_id, phone").to_pylist()]


def test_ids_increase_and_resend_is_a_noop(state_path: str) -> None:
    eng = votes_engine(state_path)
    first = eng.ingest("votes", [(1, 1, "a"), (2, 2, None)])
    second = eng.ingest("votes", [{"phone": 3, "contestant": 1, "note": None}])
    assert (first, second) == (1, 2) and not first.duplicate
    again = eng.ingest("votes", [(1, 1, "a"), (2, 2, None)], batch_id=1)
    assert again == 1 and again.duplicate and again.rows == 0
    jump = eng.ingest("votes", [(4, 4, "x")], batch_id=10)
    assert jump == 10
    assert eng.ingest("votes", [(5, 5, "y")]) == 11
    assert stored(eng) == [(1, 1, 1), (1, 2, 2), (2, 3, 1), (10, 4, 4), (11, 5, 5)]
    eng.close()
    # after a restart the same ids are still known
    eng = votes_engine(state_path)
    assert eng.ingest("votes", [(3, 1, None)], batch_id=2).duplicate  # the same rows
    assert eng.ingest("votes", [(6, 6, "w")]) == 12
    eng.close()


def test_lower_new_id_is_rejected(engine: Engine) -> None:
    engine.stream("votes", {"phone": "BIGINT"})
    engine.ingest("votes", [(1,)], batch_id=5)
    with pytest.raises(OutOfOrderBatchError, match="lower than the last ingested"):
        engine.ingest("votes", [(2,)], batch_id=3)
    for bad in (0, -1, 1.5, "7", True):
        with pytest.raises(OutOfOrderBatchError, match="positive integer"):
            engine.ingest("votes", [(2,)], batch_id=bad)
    assert engine.query("SELECT count(*) AS n FROM votes").column("n")[0].as_py() == 1


@pytest.mark.parametrize("rows, message", [
    ([(1, 2)], "row 0 has 2 fields, expected 3"),
    ([(1, 2, "a"), (1, 2, "b", 4)], "row 1 has 4 fields"),
    ([{"phone": 1, "contestant": 2, "colour": "red"}], "unknown column"),
    ([(1, "two", "a")], "column 'contestant' row 0: 'two' is not a valid int32"),
    ([(1, 2, "a"), (99999999999999999999999, 2, "b")], "column 'phone' row 1"),
    (pa.table({"phone": [1], "contestant": ["x"], "note": ["a"]}), "column 'contestant' row 0"),
    (pa.table({"phone": [1], "note": ["a"]}), "missing column"),
    ("not rows", "rows must be"),
])
def test_malformed_rows_are_rejected_and_change_nothing(state_path: str, rows: object,
                                                        message: str) -> None:
    eng = votes_engine(state_path)
    eng.ingest("votes", [(7, 7, "ok")])
    with pytest.raises(SchemaError, match=message):
        eng.ingest("votes", rows)
    assert stored(eng) == [(1, 7, 7)]
    assert eng.ingest("votes", [(8, 8, "ok")]) == 2  # the failed call used no batch-id
    eng.close()


def test_accepts_arrow_pandas_and_strings_that_parse(engine: Engine) -> None:
    engine.stream("votes", {"phone": "BIGINT", "contestant": "INTEGER", "note": "VARCHAR"})
    engine.ingest("votes", pa.table({"note": ["n"], "phone": [1], "contestant": [2]}))
    engine.ingest("votes", pd.DataFrame({"phone": [2], "contestant": [3], "note": ["m"]}))
    engine.ingest("votes", [("3", "4", "o")])
    assert stored(engine) == [(1, 1, 2), (2, 2, 3), (3, 3, 4)]


def test_only_border_streams_take_ingest(engine: Engine) -> None:
    engine.stream("raw", {"x": "INTEGER"})

    @engine.procedure(input="raw", output="clean")
    def cleanse(tx, batch):
        return tx.sql("SELECT x FROM batch")

    with pytest.raises(DeclarationError, match="written by procedure 'cleanse'"):
        engine.ingest("clean", [(1,)])
    with pytest.raises(UnknownStreamError):
        engine.ingest("nope", [(1,)])


def test_declarations_are_checked(engine: Engine) -> None:
    engine.stream("s", {"x": "INTEGER"})
    with pytest.raises(DeclarationError, match="already declared"):
        engine.stream("s", {"x": "INTEGER"})

    @engine.procedure(input="missing", output="o")
    def p(tx, batch):
        return None

    with pytest.raises(UnknownStreamError, match="'missing'"):
        engine.ingest("s", [(1,)])


def test_cycles_are_rejected(engine: Engine) -> None:
    engine.stream("s1", {"x": "INTEGER"})
    engine.stream("s2", {"x": "INTEGER"})

    @engine.procedure(input="s1", output="s2")
    def p1(tx, batch):
        return batch

    @engine.procedure(input="s2", output="s1")
    def p2(tx, batch):
        return batch

    with pytest.raises(DeclarationError, match="cycle"):
        engine.run_until_idle()


def test_redeclaring_on_an_existing_file_with_other_columns_fails(state_path: str) -> None:
    eng = Engine(state_path)
    eng.stream("s", {"x": "INTEGER"})
    eng.ingest("s", [(1,)])
    eng.close()
    eng = Engine(state_path)
    eng.stream("s", {"y": "INTEGER"})
    with pytest.raises(DeclarationError, match="state file has"):
        eng.ingest("s", [(1,)])
    eng.close()
