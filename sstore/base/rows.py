"""Turn whatever a caller hands us (Arrow, pandas, tuples, dicts) into an Arrow table of one schema.

Every border ingest and every procedure output passes through ``to_arrow``; it is the one place
where bad input is caught, before any transaction starts, with a message that names the column
and the first row that does not fit.

The rule: a value is stored exactly as sent, in the column's type, or refused. Nothing is
truncated (2.5 into an INTEGER), rounded (1.005 into a DECIMAL(10,2)), overflowed, shifted
(12:00+02:00 into a TIMESTAMP without zone), cut (a time of day into a DATE) or guessed (1 as a
boolean, a number as an epoch). docs/engine.md lists what is accepted and what is refused.

How, without slowing down clean input:

1. A column whose Python values are all of a type Arrow converts exactly into the column's type
   (``int`` into an integer column, ``str`` into VARCHAR, ...) is converted in one call.
2. Anything else is converted by Python type: each group to the Arrow type it comes with, then
   cast into the column's type by ``_lossless_cast``, the same function that checks Arrow
   tables and DataFrames. It refuses pairs of types that cannot keep a value, lets Arrow's safe
   cast refuse what it can, and checks the rest value by value. Numbers between floats,
   decimals and integers are ``sstore.base.number_casts``'s: a float is the decimal it shows
   (``19.99`` into a ``DECIMAL(10,2)`` is 19.99, ``0.125`` is refused).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

from sstore.base.errors import SchemaError
from sstore.base.number_casts import Refused, cast_number

RowsLike = Any  # pa.Table | pa.RecordBatch | pandas.DataFrame | Sequence[tuple | dict] | None

_NONE = type(None)
_CONVERT_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError,
                   ValueError, OverflowError, decimal.InvalidOperation)


def to_arrow(rows: RowsLike, schema: pa.Schema, what: str) -> pa.Table:
    """Convert ``rows`` to a table with exactly ``schema``'s columns, order and types.

    ``what`` names the destination in error messages ("stream 'votes'").
    Raises ``SchemaError`` for unknown or missing columns (dict rows must name every column;
    None is a NULL), rows of the wrong width and values that the column's type cannot hold
    exactly.
    """
    if rows is None:
        return schema.empty_table()
    if isinstance(rows, pa.RecordBatch):
        rows = pa.Table.from_batches([rows])
    if isinstance(rows, pa.Table):
        return _conform_table(rows, schema, what)
    if hasattr(rows, "to_arrow_table") and callable(rows.to_arrow_table):  # a DuckDB relation
        return _conform_table(rows.to_arrow_table(), schema, what)
    if _is_dataframe(rows):
        return _conform_table(pa.Table.from_pandas(rows, preserve_index=False), schema, what)
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise SchemaError(f"{what}: rows must be an Arrow table, a DataFrame or a list of tuples "
                          f"or dicts, not {type(rows).__name__}")
    if not rows:
        return schema.empty_table()
    if isinstance(rows[0], Mapping):
        return _from_dicts(rows, schema, what)
    return _from_tuples(rows, schema, what)


def _is_dataframe(obj: object) -> bool:
    return type(obj).__name__ == "DataFrame" and hasattr(obj, "columns") and hasattr(obj, "iloc")


def _from_dicts(rows: Sequence[Mapping[str, Any]], schema: pa.Schema, what: str) -> pa.Table:
    names = schema.names
    wanted = set(names)
    for kind in set(map(type, rows)):
        if not issubclass(kind, Mapping):
            i = next(i for i, row in enumerate(rows) if type(row) is kind)
            raise SchemaError(f"{what}: row {i} is {kind.__name__}, expected a dict like row 0")
    for i, row in enumerate(rows):
        if row.keys() != wanted:
            unknown = sorted(set(row) - wanted)
            if unknown:
                raise SchemaError(f"{what}: row {i} has unknown column(s) {unknown}; "
                                  f"columns are {names}")
            missing = [name for name in names if name not in row]
            raise SchemaError(f"{what}: row {i} is missing column(s) {missing} (give None for "
                              f"a NULL); columns are {names}")
    return _build({name: list(map(itemgetter(name), rows)) for name in names}, schema, what)


def _from_tuples(rows: Sequence[Sequence[Any]], schema: pa.Schema, what: str) -> pa.Table:
    width = len(schema)
    for kind in set(map(type, rows)):
        if issubclass(kind, (str, bytes)) or not issubclass(kind, Sequence):
            i = next(i for i, row in enumerate(rows) if type(row) is kind)
            raise SchemaError(f"{what}: row {i} is {kind.__name__}, expected a tuple")
    if set(map(len, rows)) != {width}:
        i, row = next((i, row) for i, row in enumerate(rows) if len(row) != width)
        raise SchemaError(f"{what}: row {i} has {len(row)} fields, expected {width} "
                          f"({', '.join(schema.names)})")
    return _build(dict(zip(schema.names, zip(*rows))), schema, what)


def _build(columns: dict[str, Sequence[Any]], schema: pa.Schema, what: str) -> pa.Table:
    arrays = [_column(columns[field.name], field, what) for field in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


# -- Python values -------------------------------------------------------------------------------

def _exact_kinds(target: pa.DataType) -> frozenset[type]:
    """Python types that ``pa.array(values, type=target)`` converts exactly or refuses (never
    truncates or rounds); for the other types only None: their values go through
    ``_lossless_cast``."""
    if pt.is_integer(target):
        return frozenset((int, _NONE))  # type(True) is bool, not int: booleans are not here
    if pt.is_float64(target):
        return frozenset((float, int, _NONE))  # an int beyond 2**53 is refused, not rounded
    if pt.is_decimal(target):  # not Decimal: into a narrower type, pyarrow read
        return frozenset((int, _NONE))  # Decimal("1.50000...0") (42 digits) as 0.00
    if pt.is_boolean(target):
        return frozenset((bool, _NONE))
    if pt.is_string(target) or pt.is_large_string(target):
        return frozenset((str, _NONE))
    if pt.is_binary(target) or pt.is_large_binary(target):
        return frozenset((bytes, _NONE))
    if pt.is_date(target):
        return frozenset((dt.date, _NONE))  # exactly date: a datetime is a subclass, not here
    if pt.is_timestamp(target):
        return frozenset((dt.datetime, _NONE))  # zones are checked by _check_python_temporal
    if pt.is_time(target):
        return frozenset((dt.time, _NONE))
    return frozenset((_NONE,))


def _column(values: Sequence[Any], field: pa.Field, what: str) -> pa.Array:
    array = _flat_column(values, field, what)
    if pt.is_nested(field.type):
        _check_nested(values, array, field, what)
    return array


def _check_nested(values: Sequence[Any], array: pa.Array, field: pa.Field, what: str) -> None:
    """Python values of a LIST, STRUCT or MAP column read back as they were sent. Arrow
    converts inside nested values with none of the checks above: a misspelled struct field
    was dropped (the declared one stored NULL), 1.005 in a DECIMAL(10,2)[] became 1.00, an
    aware datetime in a TIMESTAMP[] was shifted to UTC, an integer in it read as epoch
    seconds. Only Python rows of nested columns pay for this read-back."""
    for i, (sent, stored) in enumerate(zip(values, array.to_pylist())):
        if not _same(sent, stored):
            raise _bad(what, field, i, sent, f"reads back as {stored!r}: a nested value must "
                       f"match the column's field names and hold values its types keep "
                       f"exactly")


def _same(sent: Any, stored: Any) -> bool:
    """Whether ``stored`` (read back from Arrow) is the value ``sent``, by the rule above."""
    if sent is None or stored is None:
        return sent is None and stored is None
    if isinstance(stored, dict):
        if isinstance(sent, Mapping):
            return set(sent) == set(stored) and all(_same(sent[k], stored[k]) for k in sent)
        if isinstance(sent, (tuple, list)):  # a struct given by position
            return len(sent) == len(stored) and all(
                _same(a, b) for a, b in zip(sent, stored.values()))
        return False
    if isinstance(stored, (list, tuple)):  # a LIST (a MAP's entries cannot come from Python)
        return isinstance(sent, (list, tuple)) and len(sent) == len(stored) and all(
            _same(a, b) for a, b in zip(sent, stored))
    if isinstance(sent, (bool, np.bool_)) != isinstance(stored, bool):
        return False
    if isinstance(stored, float) and isinstance(sent, float) and stored != stored:
        return sent != sent  # NaN
    if isinstance(stored, decimal.Decimal) and isinstance(sent, float):
        return stored == decimal.Decimal(repr(float(sent)))  # as written (sstore.base.number_casts)
    if isinstance(stored, dt.datetime) and type(sent) is dt.date:
        return stored.tzinfo is None and stored == dt.datetime.combine(sent, dt.time())
    if isinstance(stored, dt.datetime) != isinstance(sent, dt.datetime):
        return False
    return bool(sent == stored)


def _flat_column(values: Sequence[Any], field: pa.Field, what: str) -> pa.Array:
    target = field.type
    kinds = set(map(type, values))
    if pt.is_timestamp(target) or pt.is_date(target) or pt.is_time(target):
        _check_python_temporal(values, kinds, field, what)
    exact = _exact_kinds(target)
    if kinds <= exact:  # step 1: the fast path of clean input
        try:
            return pa.array(values, type=target)
        except _CONVERT_ERRORS:
            pass  # a value out of range: _by_kind finds it and names its row
    return _by_kind(values, kinds, exact, field, what)


def _by_kind(values: Sequence[Any], kinds: set[type], exact: frozenset[type], field: pa.Field,
             what: str) -> pa.Array:
    """Step 2: convert each Python type on its own, then put the rows back in order."""
    if len(kinds - {_NONE}) <= 1:
        return _lossless_cast(_arrow_of(values, None, exact, field, what), field, what, None)
    order: list[int] = []
    pieces = []
    for kind in kinds:
        rows = [i for i, v in enumerate(values) if type(v) is kind]
        group = _arrow_of([values[i] for i in rows], rows, exact, field, what)
        pieces.append(_lossless_cast(group, field, what, rows))
        order.extend(rows)
    positions = np.empty(len(order), dtype=np.int64)
    positions[np.asarray(order)] = np.arange(len(order))
    return pa.concat_arrays(pieces).take(pa.array(positions))


def _arrow_of(values: Sequence[Any], rows: Sequence[int] | None, exact: frozenset[type],
              field: pa.Field, what: str) -> pa.Array:
    """Values of one Python type as Arrow: in the column's type when that is exact, else in
    the type they come with (which ``_lossless_cast`` then checks)."""
    def convert(vals: Sequence[Any]) -> pa.Array:
        kind = next((type(v) for v in vals if v is not None), _NONE)
        return pa.array(vals, type=field.type) if kind in exact else pa.array(vals)

    try:
        return convert(values)
    except _CONVERT_ERRORS:
        for j, value in enumerate(values):  # name the first value that fails on its own
            try:
                convert([value])
            except _CONVERT_ERRORS as exc:
                raise _bad(what, field, _row(rows, j), value, str(exc)) from None
        raise


def _check_python_temporal(values: Sequence[Any], kinds: set[type], field: pa.Field,
                           what: str) -> None:
    """Zones, nanoseconds and times of day that Arrow would convert silently (it reads an aware
    datetime into a naive column as UTC, drops pandas' nanoseconds, cuts a datetime to its
    date)."""
    target = field.type
    dates_into_zone = pt.is_timestamp(target) and target.tz is not None and dt.date in kinds
    if not dates_into_zone and not any(issubclass(k, (dt.datetime, dt.time)) for k in kinds):
        return
    keeps_ns = pt.is_timestamp(target) and target.unit == "ns"
    for i, value in enumerate(values):
        if isinstance(value, dt.datetime):
            aware = value.utcoffset() is not None
            if aware and (pt.is_date(target) or target.tz is None):
                reason = "has a time zone; the column has none (convert it yourself)"
            elif not aware and pt.is_timestamp(target) and target.tz is not None:
                reason = "has no time zone; the column is WITH TIME ZONE (say which zone)"
            elif getattr(value, "nanosecond", 0) and not keeps_ns:
                reason = "has nanoseconds; the column keeps microseconds"
            elif pt.is_date(target) and value.time() != dt.time(0):
                reason = "has a time of day; the column keeps the date only"
            else:
                continue
        elif isinstance(value, dt.date) and dates_into_zone:
            reason = "has no time zone; the column is WITH TIME ZONE (say which zone)"
        elif isinstance(value, dt.time) and value.tzinfo is not None:
            reason = "has a time zone; a time-of-day column has none (convert it yourself)"
        else:
            continue
        raise _bad(what, field, i, value, reason)


# -- Arrow arrays --------------------------------------------------------------------------------

def _conform_table(table: pa.Table, schema: pa.Schema, what: str) -> pa.Table:
    if table.schema.equals(schema):
        return table
    names = set(schema.names)
    unknown = [n for n in table.column_names if n not in names]
    if unknown:
        raise SchemaError(f"{what}: unknown column(s) {unknown}; columns are {schema.names}")
    missing = [n for n in schema.names if n not in table.column_names]
    if missing:
        raise SchemaError(f"{what}: missing column(s) {missing}; columns are {schema.names}")
    arrays: list[pa.Array | pa.ChunkedArray] = []
    for field in schema:
        column = table.column(field.name)
        if column.type != field.type:  # only a column to convert is joined into one array
            column = _lossless_cast(_one_array(column), field, what, None)
        arrays.append(column)
    return pa.Table.from_arrays(arrays, schema=schema)


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array; its only chunk as it is (``combine_chunks`` copies even that:
    a millisecond per wide batch)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def conform_columns(rows: pa.Table, schema: pa.Schema, what: str) -> pa.Table:
    """``rows`` with each column that ``schema`` also has in ``schema``'s type, every value
    unchanged or a ``SchemaError`` (the rule above): for rows loaded into an existing table,
    where an INSERT would let DuckDB's implicit casts round 2.7 into 3 or 1.2345 into 1.23.
    Columns ``schema`` lacks, and pairs of types that are not plain numbers, text, booleans or
    dates and times, are left to the INSERT (which refuses what it cannot convert)."""
    arrays = []
    for name, column in zip(rows.column_names, rows.columns):
        index = schema.get_field_index(name)
        if index >= 0 and column.type != schema.field(index).type and \
                _is_plain(column.type) and _is_plain(schema.field(index).type):
            column = _lossless_cast(_one_array(column), schema.field(index), what, None)
        arrays.append(column)
    return pa.Table.from_arrays(arrays, names=rows.column_names)


def _is_plain(t: pa.DataType) -> bool:
    return _is_text(t) or _is_number(t) or _is_temporal(t) or pt.is_boolean(t)


def _is_text(t: pa.DataType) -> bool:
    return bool(pt.is_string(t) or pt.is_large_string(t))


def _is_number(t: pa.DataType) -> bool:
    return bool(pt.is_integer(t) or pt.is_floating(t) or pt.is_decimal(t))


def _is_temporal(t: pa.DataType) -> bool:
    return bool(pt.is_timestamp(t) or pt.is_date(t) or pt.is_time(t))


def _refusal(source: pa.DataType, target: pa.DataType) -> str | None:
    """Why no (non-null) value of type ``source`` can go into ``target`` unchanged; None when
    it depends on the values."""
    if pt.is_boolean(source):
        return "a boolean is not a number" if _is_number(target) else None
    if pt.is_boolean(target) and not _is_text(source):
        return "only true and false (or the strings 'true' and 'false') go into a boolean"
    if _is_number(source) and _is_temporal(target):
        return "a number is not a date or time (no epoch is assumed)"
    if _is_temporal(source) and _is_number(target):
        return "a date or time is not a number"
    if pt.is_timestamp(source) and (pt.is_date(target) or pt.is_timestamp(target)):
        if source.tz is not None and (pt.is_date(target) or target.tz is None):
            return "has a time zone; the column has none (convert it yourself)"
        if source.tz is None and pt.is_timestamp(target) and target.tz is not None:
            return "has no time zone; the column is WITH TIME ZONE (say which zone)"
    if pt.is_date(source) and pt.is_timestamp(target) and target.tz is not None:
        return "has no time zone; the column is WITH TIME ZONE (say which zone)"
    if (pt.is_timestamp(source) or pt.is_date(source)) and pt.is_time(target):
        return "is a date; a time-of-day column would drop it"
    return None


def _lossless_cast(array: pa.Array, field: pa.Field, what: str,
                   rows: Sequence[int] | None) -> pa.Array:
    """``array`` in ``field``'s type, every value unchanged, or a ``SchemaError`` naming the
    first row that would change (``rows`` maps positions in ``array`` to row numbers)."""
    source, target = array.type, field.type
    if source == target:
        return array
    if array.null_count == len(array):
        return pa.nulls(len(array), target)
    reason = _refusal(source, target)
    if reason is not None:
        first = pc.index(pc.is_valid(array), True).as_py()
        raise _bad(what, field, _row(rows, first), array[first].as_py(), reason)
    if _is_text(source) and pt.is_integer(target):
        _require(array, pc.match_substring_regex(array, r"^-?[0-9]+$"), field, what, rows,
                 "only decimal digits, with an optional leading minus, are read as an integer")
    if _is_text(source) and pt.is_boolean(target):
        _require(array, pc.match_substring_regex(array, "^(true|false)$", ignore_case=True),
                 field, what, rows, "only true and false (in any case) are read as a boolean")
    try:  # floats and decimals: by the value the user wrote (sstore.base.number_casts)
        result = cast_number(array, target)
    except Refused as refused:
        raise _bad(what, field, _row(rows, refused.position), array[refused.position].as_py(),
                   refused.reason) from None
    if result is None:
        result = _safe_cast(array, field, what, rows)
    if pt.is_timestamp(source) and pt.is_date(target):
        back = pc.cast(result, source)
        _require(array, pc.equal(back, array), field, what, rows,
                 "has a time of day; the column keeps the date only")
    if pt.is_floating(target) and (pt.is_floating(source) or pt.is_decimal(source) or
                                   _is_text(source)):
        _require(array, pc.or_(pc.invert(pc.is_inf(result)), _infinite(array)), field, what,
                 rows, f"is too large for {target}")
    return result


def _safe_cast(array: pa.Array, field: pa.Field, what: str,
               rows: Sequence[int] | None) -> pa.Array:
    """Arrow's safe cast, which refuses truncation and overflow; its error names the row."""
    try:
        return pc.cast(array, field.type, safe=True)
    except _CONVERT_ERRORS as whole:
        first, exc = _first_failing_cast(array, field.type)
        if first is None:  # casts fail element by element; should one ever fail only whole
            raise SchemaError(f"{what}: column {field.name!r}: cannot convert {array.type} "
                              f"to {field.type}: {whole}") from None
        raise _bad(what, field, _row(rows, first), array[first].as_py(), str(exc)) from None


