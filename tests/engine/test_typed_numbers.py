"""A number goes in as the user wrote it, or is refused (issue 34, item 10).

A Python float is the number its shortest decimal form shows (``repr(x)``: what the user
typed, and what ``print`` shows): ``19.99`` is 19.99, not the binary fraction
19.989999999999998436805981327779591083526611328125 that holds it. Into ``DECIMAL(p,s)`` it
goes in as that decimal when it has at most ``s`` digits after the point and fits ``p`` digits;
into an integer column when it is a whole number in range. Anything else would be rounded,
truncated or overflowed, and is refused. ``19.99`` and ``130.42`` were refused as "changing
their value" (Arrow's DECIMAL -> DOUBLE cast, used to check, is off by an ulp), while ``0.1``
was accepted.

The properties below hold every path a value can take in (tuples, dicts, DataFrames, Arrow
tables, ``ingest_and_run``, the Coalescer, ``load_table``) against an oracle written with
Python's ``decimal`` module, for random floats, decimals and integers into decimals of several
precisions and scales, integers of three widths, DOUBLE and REAL.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sstore import Engine, SchemaError
from sstore.base.rows import to_arrow
from sstore.coalesce import Coalescer, CoalescerFailed

TYPES = {"d102": "DECIMAL(10,2)", "d52": "DECIMAL(5,2)", "d44": "DECIMAL(4,4)",
         "d184": "DECIMAL(18,4)", "d380": "DECIMAL(38,0)", "d3810": "DECIMAL(38,10)",
         "d3830": "DECIMAL(38,30)", "i16": "SMALLINT", "i32": "INTEGER", "i64": "BIGINT",
         "f64": "DOUBLE", "f32": "REAL"}
INT_BITS = {"SMALLINT": 16, "INTEGER": 32, "BIGINT": 64}


class Refused:
    """The oracle's answer for a value the column cannot hold unchanged."""

    def __repr__(self) -> str:
        return "REFUSED"


REFUSED = Refused()


# -- the oracle: Python's decimal module, exact ------------------------------------------------

def typed(value: Any) -> Decimal | None:
    """The number ``value`` stands for (None: NaN or an infinity)."""
    if isinstance(value, bool):
        raise TypeError("booleans are not numbers here")
    if isinstance(value, (float, np.floating)):
        value = Decimal(repr(float(value)))
    number = Decimal(value)
    return number if number.is_finite() else None


def digits(number: Decimal) -> tuple[int, int]:
    """(digits before the point, digits after it) of ``number`` written without trailing
    zeros: 1.50 is (1, 1), 1E+16 is (17, 0), 0.001 is (0, 3). Exact (no context rounding)."""
    _, coefficient, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, coefficient)).rstrip("0")
    if not text:
        return 0, 0
    exponent += len(coefficient) - len(text)
    return max(0, len(text) + exponent), max(0, -exponent)


def nearest_real(q: Fraction) -> float:
    """The REAL (float32) nearest to ``q``, ties to even, exactly."""
    guess = np.float32(float(q))
    candidates = [guess, np.nextafter(guess, np.float32(np.inf)),
                  np.nextafter(guess, np.float32(-np.inf))]
    finite = [c for c in candidates if np.isfinite(c)]
    best = min(finite, key=lambda c: (abs(Fraction(float(c)) - q),
                                      int(np.array(c).view(np.uint32)) & 1))
    return float(best)


