"""Input values keep their value or are refused: never truncated, rounded, shifted or guessed.

Every row entering a stream (tuples, dicts, Arrow tables, DataFrames, a polystore CALL) either
stores exactly the value that was sent, in the column's type, or the whole call fails with a
``SchemaError`` naming the column and the row, before any transaction, using no batch-id.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from sstore import Engine, OutOfOrderBatchError, SchemaError
from sstore.polystore import Polystore

COLUMNS = {"i": "INTEGER", "b": "BIGINT", "d": "DECIMAL(10,2)", "f": "DOUBLE", "r": "REAL",
           "flag": "BOOLEAN", "ts": "TIMESTAMP", "tstz": "TIMESTAMPTZ", "day": "DATE",
           "s": "VARCHAR"}
PLUS2 = dt.timezone(dt.timedelta(hours=2))
NOON = dt.datetime(2024, 1, 1, 12, 0)
NS = pd.Timestamp("2024-01-01 12:00:00.000000001")


@pytest.fixture
def eng(state_path: str):
    engine = Engine(state_path)
    engine.stream("v", COLUMNS)
    yield engine
    engine.close()


def row(**values: Any) -> dict[str, Any]:
    return {name: values.get(name) for name in COLUMNS}


def stored(engine: Engine, column: str) -> list[Any]:
    return engine.query(f"SELECT {column} FROM v ORDER BY _batch_id").column(0).to_pylist()


def refused(engine: Engine, rows: Any, message: str) -> None:
    """``rows`` raise a SchemaError matching ``message``, store nothing and use no batch-id."""
    count = "SELECT count(*) AS n, coalesce(max(_batch_id), 0) AS last FROM v"
    before = engine.query(count).to_pylist()
    with pytest.raises(SchemaError, match=message):
        engine.ingest("v", rows)
    assert engine.query(count).to_pylist() == before
    assert engine.ingest("v", [row()]) == before[0]["last"] + 1


BAD_VALUES = [
    ("i", 2.5, "truncated"), ("i", np.float64(2.5), "truncated"),
    ("i", Decimal("2.5"), "not a valid int32"), ("i", 2 ** 40, "not a valid int32"),
    ("i", float("nan"), "not a valid int32"), ("i", float("inf"), "not a valid int32"),
    ("i", True, "a boolean is not a number"), ("i", "0x10", "only decimal digits"),
    ("i", "2.5", "only decimal digits"), ("i", " 12", "only decimal digits"),
    ("i", dt.date(2024, 1, 1), "not a valid int32"),
    ("b", 2 ** 63, "not a valid int64"), ("b", -(2 ** 63) - 1, "not a valid int64"),
    ("d", Decimal("1.005"), "not a valid decimal128"), ("d", 1.005, "would be rounded"),
    ("d", "1.005", "not a valid decimal128"), ("d", Decimal(123456789012), "not a valid"),
    ("d", float("nan"), "not a valid decimal128"), ("d", True, "a boolean is not a number"),
    ("f", True, "a boolean is not a number"), ("f", 2 ** 53 + 1, "not a valid double"),
    ("r", 1e300, "too large"), ("r", "1e300", "too large"),
    ("flag", 1, "only true and false"), ("flag", "1", "only true and false"),
    ("flag", "yes", "only true and false"),
    ("ts", dt.datetime(2024, 1, 1, 12, tzinfo=PLUS2), "has a time zone"),
    ("ts", NS, "nanoseconds"), ("ts", 1, "not a date or time"),
    ("ts", "2024-01-01T12:00:00+02:00", "not a valid timestamp"),
    ("tstz", NOON, "has no time zone"), ("tstz", "2024-01-01 12:00:00", "not a valid"),
    ("tstz", dt.date(2024, 1, 1), "has no time zone"),
    ("day", NOON, "time of day"), ("day", 20240101, "not a date or time"),
    ("day", dt.datetime(2024, 1, 1, tzinfo=PLUS2), "has a time zone"),
    ("s", b"\xff", "not a valid string"),
]


@pytest.mark.parametrize("column, value, reason", BAD_VALUES,
                         ids=[f"{c}-{v!r}" for c, v, _ in BAD_VALUES])
def test_a_value_that_would_change_is_refused(eng: Engine, column: str, value: Any,
                                              reason: str) -> None:
    """Refused in every row shape: dicts, tuples, and mixed with good values before it."""
    eng.ingest("v", [row()])
    as_dicts = [row(), row(**{column: value})]
    as_tuples = [tuple(r.values()) for r in as_dicts]
    for rows in (as_dicts, as_tuples):
        refused(eng, rows, rf"stream 'v': column '{column}' row 1: .*{reason}")


GOOD_VALUES = [
    ("i", 2.0, 2), ("i", "12", 12), ("i", "-007", -7), ("i", Decimal(3), 3),
    ("i", np.int64(5), 5), ("b", 2 ** 63 - 1, 2 ** 63 - 1), ("b", -(2 ** 63), -(2 ** 63)),
    ("d", Decimal("1.5"), Decimal("1.50")), ("d", 1.25, Decimal("1.25")),
    ("d", 0.1, Decimal("0.10")), ("d", 3, Decimal("3.00")), ("d", "1.05", Decimal("1.05")),
    ("f", 3, 3.0), ("f", "1.5", 1.5), ("f", Decimal("0.5"), 0.5), ("r", 0.5, 0.5),
    ("r", "inf", float("inf")), ("flag", "TRUE", True), ("flag", False, False),
    ("ts", "2024-01-01 12:00:00", NOON), ("ts", dt.date(2024, 1, 1), dt.datetime(2024, 1, 1)),
    ("ts", pd.Timestamp(NOON), NOON),
    ("tstz", dt.datetime(2024, 1, 1, 12, tzinfo=PLUS2),
     dt.datetime(2024, 1, 1, 10, tzinfo=dt.UTC)),
    ("tstz", "2024-01-01T12:00:00+02:00", dt.datetime(2024, 1, 1, 10, tzinfo=dt.UTC)),
    ("day", dt.datetime(2024, 1, 1), dt.date(2024, 1, 1)), ("day", "2024-01-02",
                                                            dt.date(2024, 1, 2)),
    ("s", 7, "7"), ("s", "x", "x"), ("s", b"bytes", "bytes"),
]


@pytest.mark.parametrize("column, value, expected", GOOD_VALUES,
                         ids=[f"{c}-{v!r}" for c, v, _ in GOOD_VALUES])
def test_a_value_that_fits_exactly_is_stored_as_sent(eng: Engine, column: str, value: Any,
                                                     expected: Any) -> None:
    eng.ingest("v", [row(**{column: value})])
    eng.ingest("v", [tuple(row(**{column: value}).values())])
    got = stored(eng, column)
    if column == "tstz":
        got = [g.astimezone(dt.UTC) for g in got]
    assert got == [expected, expected]


@pytest.mark.parametrize("table, column, reason", [
    (pa.table({"i": pa.array([1.0, 2.5])}), "i", "truncated"),
    (pa.table({"i": pa.array([1, 2 ** 40])}), "i", "not a valid int32"),
    (pa.table({"i": pa.array([None, True])}), "i", "a boolean is not a number"),
    (pa.table({"flag": pa.array([None, 2])}), "flag", "only true and false"),
    (pa.table({"d": pa.array([1.5, 1.005])}), "d", "would be rounded"),
    (pa.table({"r": pa.array([1.0, 1e300])}), "r", "too large"),
    (pa.table({"ts": pa.array([None, NOON], pa.timestamp("us", tz="+02:00"))}), "ts",
     "has a time zone"),
    (pa.table({"ts": pa.array([0, 1], pa.timestamp("ns"))}), "ts", "would lose data"),
    (pa.table({"tstz": pa.array([None, NOON])}), "tstz", "has no time zone"),
    (pa.table({"day": pa.array([dt.datetime(2024, 1, 1), NOON])}), "day", "time of day"),
    (pa.table({"i": pa.array(["1", "0x10"])}), "i", "only decimal digits"),
    (pd.DataFrame({"i": [1.0, 2.5]}), "i", "truncated"),
    (pd.DataFrame({"i": [1, 2 ** 40]}), "i", "not a valid int32"),
    (pd.DataFrame({"ts": pd.to_datetime(["2024-01-01 00:00:00", "2024-01-01 00:00:00.000000001"],
                                        format="ISO8601")}),
     "ts", "would lose data"),
])
def test_arrow_tables_and_dataframes_are_held_to_the_same_rule(eng: Engine, table: Any,
                                                               column: str, reason: str) -> None:
    if isinstance(table, pd.DataFrame):
        full = pd.DataFrame({name: [None] * len(table) for name in COLUMNS})
        for name in table.columns:
            full[name] = table[name]
        rows: Any = full
    else:
        rows = pa.table({name: (table.column(name) if name in table.column_names
                                else pa.nulls(table.num_rows)) for name in COLUMNS})
    eng.ingest("v", [row()])
    refused(eng, rows, rf"column '{column}' row 1: .*{reason}")


def test_dataframe_missing_values_are_nulls(eng: Engine) -> None:
    """pandas stores a missing integer as NaN in a float column; Arrow reads it as NULL."""
    frame = pd.DataFrame({"i": [1, None], "f": [0.5, float("nan")], "s": ["a", None]})
    full = frame.reindex(columns=list(COLUMNS))
    eng.ingest("v", full)
    assert stored(eng, "i") == [1, None] and stored(eng, "f") == [0.5, None]


def test_dict_rows_must_name_every_column(eng: Engine) -> None:
    eng.ingest("v", [row()])
    partial = row(i=1)
    del partial["s"]
    refused(eng, [row(i=2), partial], r"row 1 is missing column\(s\) \['s'\]")
    eng.ingest("v", [row(i=3, s=None)])  # an explicit None is a NULL
    assert stored(eng, "i") == [None, None, 3]


def test_batch_ids_beyond_bigint_are_refused_before_any_transaction(eng: Engine) -> None:
    top = 2 ** 63 - 1
    with pytest.raises(OutOfOrderBatchError, match="BIGINT"):
        eng.ingest("v", [row(i=1)], batch_id=2 ** 63)
    with pytest.raises(OutOfOrderBatchError, match="positive integer"):
        eng.ingest("v", [row(i=1)], batch_id=True)
    assert eng.ingest("v", [row(i=1)], batch_id=top) == top
    with pytest.raises(OutOfOrderBatchError, match="BIGINT"):
        eng.ingest("v", [row(i=2)])  # the next id would not fit either
    assert stored(eng, "i") == [1]


def test_polystore_call_refuses_a_float_for_an_integer_column(state_path: str) -> None:
    engine = Engine(state_path)
    engine.stream("orders", {"item": "VARCHAR", "qty": "INTEGER"})

    @engine.procedure(input="orders", output="accepted")
    def take(tx, batch):
        return tx.sql("SELECT item, qty FROM batch")

    ps = Polystore(None, engines={"stream": engine})
    ps.catalog.add_engine("stream", "streaming", engine.path)
    with pytest.raises(SchemaError,
                       match=r"column 'qty' row 0: Decimal\('2.5'\) is not a valid int32"):
        ps.query("bdstream(CALL take('bolt', 2.5))")
    out = ps.query("bdstream(CALL take('bolt', 2))")
    assert out.to_pylist() == [{"item": "bolt", "qty": 2}]
    assert engine.query("SELECT _batch_id, qty FROM accepted").to_pylist() == [
        {"_batch_id": 1, "qty": 2}]
    engine.close()


def test_mixed_python_types_in_one_column_keep_their_rows(eng: Engine) -> None:
    """Values of several Python types are converted type by type, then put back in row order;
    a refused one is named by its row in the whole batch."""
    values = [1, "2", None, 3.0, np.int16(4), Decimal(5), "-6"]
    eng.ingest("v", [row(i=v) for v in values])
    assert stored(eng, "i") == [1, 2, None, 3, 4, 5, -6]
    refused(eng, [row(i=v) for v in [1, "2", None, 3.0, 4.5, "7"]],
            r"column 'i' row 4: 4.5 is not a valid int32")


NESTED = {"addr": "STRUCT(city VARCHAR, zip VARCHAR)", "ts": "TIMESTAMP[]",
          "dec": "DECIMAL(10,2)[]", "days": "DATE[]", "ints": "INTEGER[]", "flags": "BOOLEAN[]",
          "at": "TIME"}


@pytest.mark.parametrize("column, value", [
    ("addr", {"city": "Oslo", "zipcode": "0150"}),  # a misspelled field: was dropped
    ("addr", {"city": "Oslo"}),  # a missing field: was NULL
    ("addr", {"city": "Oslo", "zip": "0150", "country": "NO"}),  # an extra one: was dropped
    ("ts", [dt.datetime(2024, 1, 1, 10, tzinfo=PLUS2)]),  # was shifted to UTC
    ("ts", [1700000000]),  # was read as epoch seconds
    ("dec", [1.005]),  # was rounded to 1.00
    ("days", [NOON]),  # lost its time of day
    ("ints", [True]),  # became 1
    ("flags", [1]),  # became true
    ("at", dt.time(10, 0, tzinfo=PLUS2)),  # a TIME dropped the offset
], ids=lambda v: repr(v)[:30])
def test_values_inside_nested_columns_and_zoned_times_are_refused(column: str,
                                                                  value: Any) -> None:
    """Found by a hostile pass: top-level values were held to the rule, values inside
    STRUCT, LIST and MAP columns (and a TIME's offset) were changed without an error."""
    eng = Engine()
    eng.stream("nested", {column: NESTED[column]})
    with pytest.raises(SchemaError, match=f"column '{column}' row 0"):
        eng.ingest("nested", [(value,)])
    assert eng.query("SELECT count(*) AS n FROM nested").column("n")[0].as_py() == 0


def test_nested_values_that_fit_are_stored_as_sent() -> None:
    eng = Engine()
    eng.stream("nested", NESTED)
    row = ({"city": "Oslo", "zip": "0150"}, [NOON, dt.datetime(2024, 1, 2)], [1.5, 2.25],
           [dt.date(2024, 1, 1)], [1, 2], [True, np.bool_(False)], dt.time(10, 0))
    eng.ingest("nested", [row])
    stored = eng.latest("nested")[1].to_pylist()[0]
    assert stored == {"addr": {"city": "Oslo", "zip": "0150"},
                      "ts": [NOON, dt.datetime(2024, 1, 2)],
                      "dec": [Decimal("1.50"), Decimal("2.25")], "days": [dt.date(2024, 1, 1)],
                      "ints": [1, 2], "flags": [True, False], "at": dt.time(10, 0)}
