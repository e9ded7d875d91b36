"""The one rule set every reader applies per value, and the line and reject helpers.

Every field is trimmed and an empty field is NULL; numbers, ISO dates and timestamps are what
Arrow's cast accepts (strict: ``2017-02-30`` fails); integers are digits with an optional minus;
``yyyymmdd`` forms must read back unchanged; booleans are the file's two tokens. A refused value
marks its row, and the row's first refused field names the reason.

The public functions are the readers' shared steps (``delimited``, ``finwire``,
``customer_mgmt``); ``split_lines`` is also how the Spark DimTrade job numbers source lines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sstore.workloads.tpcdi.sources.layouts import (
    BOOL,
    DATE,
    F64,
    FORMATS,
    INT,
    REJECT_SCHEMA,
    TEXT,
    TIME,
    TS,
    Col,
)


def _clean(raw: pa.Array) -> pa.Array:
    """Trim every field; an empty field is NULL (by swapping the validity bitmap: if_else on
    strings copies every value and costs more than the whole CSV parse)."""
    text = pc.ascii_trim_whitespace(raw)
    keep = pc.and_kleene(pc.is_valid(text), pc.not_equal(text, ""))
    if text.offset or keep.offset:
        return pc.if_else(keep, text, pa.scalar(None, TEXT))
    return pa.Array.from_buffers(TEXT, len(text), [keep.buffers()[1], *text.buffers()[1:]])


def _cast_rows(text: pa.Array, type_: pa.DataType) -> tuple[pa.Array, pa.Array | None]:
    """``pc.cast`` with per-row outcome: one call for a clean column; otherwise bisect to the
    rows the cast refuses (cost grows with the number of bad rows, not the column length).
    Returns the values (NULL where refused) and the refused mask, None when there is none."""
    try:
        return pc.cast(text, type_), None
    except pa.ArrowInvalid:
        pass
    shape = _shape(type_)        # a superset of what the cast accepts: misfits are bad for sure
    misfit: pa.Array | None = None
    if shape is not None:
        misfit = pc.invert(pc.fill_null(pc.match_substring_regex(text, shape), True))
        text = pc.if_else(misfit, pa.scalar(None, TEXT), text)
        try:
            return pc.cast(text, type_), misfit
        except pa.ArrowInvalid:
            pass
    bad: list[int] = []

    def find(lo: int, hi: int) -> None:
        if hi - lo <= 16:
            bad.extend(i for i in range(lo, hi) if not _casts(text.slice(i, 1), type_))
            return
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            if not _casts(text.slice(a, b - a), type_):
                find(a, b)

    find(0, len(text))
    mask = _mask(len(text), bad)
    values = pc.cast(pc.if_else(mask, pa.scalar(None, TEXT), text), type_)
    return values, mask if misfit is None else pc.or_(mask, misfit)


def _shape(type_: pa.DataType) -> str | None:
    """A loose regex that every value Arrow's cast to ``type_`` accepts matches; the rows it
    does not match are refused without bisecting (keeps a badly damaged file fast)."""
    if pa.types.is_decimal(type_):
        return r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"
    if type_ == DATE:
        return r"^\d{4}-\d{2}-\d{2}$"
    if type_ == TS:
        return r"^\d{4}-\d{2}-\d{2}([ T].*)?$"
    return None


def _casts(text: pa.Array, type_: pa.DataType) -> bool:
    try:
        pc.cast(text, type_)
        return True
    except pa.ArrowInvalid:
        return False


def _mask(n: int, rows: Sequence[int]) -> pa.Array:
    flags = [False] * n
    for i in rows:
        flags[i] = True
    return pa.array(flags, BOOL)


def _convert(text: pa.Array, col: Col, bools: tuple[str, str]
             ) -> tuple[pa.Array, pa.Array | None]:
    """Typed values, and a mask of the rows this field refuses (unparsable, or required and
    missing; None if no row). Refused rows hold NULL. Numbers, ISO dates and times are
    Arrow's cast (strict: ``2017-02-30`` fails), integers digits only (no ``0x10``)."""
    type_, bad = col.type, None
    if type_ == TEXT:
        values = text
    elif type_ == BOOL:
        good = pc.is_in(text, value_set=pa.array(bools))
        values = pc.if_else(good, pc.equal(text, bools[0]), pa.scalar(None, BOOL))
        bad = pc.and_(pc.is_valid(text), pc.invert(good))
    elif col.fmt:   # FINWIRE's yyyymmdd forms: strptime, and the text must read back the same
        parsed = pc.strptime(text, format=col.fmt, unit="s", error_is_null=True)
        good = pc.fill_null(pc.equal(pc.strftime(parsed, format=col.fmt), text), False)
        values = pc.if_else(good, pc.cast(parsed, type_), pa.scalar(None, type_))
        bad = pc.and_(pc.is_valid(text), pc.invert(good))
    elif type_ == TIME:
        values, bad = _cast_rows(pc.binary_join_element_wise("1970-01-01 ", text, ""), TS)
        values = pc.cast(values, TIME)
    else:
        if pa.types.is_integer(type_) and not pc.all(pc.ascii_is_decimal(text)).as_py():
            signed = pc.utf8_slice_codeunits(text, 1, 1 << 20)
            digits = pc.ascii_is_decimal(pc.if_else(pc.starts_with(text, "-"), signed, text))
            letters = pc.and_(pc.is_valid(text), pc.invert(digits))
            if pc.any(letters).as_py():
                text = pc.if_else(letters, pa.scalar(None, TEXT), text)
                bad = letters
        values, refused = _cast_rows(text, type_)
        bad = refused if bad is None else bad if refused is None else pc.or_(bad, refused)
    if col.required and text.null_count:
        missing = pc.is_null(text)
        bad = missing if bad is None else pc.or_(bad, missing)
    return values, bad