def expected(value: Any, sql_type: str) -> Any:
    """What a column of ``sql_type`` must hold for ``value``, or REFUSED."""
    if value is None:
        return None
    match = re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", sql_type)
    if match:
        precision, scale = int(match[1]), int(match[2])
        number = typed(value)
        if number is None:
            return REFUSED
        before, after = digits(number)
        return number if after <= scale and before <= precision - scale else REFUSED
    if sql_type in INT_BITS:
        number = typed(value)
        if number is None or digits(number)[1]:
            return REFUSED
        bits = INT_BITS[sql_type]
        return int(number) if -(2 ** (bits - 1)) <= number < 2 ** (bits - 1) else REFUSED
    if sql_type == "DOUBLE":
        if isinstance(value, int):
            return float(value) if abs(value) <= 2 ** 53 else REFUSED
        return float(value)  # a Decimal: the nearest double (float() of a Decimal is exact)
    assert sql_type == "REAL"
    if isinstance(value, int):  # Arrow's rule: an integer only where every one is exact
        return float(value) if abs(value) <= 2 ** 24 else REFUSED
    if isinstance(value, Decimal):
        return nearest_real(Fraction(value))
    with np.errstate(over="ignore"):
        real = np.float32(value)
    if math.isfinite(value) and not np.isfinite(real):
        return REFUSED  # too large for REAL: it would become an infinity
    return float(real)


def same(stored: Any, wanted: Any) -> bool:
    if isinstance(wanted, float) and math.isnan(wanted):
        return isinstance(stored, float) and math.isnan(stored)
    if isinstance(wanted, Decimal):
        return isinstance(stored, Decimal) and stored == wanted
    return type(stored) is type(wanted) and stored == wanted


# -- what users type ---------------------------------------------------------------------------

def _written(coefficient: int, exponent: int) -> Decimal:
    return Decimal(f"{coefficient}E{exponent}")


#: a decimal as written: up to 20 digits, up to 14 after the point, or a large exponent
WRITTEN = st.one_of(
    st.builds(_written, st.integers(-10 ** 9, 10 ** 9), st.integers(-6, 2)),
    st.builds(_written, st.integers(-10 ** 20, 10 ** 20), st.integers(-14, 6)),
    st.builds(_written, st.integers(-999, 999), st.integers(-30, 30)))
#: a float the user typed (the float nearest a written decimal), or any float at all
FLOATS = st.one_of(WRITTEN.map(float), WRITTEN.map(float),
                   st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([19.99, 130.42, 0.1, 0.125, 2.5, 1e12, 1e16, -0.0, 2.0 ** 60,
                                    1.005, 99999999.99, 0.30000000000000004, 5e-324,
                                    float("nan"), float("inf"), -float("inf")]))
#: a decimal the user typed: at most 38 digits (what Arrow's decimal128 holds)
DECIMALS = st.one_of(WRITTEN, st.builds(_written, st.integers(-10 ** 38 + 1, 10 ** 38 - 1),
                                        st.integers(-38, 0)))
INTS = st.one_of(st.integers(-1000, 1000), st.integers(-2 ** 70, 2 ** 70),
                 st.sampled_from([2 ** 15, 2 ** 15 - 1, -(2 ** 15) - 1, 2 ** 31, 2 ** 53,
                                  2 ** 53 + 1, 2 ** 63 - 1, -(2 ** 63), 2 ** 24, 2 ** 24 + 1]))
INT64S = st.integers(-(2 ** 63), 2 ** 63 - 1)

