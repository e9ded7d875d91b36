"""Digests of what a logged transaction did, so that weak durability's replay can tell when it
did something else (``sstore.execution.recovery``).

Replay reruns procedures and ad hoc transactions and trusts them to do what they did live. A
procedure that calls ``random()``, reads the clock, or an ad hoc transaction whose input was
not logged breaks that trust silently. So each transaction execution (TE) and each ad hoc
transaction of a weak-durability engine keeps a 64-bit digest of what it did, the input log
records it, and replay recomputes and compares it (``ReplayMismatchError`` on a difference):

- per statement, in order: its SQL text, its bound parameters (``repr``) and what it answered
  (the row count of an INSERT, UPDATE or DELETE; the number of rows of a query);
- per TE, also each output batch, hashed **independently of row order** (``rows``): SQL without
  ORDER BY may return the same rows in another order at replay (parallel aggregation), and that
  is the same output.

The digests are cheap on purpose (weak durability exists to be fast): a few microseconds per
statement and vectorised hashing of each output batch's Arrow buffers (no value converted to
Python for the usual column types). A digest is not a proof: what a statement wrote is seen
through its row count and parameters, so ``INSERT ... SELECT random()`` writes as many rows at
replay and passes: ``sstore.base.volatile`` refuses such SQL before it runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

_M64 = (1 << 64) - 1
_K = np.uint64(0x9E3779B97F4A7C15)
_NULL = np.uint64(0x5BD1E9955BD1E995)
#: batches of at most this many rows are hashed through their values' text (faster there)
SMALL = 16


def text(value: str) -> int:
    """A stable 64-bit hash of a string (Python's ``hash`` changes with every process)."""
    return int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "little")


def combine(acc: int, value: int) -> int:
    """Fold ``value`` into ``acc``, order-dependent (statements of one transaction)."""
    return _mix_int((acc * 0x100000001B3 + value) & _M64)


def statement(sql: str, bound: Any, answer: int) -> int:
    """One statement: its text, its parameters and what it answered (``answer``)."""
    return combine(combine(text(sql), text(repr(bound)) if bound is not None else 0),
                   answer & _M64)


def answer_of(rows: list[tuple[Any, ...]], names: list[str]) -> int:
    """What a statement answered: the count of an INSERT, UPDATE or DELETE (DuckDB answers one
    row, one integer column "Count"), else the number of rows. ``names``: its columns."""
    if names == ["Count"] and len(rows) == 1 and isinstance(rows[0][0], int) \
            and not isinstance(rows[0][0], bool):
        return rows[0][0]
    return len(rows)


def answer_of_table(table: pa.Table) -> int:
    """``answer_of`` for an Arrow answer (``Transaction.sql``): the same number, whichever
    method ran the statement (replay runs every ad hoc statement with ``execute``)."""
    if table.column_names == ["Count"] and table.num_rows == 1 \
            and pt.is_integer(table.schema[0].type):
        value = table.column(0)[0].as_py()
        if value is not None:
            return int(value)
    return int(table.num_rows)


def outputs(tables: Mapping[str, pa.Table]) -> int:
    """The output batches of a TE (stream -> rows), each independent of its row order."""
    acc = 0
    for stream in sorted(tables):
        acc = combine(combine(acc, text(stream)), rows(tables[stream]))
    return acc


def te(procedure: str, batch_id: int, work: int) -> int:
    """A TE: which procedure on which batch, and the digest of its statements and outputs."""
    return combine(combine(text(procedure), batch_id), work)


def rows(table: pa.Table) -> int:
    """A 64-bit digest of ``table``'s rows as a multiset: the same rows in any order, in any
    chunking, give the same digest; a changed value, an added or a lost row changes it
    (with the odds of a 64-bit hash)."""
    n = table.num_rows
    if n <= SMALL:  # numpy's per-call overhead is more than hashing a few rows' text
        total = sum(text(repr(row)) for row in zip(*(c.to_pylist() for c in table.columns)))
        return combine(combine(text("\x00".join(table.column_names)), n), total & _M64)
    acc = np.zeros(n, np.uint64)
    with np.errstate(over="ignore"):
        for column in table.columns:
            arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
            acc = acc * _K + _values(arr)
        total = int(_mix(acc).sum(dtype=np.uint64)) if n else 0  # rows mixed, then summed
    return combine(combine(text("\x00".join(table.column_names)), n), total)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise (uint64 arithmetic wraps)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