def typed_columns(raw: Sequence[pa.Array], cols: Sequence[Col], bools: tuple[str, str],
                  nulls_done: bool = False
                  ) -> tuple[pa.Table, list[pa.Array], list[pa.Array | None]]:
    """Convert text columns: the typed table, the cleaned texts, and one mask per column.

    ``nulls_done``: empty fields are already NULL (pyarrow.csv did it), so only text columns
    need trimming; a number, date or flag with spaces around it fails its cast and sends the
    file to the line-by-line path, which trims first. Same outcome, less work when clean."""
    texts = [a if nulls_done and c.type != TEXT else _clean(a) for a, c in zip(raw, cols)]
    converted = [_convert(t, c, bools) for t, c in zip(texts, cols)]
    table = pa.table([v for v, _ in converted], names=[c.name for c in cols])
    return table, texts, [b for _, b in converted]


def any_refused(masks: Sequence[pa.Array | None], n: int) -> pa.Array:
    """Rows refused by any column."""
    out: pa.Array | None = None
    for mask in masks:
        if mask is not None:
            out = mask if out is None else pc.or_(out, mask)
    return out if out is not None else pa.repeat(pa.scalar(False), n)


def refusal_reasons(rows: list[int], texts: Sequence[pa.Array],
                    masks: Sequence[pa.Array | None], cols: Sequence[Col]) -> list[str]:
    """Why each refused row was refused: its first bad field."""
    idx = pa.array(rows, INT)
    flags = [[False] * len(rows) if m is None else m.take(idx).to_pylist() for m in masks]
    values = [t.take(idx).to_pylist() for t in texts]
    out = []
    for r in range(len(rows)):
        c = next(j for j in range(len(cols)) if flags[j][r])
        name, value = cols[c].name.upper(), values[c][r]
        out.append(f"missing {name}" if value is None else
                   f"unparsable {name}: {value!r} (expected {_expected(cols[c])})")
    return out


def _expected(col: Col) -> str:
    if col.fmt or col.type in FORMATS:
        return col.fmt or FORMATS[col.type]
    if pa.types.is_decimal(col.type):
        return f"decimal({col.type.precision},{col.type.scale})"
    return {BOOL: "boolean", F64: "number"}.get(col.type, "integer")


def batch_of(path: Path) -> int | None:
    """``Batch2/Trade.txt`` and ``Batch2_audit.csv`` belong to batch 2."""
    for name in (path.parent.name, path.name):
        m = re.match(r"Batch(\d+)", name)
        if m:
            return int(m.group(1))
    return None


def split_lines(data: bytes) -> tuple[pa.Array, pa.Array, list[tuple[int, str, str]]]:
    """Physical line numbers and texts of the non-blank lines, ``\\r`` stripped, as Arrow
    arrays; lines that are not UTF-8 come back as (number, text, reason) rejects."""
    bad: list[tuple[int, str, str]] = []
    try:
        raw = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        raw = []
        for i, chunk in enumerate(data.split(b"\n"), 1):
            try:
                raw.append(chunk.decode("utf-8"))
            except UnicodeDecodeError:
                raw.append("")
                bad.append((i, chunk.decode("utf-8", "replace").rstrip("\r"), "not UTF-8"))
    if raw and raw[0].startswith("\ufeff"):
        raw[0] = raw[0][1:]
    texts = pc.utf8_rtrim(pa.array(raw, TEXT), characters="\r")
    keep = pc.greater(pc.binary_length(texts), 0)
    numbers = pa.array(np.arange(1, len(raw) + 1, dtype=np.int64))
    return numbers.filter(keep), texts.filter(keep), bad


def reject_table(source: str, batch: int | None, rows: Sequence[tuple[int, str, str]]
                 ) -> pa.Table:
    """(line number, raw line, reason) triples as ``REJECT_SCHEMA`` rows, in line order."""
    rows = sorted(rows)
    return pa.table([[source] * len(rows), [batch] * len(rows), [r[0] for r in rows],
                     [r[1] for r in rows], [r[2] for r in rows]], schema=REJECT_SCHEMA)
