"""Turn whatever a caller hands us (Arrow, pandas, tuples, dicts) into an Arrow table of one schema.

Every border ingest and every procedure output passes through ``to_arrow``; it is the one place
where bad input is caught, before any transaction starts, with a message that names the column
and the first row that does not fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sstore.errors import SchemaError

RowsLike = Any  # pa.Table | pa.RecordBatch | pandas.DataFrame | Sequence[tuple | dict] | None


def to_arrow(rows: RowsLike, schema: pa.Schema, what: str) -> pa.Table:
    """Convert ``rows`` to a table with exactly ``schema``'s columns, order and types.

    ``what`` names the destination in error messages ("stream 'votes'").
    Raises ``SchemaError`` for unknown or missing columns, rows of the wrong width and values that
    cannot be converted to the column's type.
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
        raise SchemaError(f"{what}: rows must be an Arrow table, a DataFrame or a list of tuples or "
                          f"dicts, not {type(rows).__name__}")
    if not rows:
        return schema.empty_table()
    if isinstance(rows[0], Mapping):
        return _from_dicts(rows, schema, what)
    return _from_tuples(rows, schema, what)


def _is_dataframe(obj: object) -> bool:
    return type(obj).__name__ == "DataFrame" and hasattr(obj, "columns") and hasattr(obj, "iloc")


def _from_dicts(rows: Sequence[Mapping[str, Any]], schema: pa.Schema, what: str) -> pa.Table:
    names = set(schema.names)
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise SchemaError(f"{what}: row {i} is {type(row).__name__}, expected a dict like row 0")
        unknown = set(row) - names
        if unknown:
            raise SchemaError(f"{what}: row {i} has unknown column(s) {sorted(unknown)}; "
                              f"columns are {schema.names}")
        for name in schema.names:
            columns[name].append(row.get(name))
    return _build(columns, schema, what)


def _from_tuples(rows: Sequence[Sequence[Any]], schema: pa.Schema, what: str) -> pa.Table:
    width = len(schema)
    columns: list[list[Any]] = [[] for _ in range(width)]
    for i, row in enumerate(rows):
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence):
            raise SchemaError(f"{what}: row {i} is {type(row).__name__}, expected a tuple")
        if len(row) != width:
            raise SchemaError(f"{what}: row {i} has {len(row)} fields, expected {width} "
                              f"({', '.join(schema.names)})")
        for j, value in enumerate(row):
            columns[j].append(value)
    return _build(dict(zip(schema.names, columns)), schema, what)


_CONVERT_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError,
                   ValueError, OverflowError)


def _build(columns: dict[str, list[Any]], schema: pa.Schema, what: str) -> pa.Table:
    arrays = []
    for field in schema:
        values = columns[field.name]
        try:
            arrays.append(pa.array(values, type=field.type))
        except _CONVERT_ERRORS:
            # the slow path, only for input that does not convert in one go: values that need
            # parsing ("12" for an INTEGER) or that are wrong, which we must name precisely
            arrays.append(pa.concat_arrays([_convert_one(v, i, field, what)
                                            for i, v in enumerate(values)]))
    return pa.Table.from_arrays(arrays, schema=schema)


def _convert_one(value: Any, row: int, field: pa.Field, what: str) -> pa.Array:
    try:
        return pa.array([value], type=field.type)
    except _CONVERT_ERRORS:
        pass
    try:
        return pc.cast(pa.array([value]), field.type, safe=True)
    except _CONVERT_ERRORS:
        raise SchemaError(f"{what}: column {field.name!r} row {row}: {value!r} is not a valid "
                          f"{field.type}") from None


def _cast_column(array: pa.Array, field: pa.Field, what: str) -> pa.Array:
    if array.type == field.type:
        return array
    try:
        return pc.cast(array, field.type, safe=True)
    except _CONVERT_ERRORS as exc:
        for i in range(len(array)):
            try:
                pc.cast(array.slice(i, 1), field.type, safe=True)
            except _CONVERT_ERRORS:
                raise SchemaError(f"{what}: column {field.name!r} row {i}: "
                                  f"{array[i].as_py()!r} is not a valid {field.type}") from None
        raise SchemaError(f"{what}: column {field.name!r}: cannot convert {array.type} to "
                          f"{field.type}: {exc}") from None


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
    arrays = [_cast_column(table.column(field.name).combine_chunks(), field, what)
              for field in schema]
    return pa.Table.from_arrays(arrays, schema=schema)