def _infinite(array: pa.Array) -> pa.Array:
    """Which values are an infinity already (only the others must not become one)."""
    if pt.is_floating(array.type):
        return pc.is_inf(array)
    if _is_text(array.type):
        return pc.match_substring_regex(array, r"^[+-]?inf(inity)?$", ignore_case=True)
    return pa.array(np.zeros(len(array), dtype=bool))  # a decimal: never


def _require(array: pa.Array, ok: pa.Array, field: pa.Field, what: str,
             rows: Sequence[int] | None, reason: str) -> None:
    """Refuse the first non-null value of ``array`` whose ``ok`` is false."""
    ok = pc.fill_null(ok, True)
    if pc.all(ok).as_py():
        return
    first = pc.index(ok, False).as_py()
    raise _bad(what, field, _row(rows, first), array[first].as_py(), reason)


def _first_failing_cast(array: pa.Array, target: pa.DataType
                        ) -> tuple[int | None, Exception | None]:
    """The first element whose cast fails and its error, by bisection."""
    lo, hi = 0, len(array)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            pc.cast(array.slice(lo, mid - lo), target, safe=True)
            lo = mid
        except _CONVERT_ERRORS:
            hi = mid
    try:
        pc.cast(array.slice(lo, 1), target, safe=True)
    except _CONVERT_ERRORS as exc:
        return lo, exc
    return None, None


def _row(rows: Sequence[int] | None, position: int) -> int:
    return rows[position] if rows is not None else position


def _bad(what: str, field: pa.Field, row: int, value: Any, reason: str) -> SchemaError:
    return SchemaError(f"{what}: column {field.name!r} row {row}: {value!r} is not a valid "
                       f"{field.type}: {reason}")