FAST = settings(max_examples=12, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def outcome(values: Sequence[Any], sql_type: str) -> tuple[str | None, list[Any]]:
    """(a pattern for "one of the refused rows", or None; what the column must hold). The
    error names a refused row, not always the first (values are converted type by type)."""
    wanted = [expected(v, sql_type) for v in values]
    refused = [str(i) for i, w in enumerate(wanted) if w is REFUSED]
    return (f"({'|'.join(refused)})" if refused else None), wanted


# -- the conversion itself, many examples ------------------------------------------------------

def _convert(values: Sequence[Any], sql_type: str, shape: str) -> list[Any]:
    arrow_type = ARROW_TYPES[sql_type]
    field_schema = pa.schema([pa.field("v", arrow_type)])
    if shape == "tuples":
        rows: Any = [(v,) for v in values]
    elif shape == "arrow":
        rows = pa.table({"v": pa.array(values)})
    else:
        rows = pd.DataFrame({"v": pd.Series(values, dtype="float64")})
    return to_arrow(rows, field_schema, "stream 'x'").column("v").to_pylist()


def _decimal(match: re.Match[str]) -> pa.DataType:
    return pa.decimal128(int(match[1]), int(match[2]))


ARROW_TYPES = {"SMALLINT": pa.int16(), "INTEGER": pa.int32(), "BIGINT": pa.int64(),
               "DOUBLE": pa.float64(), "REAL": pa.float32(),
               **{t: _decimal(re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", t))  # type: ignore[arg-type]
                  for t in TYPES.values() if t.startswith("DECIMAL")}}


def check_conversion(values: Sequence[Any], sql_type: str, shape: str,
                     nan_is_null: bool = False) -> None:
    if nan_is_null:
        values = [None if isinstance(v, float) and math.isnan(v) else v for v in values]
    first, wanted = outcome(values, sql_type)
    if first is not None:
        with pytest.raises(SchemaError, match=rf"column 'v' row {first}: "):
            _convert(values, sql_type, shape)
        return
    got = _convert(values, sql_type, shape)
    assert all(same(g, w) for g, w in zip(got, wanted)), list(zip(values, got, wanted))


@pytest.mark.parametrize("sql_type", sorted(set(TYPES.values())))
@settings(max_examples=120, deadline=None)
@given(values=st.lists(FLOATS, min_size=1, max_size=6))
@example(values=[19.99, 130.42])
@example(values=[0.125])
@example(values=[2.5])
@example(values=[1e12])
@example(values=[float("nan")])
@example(values=[float("inf")])
@example(values=[-0.0])
@example(values=[1e16])
def test_floats_convert_by_their_shortest_decimal(sql_type: str, values: list[float]) -> None:
    for shape in ("tuples", "arrow"):
        check_conversion(values, sql_type, shape)
    check_conversion(values, sql_type, "dataframe", nan_is_null=True)


@pytest.mark.parametrize("sql_type", sorted(set(TYPES.values())))
@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.one_of(WRITTEN.map(float), WRITTEN.map(float), st.none()),
                       min_size=20, max_size=200))
def test_many_typed_floats_in_one_batch(sql_type: str, values: list[float | None]) -> None:
    """Whole batches, with NULLs (the vectorised path, at the column's scale and at smaller
    ones for large values): every value exact, or a bad row named."""
    check_conversion(values, sql_type, "tuples")
    check_conversion(values, sql_type, "arrow")


@pytest.mark.parametrize("sql_type", sorted(set(TYPES.values())))
@settings(max_examples=80, deadline=None)
@given(values=st.lists(DECIMALS, min_size=1, max_size=6))
@example(values=[Decimal("19.99"), Decimal("130.42")])
def test_decimals_convert_exactly(sql_type: str, values: list[Decimal]) -> None:
    check_conversion(values, sql_type, "tuples")
    check_conversion(values, sql_type, "arrow")


@pytest.mark.parametrize("sql_type", sorted(set(TYPES.values())))
@settings(max_examples=80, deadline=None)
@given(values=st.lists(INTS, min_size=1, max_size=6))
def test_integers_convert_exactly(sql_type: str, values: list[int]) -> None:
    check_conversion(values, sql_type, "tuples")
    if all(-(2 ** 63) <= v < 2 ** 63 for v in values):
        check_conversion(values, sql_type, "arrow")


@pytest.mark.parametrize("sql_type", [t for t in sorted(set(TYPES.values()))
                                      if t.startswith("DECIMAL")])
@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=6))
def test_reals_convert_by_their_shortest_real_decimal(sql_type: str,
                                                      values: list[float]) -> None:
    """A REAL (float32) column of an Arrow table: its values are the shortest decimals that
    read back as the same REAL (``np.float32``'s repr), as a float's are for a double."""
    wanted = [expected(Decimal(str(np.float32(v))), sql_type) for v in values]
    first = next((i for i, w in enumerate(wanted) if w is REFUSED), None)  # one Arrow type
    table = pa.table({"v": pa.array(values, pa.float32())})
    schema = pa.schema([pa.field("v", ARROW_TYPES[sql_type])])
    if first is not None:
        with pytest.raises(SchemaError, match=rf"column 'v' row {first}: "):
            to_arrow(table, schema, "stream 'x'")
        return
    got = to_arrow(table, schema, "stream 'x'").column("v").to_pylist()
    assert got == wanted


