"""How column types cross from the engine (DuckDB, seen as Arrow) into PostgreSQL.

One declarative table, read top to bottom: the first row whose test matches a column's Arrow
type gives the PostgreSQL type to create and the Arrow type to convert to before binary COPY.
Anything not listed is rejected with an error that names the column: a silent lossy mapping is
worse than a clear refusal.

| DuckDB | Arrow | PostgreSQL |
| --- | --- | --- |
| BOOLEAN | bool | boolean |
| TINYINT, SMALLINT, UTINYINT | int8, int16, uint8 | smallint |
| INTEGER, USMALLINT | int32, uint16 | integer |
| BIGINT, UINTEGER | int64, uint32 | bigint |
| UBIGINT | uint64 | numeric(20,0) |
| DECIMAL(p,s) | decimal128(p,s) | numeric(p,s) |
| FLOAT, DOUBLE | float32, float64 | real, double precision |
| VARCHAR | string, large_string, string_view | text |
| BLOB | binary, large_binary | bytea |
| DATE | date32 | date |
| TIME | time64 | time |
| TIMESTAMP (any precision) | timestamp[*] | timestamp (microseconds) |
| TIMESTAMPTZ | timestamp[*, tz] | timestamptz (microseconds) |

An existing target may have a wider column (``COMPATIBLE``, ``WIDENED``); never one that
changes a value silently: a timestamp or time column of fewer fractional-second digits than
the rows' type is refused up front (``check_compatible``), text longer than a
``character varying(n)`` column and a numeric whose digits do not fit are refused by value
(``for_target``), ``character(n)`` (it pads and trims blanks) is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as at

from migrators.errors import IncompatibleSchemaError, UnsupportedTypeError


@dataclass(frozen=True)
class Mapping:
    test: Callable[[pa.DataType], bool]
    pg_type: Callable[[pa.DataType], str]
    arrow_type: Callable[[pa.DataType], pa.DataType]


def _same(t: pa.DataType) -> pa.DataType:
    return t


def _const(name: str) -> Callable[[pa.DataType], str]:
    return lambda _t: name


TYPE_MAP: tuple[Mapping, ...] = (
    Mapping(at.is_boolean, _const("boolean"), _same),
    Mapping(lambda t: t in (pa.int8(), pa.int16(), pa.uint8()), _const("smallint"),
            lambda _t: pa.int16()),
    Mapping(lambda t: t in (pa.int32(), pa.uint16()), _const("integer"), lambda _t: pa.int32()),
    Mapping(lambda t: t in (pa.int64(), pa.uint32()), _const("bigint"), lambda _t: pa.int64()),
    Mapping(lambda t: t == pa.uint64(), _const("numeric(20,0)"), lambda _t: pa.decimal128(20, 0)),
    Mapping(at.is_decimal, lambda t: f"numeric({t.precision},{t.scale})", _same),
    Mapping(lambda t: t == pa.float32(), _const("real"), _same),
    Mapping(lambda t: t == pa.float64(), _const("double precision"), _same),
    Mapping(lambda t: at.is_string(t) or at.is_large_string(t) or at.is_string_view(t),
            _const("text"), lambda _t: pa.string()),
    Mapping(lambda t: at.is_binary(t) or at.is_large_binary(t), _const("bytea"),
            lambda _t: pa.binary()),
    Mapping(at.is_date32, _const("date"), _same),
    Mapping(at.is_time64, _const("time"), lambda _t: pa.time64("us")),
    Mapping(lambda t: at.is_timestamp(t) and t.tz is None, _const("timestamp"),
            lambda _t: pa.timestamp("us")),
    Mapping(lambda t: at.is_timestamp(t) and t.tz is not None, _const("timestamptz"),
            lambda t: pa.timestamp("us", tz=t.tz)),
)

#: PostgreSQL types a column may already have in an existing target, per created type: the
#: created type itself, or a wider one that takes every value without loss.
COMPATIBLE: dict[str, tuple[str, ...]] = {
    "boolean": ("boolean",),
    "smallint": ("smallint", "integer", "bigint", "numeric"),
    "integer": ("integer", "bigint", "numeric"),
    "bigint": ("bigint", "numeric"),
    "numeric": ("numeric",),
    "real": ("real", "double precision"),
    "double precision": ("double precision",),
    "text": ("text", "character varying"),  # not character(n): it pads and trims blanks
    "bytea": ("bytea",),
    # not timestamptz: which instant a date is depends on a zone (the sink would say UTC
    # midnight, PostgreSQL's own cast the session's midnight: two paths, two days)
    "date": ("date", "timestamp without time zone"),
    "time": ("time without time zone",),
    "timestamp": ("timestamp without time zone",),
    "timestamptz": ("timestamp with time zone",),
}


def mapping_for(field: pa.Field) -> Mapping:
    for mapping in TYPE_MAP:
        if mapping.test(field.type):
            return mapping
    raise UnsupportedTypeError(f"column {field.name!r} has type {field.type}, which has no "
                               f"PostgreSQL mapping (see migrators/typemap.py)")


def postgres_columns(schema: pa.Schema) -> list[tuple[str, str]]:
    """(column, PostgreSQL type) for CREATE TABLE."""
    return [(f.name, mapping_for(f).pg_type(f.type)) for f in schema]


def for_copy(rows: pa.Table) -> pa.Table:
    """Convert columns to the Arrow types the binary COPY encoder writes as the mapped type.
    A conversion that would change a value is refused naming the column
    (``UnsupportedTypeError``): a TIMESTAMP_NS value with a fraction of a microsecond, which
    no PostgreSQL type holds."""
    arrays, fields = [], []
    for f, column in zip(rows.schema, rows.columns):
        target = mapping_for(f).arrow_type(f.type)
        if column.type != target:
            try:
                column = column.cast(target)  # safe: what would change a value raises
            except pa.ArrowInvalid as exc:
                raise UnsupportedTypeError(
                    f"column {f.name!r} ({duckdb_name(f.type)}) holds a value PostgreSQL's "
                    f"{mapping_for(f).pg_type(f.type)} cannot hold exactly ({exc}); round it "
                    f"in the procedure (e.g. CAST(... AS TIMESTAMP))") from None
        arrays.append(column)
        fields.append(pa.field(f.name, target))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


#: DuckDB's 'infinity' and '-infinity' timestamps as Arrow hands them over (microseconds).
#: Binary COPY has no way to send them as PostgreSQL's infinity: the encoder shifts them to
#: the 2000 epoch, which turns 'infinity' into the finite 294247-01-10 and '-infinity' into
#: an underflow; so both are refused, naming the column.
_INFINITE_US = (2**63 - 1, -(2**63 - 1))


def check_sendable(rows: pa.Table) -> None:
    """Raise ``UnsupportedTypeError`` if a timestamp column holds 'infinity' or '-infinity'
    (``_INFINITE_US``). One min/max per timestamp column: cheap beside the COPY."""
    for f, column in zip(rows.schema, rows.columns):
        if not at.is_timestamp(f.type) or column.null_count == len(column):
            continue
        if f.type.unit != "us":
            continue  # DuckDB exports its infinities in microsecond columns only
        ends = pc.min_max(pa.chunked_array([c.view(pa.int64()) for c in column.chunks],
                                           pa.int64())).as_py()
        if ends["max"] in _INFINITE_US or ends["min"] in _INFINITE_US:
            raise UnsupportedTypeError(
                f"column {f.name!r} holds 'infinity' or '-infinity', which binary COPY cannot "
                f"send to PostgreSQL (it would arrive as a finite timestamp or not at all); "
                f"replace it in the procedure (NULL, or a far date such as 9999-12-31)")


#: DuckDB types whose Arrow form is not their value: the sink and the table copy see Arrow only,
#: so they ask the engine for its column types once per target and refuse these by name.
HIDDEN_IN_ARROW: dict[str, str] = {
    "TIME WITH TIME ZONE": "Arrow carries a TIMETZ as a time of day without its offset",
    "BIT": "Arrow carries a BIT as DuckDB's internal bytes",
}


def check_duckdb_types(source: str, columns: list[tuple[str, str]]) -> None:
    """Raise ``UnsupportedTypeError`` for the first of ``columns`` (name, DuckDB type, as
    ``information_schema.columns`` gives them) in ``HIDDEN_IN_ARROW``."""
    for name, duck_type in columns:
        reason = HIDDEN_IN_ARROW.get(duck_type)
        if reason is not None:
            raise UnsupportedTypeError(f"{source} column {name!r} is {duck_type}: {reason}; "
                                       f"cast it in the procedure (e.g. to VARCHAR)")


def check_engine_table(engine: Any, table: str, source: str) -> None:
    """``check_duckdb_types`` for the columns of the engine's table ``table`` (a stream's
    table, or a state table); ``engine`` is an ``sstore.Engine``. One catalog query: callers
    ask once per target, not per chunk."""
    schema, _, name = table.rpartition(".")
    rows = engine.query("SELECT column_name, data_type FROM information_schema.columns WHERE "
                        "table_schema = ? AND table_name = ?", schema or "main", name)
    check_duckdb_types(source, list(zip(rows.column("column_name").to_pylist(),
                                        rows.column("data_type").to_pylist())))


#: Fractional-second digits a value of each Arrow time unit carries as binary COPY sends it
#: (in microseconds: a nanosecond column is cast to microseconds first, by ``for_copy``).
_FRACTION_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 6}

#: PostgreSQL types that round a value with more fractional-second digits than the column's
#: declared precision (``timestamp(0)``, ``time(3)``, ...), without an error.
_ROUNDING = ("timestamp without time zone", "timestamp with time zone",
             "time without time zone")


def check_compatible(table: str, schema: pa.Schema,
                     existing: dict[str, tuple[str, int | None, int | None]],
                     source: str = "the rows") -> None:
    """Raise ``IncompatibleSchemaError`` naming the first column that cannot take the rows
    of ``schema`` (``source`` names them: ``stream 'x'``, ``table 'y'``).

    ``existing``: the target's columns as ``postgres.target_columns`` gives them, name ->
    (``information_schema.columns.data_type``, precision, scale). A column must be the type
    the rows map to or a wider one (``COMPATIBLE``), and a timestamp or time column must keep
    as many fractional-second digits as the rows' type can carry: PostgreSQL rounds the rest
    away (2024-12-31 23:59:59.6 into ``timestamp(0)`` is 2025-01-01 00:00:00), so such a
    column is refused up front, before any row is read, not at the first value that would
    round (a sink would then halt weeks later, at a value nobody chose)."""
    for f in schema:
        pg_type = mapping_for(f).pg_type(f.type)
        if f.name not in existing:
            raise IncompatibleSchemaError(f"target {table} has no column {f.name!r} (it has "
                                          f"{sorted(existing)})")
        data_type, precision, _scale = existing[f.name]
        if data_type not in COMPATIBLE[pg_type.split("(")[0]]:
            raise IncompatibleSchemaError(f"target {table} column {f.name!r} is "
                                          f"{data_type}, which cannot take {pg_type}")
        digits = _fraction_digits(f.type)
        if data_type in _ROUNDING and precision is not None and precision < digits:
            shown = data_type.replace(" ", f"({precision}) ", 1)
            raise IncompatibleSchemaError(
                f"target {table} column {f.name!r} is {shown} and {source} has "
                f"{duckdb_name(f.type)} ({digits} fractional-second digits): a value with "
                f"more than {precision} would be rounded by PostgreSQL, without an error "
                f"(2024-12-31 23:59:59.6 into timestamp(0) lands as 2025-01-01 00:00:00). "
                f"Nothing was written. Widen the column (ALTER TABLE {table} ALTER COLUMN "
                f"{f.name} TYPE {data_type}: {digits} digits), or give the rows a type no "
                f"finer than the column (TIMESTAMP_S for whole seconds, TIMESTAMP_MS for "
                f"milliseconds)")


def _fraction_digits(t: pa.DataType) -> int:
    """Fractional-second digits the values of ``t`` can have as sent (0 for a date)."""
    if at.is_timestamp(t) or at.is_time(t):
        return _FRACTION_DIGITS[t.unit]
    return 0


def duckdb_name(t: pa.DataType) -> str:
    """The DuckDB type an Arrow time type comes from, for messages (else the Arrow type)."""
    if at.is_timestamp(t):
        if t.tz is not None:
            return "TIMESTAMPTZ"
        return {"s": "TIMESTAMP_S", "ms": "TIMESTAMP_MS", "ns": "TIMESTAMP_NS"}.get(
            t.unit, "TIMESTAMP")
    if at.is_time(t):
        return "TIME"
    if at.is_date(t):
        return "DATE"
    return str(t)


#: Arrow types for an existing target column of a wider type than the one the rows map to:
#: binary COPY must send exactly the column's type (an int4 into a bigint column is a protocol
#: error, not a conversion).
WIDENED: dict[str, Callable[[int | None, int | None], pa.DataType]] = {
    "smallint": lambda _p, _s: pa.int16(),
    "integer": lambda _p, _s: pa.int32(),
    "bigint": lambda _p, _s: pa.int64(),
    "numeric": lambda p, s: pa.decimal128(p or 38, s if s is not None else 0),
    "real": lambda _p, _s: pa.float32(),
    "double precision": lambda _p, _s: pa.float64(),
    "timestamp without time zone": lambda _p, _s: pa.timestamp("us"),
    "timestamp with time zone": lambda _p, _s: pa.timestamp("us", tz="UTC"),
}


def for_target(rows: pa.Table, columns: dict[str, tuple[str, int | None, int | None]]
               ) -> pa.Table:
    """Convert columns to the types of an existing target whose columns were widened (the
    check in ``check_compatible`` allows only lossless widenings; a value that would still not
    fit, such as a numeric whose declared scale is smaller, is an ``IncompatibleSchemaError``).
    Text into a ``character varying(n)`` column is checked too (``_check_length``).
    ``columns``: name -> (information_schema data type, precision, scale); empty: no change."""
    if not columns:
        return rows
    arrays, fields = [], []
    for f, column in zip(rows.schema, rows.columns):
        data_type, precision, scale = columns.get(f.name, ("", None, None))
        make = WIDENED.get(data_type)
        target = make(precision, scale) if make is not None else f.type
        if data_type == "numeric" and precision is None and at.is_decimal(f.type):
            target = f.type  # unconstrained numeric takes the rows' own precision and scale
        if target != f.type:
            try:
                if at.is_integer(f.type) and at.is_decimal(target):
                    # Arrow sizes an integer's cast for every value of its type (7 from an
                    # int64 into decimal(5,2) was refused): through a decimal wide enough
                    # for any of them, each value is then checked against the column's
                    column = column.cast(pa.decimal256(76, target.scale), safe=True)
                column = column.cast(target, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise IncompatibleSchemaError(f"column {f.name!r}: values do not fit the "
                                              f"target's {data_type}: {exc}") from None
        if data_type == "character varying" and precision is not None:
            _check_length(f.name, column, precision)
        arrays.append(column)
        fields.append(pa.field(f.name, target))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def checks_values(columns: dict[str, tuple[str, int | None, int | None]]) -> bool:
    """Whether ``for_target`` looks at the values for ``columns`` even where it converts no
    type (a ``character varying(n)`` column): a caller that skips ``for_target`` for rows of
    a schema it found unchanged before must not skip it then."""
    return any(t == "character varying" and n is not None for t, n, _ in columns.values())


def _check_length(name: str, column: pa.ChunkedArray, limit: int) -> None:
    """Refuse text longer than ``limit`` characters for a ``character varying(limit)`` column
    (``IncompatibleSchemaError``): PostgreSQL cuts blanks past the limit without an error
    ('ab   ' into varchar(2) lands as 'ab') and refuses the rest with its own error. One
    length per value, as PostgreSQL counts them (characters, not bytes)."""
    if column.null_count == len(column):
        return
    longest_bytes = pc.max(pc.binary_length(column)).as_py()
    if longest_bytes is not None and longest_bytes <= limit:
        return  # no more characters than bytes: the common case, without decoding a value
    lengths = pc.utf8_length(column)
    longest = pc.max(lengths).as_py()
    if longest is not None and longest > limit:
        over = pc.sum(pc.greater(lengths, limit)).as_py()
        raise IncompatibleSchemaError(
            f"column {name!r} is character varying({limit}) and {over} value(s) are longer "
            f"(the longest has {longest} characters): PostgreSQL would cut trailing blanks "
            f"without an error or refuse the row. Nothing was written. Widen the column "
            f"(ALTER TABLE ... ALTER COLUMN {name} TYPE varchar({longest}), or text), or cut "
            f"the values in the procedure (left({name}, {limit}))")