def _mix_int(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _values(arr: pa.Array) -> np.ndarray:
    """One uint64 per row of ``arr`` that depends on the row's value only (never on the
    layout: offsets, chunking, what a null slot holds)."""
    if pt.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    n = len(arr)
    typ = arr.type
    try:
        bits = 0 if pt.is_nested(typ) else typ.bit_width
    except ValueError:  # not a fixed-width type
        bits = 0
    out: np.ndarray
    if pt.is_boolean(typ):
        out = pc.cast(arr, pa.uint8()).fill_null(0).to_numpy().astype(np.uint64)
    elif pt.is_string(typ) or pt.is_binary(typ) or pt.is_large_string(typ) \
            or pt.is_large_binary(typ):
        out = _variable(arr)
    elif bits in (8, 16, 32, 64) and arr.buffers()[1] is not None:
        width = bits // 8
        raw = np.frombuffer(arr.buffers()[1], dtype=f"<u{width}",
                            count=arr.offset + n)[arr.offset:]
        out = raw.astype(np.uint64)
    elif bits in (128, 256) and arr.buffers()[1] is not None:  # decimals, intervals
        words = bits // 64
        raw = np.frombuffer(arr.buffers()[1], dtype="<u8",
                            count=(arr.offset + n) * words)[arr.offset * words:]
        out = np.zeros(n, np.uint64)
        for w in range(words):
            out = _mix(out * _K + raw[w::words])
    else:  # lists, structs, maps, views...: their values' text, slower and rare
        out = np.array([text(repr(v)) for v in arr.to_pylist()], dtype=np.uint64)
    if arr.null_count:
        out = out.copy()
        out[arr.is_null().to_numpy(zero_copy_only=False)] = _NULL
    return out


def _variable(arr: pa.Array) -> np.ndarray:
    """Strings and binaries: each row's bytes as a polynomial in ``_BASE`` (byte k of a row
    weighs ``_BASE**k``), from one running sum over the whole buffer: the sum between a row's
    offsets, times the inverse of ``_BASE`` to the row's start (odd, so invertible mod 2**64)."""
    n = len(arr)
    large = pt.is_large_string(arr.type) or pt.is_large_binary(arr.type)
    offsets = np.frombuffer(arr.buffers()[1], dtype="<i8" if large else "<i4",
                            count=arr.offset + n + 1)[arr.offset:].astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    lengths = (offsets[1:] - offsets[:-1]).astype(np.uint64)
    starts = offsets[:-1] - first
    data_buf = arr.buffers()[2]
    if data_buf is None or last == first:
        return _mix(lengths * _K)
    data = np.frombuffer(data_buf, dtype=np.uint8, count=last)[first:]
    powers, inverses = _powers(last - first + 1)  # a last empty row starts at the end
    sums = np.zeros(last - first + 1, np.uint64)
    np.cumsum((data.astype(np.uint64) + np.uint64(1)) * powers[:last - first], out=sums[1:])
    per_row = (sums[offsets[1:] - first] - sums[starts]) * inverses[starts]
    return _mix(per_row + lengths * _K)


_BASE = 0x100000001B3  # odd
_POWERS = np.ones(1, np.uint64)
_INVERSES = np.ones(1, np.uint64)


def _powers(count: int) -> tuple[np.ndarray, np.ndarray]:
    """``_BASE**k`` and its inverse mod 2**64 for k < ``count`` (kept, grown as needed)."""
    global _POWERS, _INVERSES
    if len(_POWERS) < count:
        size = max(count, 2 * len(_POWERS))
        one = np.ones(1, np.uint64)
        _POWERS = np.concatenate([one, np.cumprod(np.full(size - 1, _BASE, np.uint64))])
        _INVERSES = np.concatenate([one, np.cumprod(np.full(size - 1, pow(_BASE, -1, 1 << 64),
                                                            np.uint64))])
    return _POWERS, _INVERSES