# -- every path in, through a real engine -------------------------------------------------------

@pytest.fixture(scope="module")
def eng():
    engine = Engine()
    for name, sql_type in TYPES.items():
        engine.stream(f"s_{name}", {"k": "BIGINT", "v": sql_type})
        engine.execute(f"CREATE TABLE t_{name} (k BIGINT, v {sql_type})")
    yield engine
    engine.close()


IDS = itertools.count(1)  # batch-ids and row keys, shared by every test of this module


def _stored(engine: Engine, name: str, batch_id: int) -> list[Any]:
    return engine.query(f"SELECT v FROM s_{name} WHERE _batch_id = ? ORDER BY k",
                        batch_id).column("v").to_pylist()


def _nothing_in(engine: Engine, name: str, batch_id: int) -> None:
    assert engine.query(f"SELECT count(*) AS n FROM s_{name} WHERE _batch_id = ?",
                        batch_id).column("n")[0].as_py() == 0


def _rows(keys: list[int], values: Sequence[Any], shape: str) -> Any:
    if shape == "tuples":
        return list(zip(keys, values))
    if shape == "dicts":
        return [{"k": k, "v": v} for k, v in zip(keys, values)]
    if shape == "dataframe":
        return pd.DataFrame({"k": keys, "v": pd.Series(values, dtype="float64")
                             if all(isinstance(v, float) for v in values) else values})
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(values)})


def _via_coalescer(engine: Engine, stream: str, rows: pa.Table, batch_id: int) -> None:
    coalescer = Coalescer(engine, stream, lambda _rows: batch_id).start()
    try:
        coalescer.offer(rows)
        coalescer.drain(timeout=60)
        coalescer.close()
    except CoalescerFailed as failed:
        raise failed.error from None  # the SchemaError that stopped it


PATHS: dict[str, Callable[[Engine, str, list[int], Sequence[Any], int], None]] = {
    "ingest tuples": lambda e, s, k, v, b: e.ingest(s, _rows(k, v, "tuples"), b),
    "ingest dicts": lambda e, s, k, v, b: e.ingest(s, _rows(k, v, "dicts"), b),
    "ingest DataFrame": lambda e, s, k, v, b: e.ingest(s, _rows(k, v, "dataframe"), b),
    "ingest Arrow": lambda e, s, k, v, b: e.ingest(s, _rows(k, v, "arrow"), b),
    "ingest_and_run": lambda e, s, k, v, b: e.ingest_and_run(s, _rows(k, v, "tuples"), b),
    "Coalescer": lambda e, s, k, v, b: _via_coalescer(e, s, _rows(k, v, "arrow"), b),
}

VALUES = st.one_of(st.lists(FLOATS, min_size=1, max_size=4),
                   st.lists(DECIMALS, min_size=1, max_size=4),
                   st.lists(INT64S, min_size=1, max_size=4))


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("path", list(PATHS))
@FAST
@given(values=VALUES)
@example(values=[19.99, 130.42])
@example(values=[0.125])
@example(values=[float("nan")])
def test_every_ingest_path_stores_what_was_typed_or_refuses(eng: Engine, path: str, name: str,
                                                            values: list[Any]) -> None:
    if path == "ingest DataFrame":  # pandas keeps a missing number as NaN: Arrow reads NULL
        values = [None if isinstance(v, float) and math.isnan(v) else v for v in values]
    if path in ("ingest DataFrame", "Coalescer", "ingest Arrow") and \
            len({type(v) for v in values}) > 1:
        return  # one Arrow type per column: these paths take no mixed Python values
    first, wanted = outcome(values, TYPES[name])
    batch_id = next(IDS)
    keys = [next(IDS) for _ in values]
    if first is not None:
        with pytest.raises(SchemaError, match=rf"column 'v' row {first}: "):
            PATHS[path](eng, f"s_{name}", keys, values, batch_id)
        _nothing_in(eng, name, batch_id)
        return
    PATHS[path](eng, f"s_{name}", keys, values, batch_id)
    got = _stored(eng, name, batch_id)
    assert all(same(g, w) for g, w in zip(got, wanted)) and len(got) == len(wanted), \
        list(zip(values, got, wanted))


@pytest.mark.parametrize("name", list(TYPES))
@FAST
@given(values=VALUES)
@example(values=[19.99, 130.42])
def test_load_table_stores_what_was_typed_or_refuses(eng: Engine, name: str,
                                                     values: list[Any]) -> None:
    """``Engine.load_table`` into an existing table (replicas, ``cast``): the same rule."""
    if len({type(v) for v in values}) > 1:
        return
    first, wanted = outcome(values, TYPES[name])
    keys = [next(IDS) for _ in values]
    rows = _rows(keys, values, "arrow")
    count = f"SELECT count(*) AS n FROM t_{name}"
    before = eng.query(count).column("n")[0].as_py()
    if first is not None:
        with pytest.raises(SchemaError, match=rf"table 't_{name}': column 'v' row {first}: "):
            eng.load_table(f"t_{name}", rows)
        assert eng.query(count).column("n")[0].as_py() == before
        return
    eng.load_table(f"t_{name}", rows)
    got = eng.query(f"SELECT v FROM t_{name} WHERE k >= ? ORDER BY k",
                    keys[0]).column("v").to_pylist()
    assert all(same(g, w) for g, w in zip(got, wanted)) and len(got) == len(wanted), \
        list(zip(values, got, wanted))


# -- the cases of the issue, by name -----------------------------------------------------------

def test_prices_typed_as_floats_go_into_a_decimal_as_typed() -> None:
    """The report: 19.99 and 130.42 from tuples and from a pandas float64 column were refused
    as "changing their value" in DECIMAL(10,2), while 0.1 went in."""
    engine = Engine()
    engine.stream("prices", {"item": "VARCHAR", "price": "DECIMAL(10,2)"})
    engine.ingest("prices", [("pen", 19.99), ("bag", 130.42), ("gum", 0.1)])
    engine.ingest("prices", pd.DataFrame({"item": ["pen", "bag"], "price": [19.99, 130.42]}))
    got = engine.query("SELECT price FROM prices ORDER BY _batch_id, item DESC")
    assert got.column("price").to_pylist() == [Decimal("19.99"), Decimal("0.10"),
                                               Decimal("130.42"), Decimal("19.99"),
                                               Decimal("130.42")]
    engine.close()


@pytest.mark.parametrize("value, sql_type, reason", [
    (0.125, "DECIMAL(10,2)", "has 3 digits after the point"),
    (1.005, "DECIMAL(10,2)", "has 3 digits after the point"),
    (2.5, "INTEGER", "is not a whole number"),
    (1e12, "DECIMAL(10,2)", "too large"),
    (float("nan"), "DECIMAL(10,2)", "NaN"),
    (float("inf"), "DECIMAL(10,2)", "infinity"),
    (-float("inf"), "INTEGER", "infinity"),
])
def test_a_float_that_would_change_is_refused_saying_why(value: float, sql_type: str,
                                                         reason: str) -> None:
    engine = Engine()
    engine.stream("v", {"x": sql_type})
    with pytest.raises(SchemaError, match=rf"column 'x' row 1: .*{re.escape(reason)}"):
        engine.ingest("v", [(1,), (value,)])
    assert engine.query("SELECT count(*) AS n FROM v").column("n")[0].as_py() == 0
    engine.close()


@pytest.mark.parametrize("value, sql_type, stored", [
    (-0.0, "DECIMAL(10,2)", Decimal("0.00")),
    (1e16, "DECIMAL(20,2)", Decimal("10000000000000000.00")),
    (2.0 ** 60, "DECIMAL(38,0)", Decimal("1152921504606847000")),  # as repr shows it
    (2.0 ** 60, "BIGINT", 1152921504606847000),
    (1e-7, "DECIMAL(10,8)", Decimal("1E-7")),
])
def test_a_float_is_the_decimal_it_shows(value: float, sql_type: str, stored: Any) -> None:
    engine = Engine()
    engine.stream("v", {"x": sql_type})
    engine.ingest("v", [(value,)])
    engine.ingest("v", pa.table({"x": [value]}))
    assert engine.query("SELECT x FROM v").column("x").to_pylist() == [stored, stored]
    engine.close()


def test_a_decimal_into_a_double_is_the_nearest_double() -> None:
    """Arrow's DECIMAL -> DOUBLE cast stored Decimal("19.99") as 19.990000000000002."""
    engine = Engine()
    engine.stream("v", {"f": "DOUBLE", "r": "REAL"})
    engine.ingest("v", [(Decimal("19.99"), Decimal("19.99")),
                        (Decimal("130.42"), Decimal("130.42"))])
    assert engine.query("SELECT f, r FROM v").to_pylist() == [
        {"f": 19.99, "r": float(np.float32(19.99))}, {"f": 130.42, "r": float(np.float32(130.42))}]
    engine.close()


def test_a_procedure_output_of_floats_goes_into_its_decimal_as_typed() -> None:
    """Procedure outputs pass through the same conversion as ingested rows."""
    engine = Engine()
    engine.stream("orders", {"n": "INTEGER"})
    engine.stream("priced", {"n": "INTEGER", "price": "DECIMAL(10,2)"})

    @engine.procedure(input="orders", output="priced")
    def price(tx, batch):
        return [(n, {1: 19.99, 2: 130.42, 3: 0.125}[n]) for n in batch.column("n").to_pylist()]

    engine.ingest_and_run("orders", [(1,), (2,)])
    assert engine.query("SELECT price FROM priced ORDER BY n").column("price").to_pylist() == [
        Decimal("19.99"), Decimal("130.42")]
    engine.ingest_and_run("orders", [(3,)])  # 0.125 would be rounded: the TE fails
    assert engine.query("SELECT count(*) AS c FROM priced").column("c")[0].as_py() == 2
    assert any("would be rounded" in e["error"] for e in engine.status().errors)
    engine.close()


def test_a_long_decimal_with_trailing_zeros_keeps_its_value() -> None:
    """pyarrow read a Decimal of 42 digits into DECIMAL(10,2) as 0.00, without an error."""
    engine = Engine()
    engine.stream("v", {"x": "DECIMAL(10,2)"})
    engine.ingest("v", [(Decimal("1.5" + "0" * 40),), (Decimal("0E+9"),)])
    assert engine.query("SELECT x FROM v").column("x").to_pylist() == [Decimal("1.50"),
                                                                       Decimal("0.00")]
    engine.close()


@pytest.mark.parametrize("sql_type", [t for t in sorted(set(TYPES.values()))
                                      if t.startswith("DECIMAL")])
@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(DECIMALS.map(str), DECIMALS.map(lambda d: f"{d:f}")),
                       min_size=1, max_size=6))
@example(values=["17504357367269682000"])
@example(values=["5e-324"])
def test_decimal_text_converts_exactly(sql_type: str, values: list[str]) -> None:
    """Arrow's text -> DECIMAL cast wrapped around ("17504357367269682000" into
    DECIMAL(38,30) was 438.47...) and read "5e-324" into DECIMAL(18,4) as 0.0000."""
    wanted = [expected(Decimal(v), sql_type) for v in values]
    refused = [str(i) for i, w in enumerate(wanted) if w is REFUSED]
    schema = pa.schema([pa.field("v", ARROW_TYPES[sql_type])])
    for rows in ([(v,) for v in values], pa.table({"v": pa.array(values)})):
        if refused:
            with pytest.raises(SchemaError, match=rf"column 'v' row ({'|'.join(refused)}): "):
                to_arrow(rows, schema, "stream 'x'")
        else:
            got = to_arrow(rows, schema, "stream 'x'").column("v").to_pylist()
            assert all(same(g, w) for g, w in zip(got, wanted)), list(zip(values, got, wanted))
