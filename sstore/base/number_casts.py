"""Numbers between binary floats and decimals, by the value the user wrote.

A float holds a binary fraction: ``19.99`` is stored as 19.98999999999999843680598132777959...
The user wrote 19.99, ``repr`` and ``print`` show 19.99, and it is the one decimal that a
column of ``DECIMAL(10,2)`` may hold for it. So a float's value, for a decimal or an integer
column, is **its shortest decimal form**: the shortest decimal that reads back as the same float
(``decimal.Decimal(repr(x))``; for a REAL, the shortest that reads back as the same REAL). It
goes in as that decimal when it has at most ``s`` digits after the point and fits ``p`` digits
(into an integer column: when it is whole and in range); anything else would be rounded,
truncated or overflowed, and is refused (``Refused``). NaN and the infinities are no decimal
and no integer. ``-0.0`` is 0.

The other way, a decimal into ``DOUBLE`` or ``REAL`` is the float nearest to it, as
``float(Decimal(...))`` gives: Arrow's own DECIMAL -> DOUBLE cast is off by an ulp (19.99
became 19.990000000000002, and checking a float against it refused 19.99 and 130.42 while 0.1
went in).

How, fast (this runs on every batch of floats into a decimal column):

1. **Whole arrays, in NumPy** (a float64 column): at a scale ``t`` (the column's ``s``, or
   fewer for a large value, so that at most 15 digits are kept; at most 22), ``u = rint(x *
   10**t)``, accepted when ``|u| < 10**15``, ``u / 10**t == x`` and ``|x| < 10**(p-s)``. Both
   sides of the division are exact doubles and IEEE division rounds correctly, so the decimal
   ``u * 10**-t`` reads back as ``x``; with at most 15 significant digits no other decimal of
   at most 15 digits reads back as ``x`` (DBL_DIG), and the shortest one has at most as many
   digits as this one, so this one *is* ``repr(x)``'s value (and it has at most ``t <= s``
   digits after the point). Into an integer column, Arrow's safe cast is exact below 2**53.
2. **The other rows, one by one in Python**: values of 16 or 17 significant digits (which
   only ``repr`` can tell apart), whole floats from 2**53 up into an integer column, a REAL
   column, and the values to refuse, whose row and reason it names.
"""

from __future__ import annotations

import decimal
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)
#: below this magnitude a float of the type is a whole number exactly as its shortest form
#: shows it (above it, repr(2.0 ** 60) is 1.152921504606847e+18, not 1152921504606846976)
_EXACT_WHOLE = {16: 2.0 ** 11, 32: 2.0 ** 24, 64: 2.0 ** 53}
_MAX_DIGITS_FAST = 15  # DBL_DIG: decimals of up to 15 digits are distinct doubles
_MAX_SCALE_FAST = 22  # 10**22 is the largest power of ten that is an exact double


class Refused(Exception):
    """The value at ``position`` of the array cannot go in unchanged, for ``reason``."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(reason)
        self.position = position
        self.reason = reason


def cast_number(array: pa.Array, target: pa.DataType) -> pa.Array | None:
    """``array`` in ``target`` by the rule above, or ``Refused``; None when the pair of types
    is not one this module decides (the caller's cast applies)."""
    source = array.type
    if pt.is_floating(source) and pt.is_decimal(target):
        return _float_to_decimal(array, target)
    if pt.is_floating(source) and pt.is_integer(target):
        return _float_to_integer(array, target)
    if pt.is_integer(source) and pt.is_decimal(target):
        # Arrow casts an int64 only into a DECIMAL of at least 19 + s digits ("precision is
        # not great enough" for every value into DECIMAL(10,2)): by way of a wide one, whose
        # cast into the target refuses what does not fit
        try:
            return pc.cast(pc.cast(array, pa.decimal256(76, target.scale)), target, safe=True)
        except _ARROW_ERRORS:
            return _one_by_one(array, target, Decimal)  # find the value and say why
    if (pt.is_string(source) or pt.is_large_string(source)) and pt.is_decimal(target):
        return _text_to_decimal(array, target)
    if pt.is_decimal(source) and pt.is_decimal(target) and source != target:
        return _decimal_to_decimal(array, target)
    if pt.is_decimal(source) and pt.is_floating(target):
        # the nearest float: Arrow reads decimal text correctly rounded (its own decimal cast
        # is not); exact text, so nothing to refuse here (the caller checks overflow to inf)
        return pc.cast(pc.cast(array, pa.string()), target)
    return None


# -- text into decimals --------------------------------------------------------------------------

_PLAIN = r"^[+-]?[0-9]{0,38}(\.[0-9]*)?$"  # no exponent, at most 38 digits before the point
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _text_to_decimal(array: pa.Array, target: pa.DataType) -> pa.Array:
    """Arrow's text -> DECIMAL cast wraps around when the scale overflows 128 bits
    ("17504357367269682000" into DECIMAL(38,30) came out as 438.47...) and read "5e-324"
    into DECIMAL(18,4) as 0.0000, without an error. Plain decimals (no exponent, at most 38
    digits before the point) go through a DECIMAL(76,s) first, where nothing can overflow,
    and the checked cast into the target; the others are read one by one."""
    plain = pc.all(pc.fill_null(pc.match_substring_regex(array, _PLAIN), True)).as_py()
    if plain:
        try:
            return pc.cast(pc.cast(array, pa.decimal256(76, target.scale)), target)
        except _ARROW_ERRORS:
            pass  # find the value and say why
    return _one_by_one(array, target, _read_decimal)


def _read_decimal(text: str) -> Decimal | None:
    """A decimal number written as text (digits, a point, an exponent), else None."""
    return Decimal(text) if _NUMBER.fullmatch(text) else None


# -- decimals into decimals ----------------------------------------------------------------------

def _decimal_to_decimal(array: pa.Array, target: pa.DataType) -> pa.Array:
    """Arrow's safe cast refuses digits lost to a smaller scale and a value over the
    precision, but a larger scale that overflows its 128 bits wraps around without an
    error (7.34E+31 into DECIMAL(38,30) came out as 52600944.26...): values with more digits
    before the point than the target keeps are refused first, so that nothing can overflow."""
    source = array.type
    keeps = target.precision - target.scale
    if source.precision - source.scale > keeps:
        bound = pa.scalar(Decimal(f"1E{keeps}"), source)
        too_large = pc.fill_null(pc.greater_equal(pc.abs(array), bound), False)
        if pc.any(too_large).as_py():
            position = pc.index(too_large, True).as_py()
            raise Refused(position, _why_not(array[position].as_py(), target) or "too large")
    try:
        return pc.cast(array, target, safe=True)
    except _ARROW_ERRORS:
        return _one_by_one(array, target, Decimal)  # find the value and say why


# -- floats into decimals and integers -----------------------------------------------------------

def _float_to_decimal(array: pa.Array, target: pa.DataType) -> pa.Array:
    if not (pt.is_float64(array.type) and pt.is_decimal128(target)):
        return _one_by_one(array, target)
    x = array.to_numpy(zero_copy_only=False)  # a NULL reads as NaN: masked below
    valid = array.is_valid().to_numpy(zero_copy_only=False) if array.null_count else None
    wide: list[tuple[np.ndarray, pa.Array]] = []  # rows whose unscaled value needs 128 bits
    first = min(target.scale, _MAX_SCALE_FAST)
    scaled, done = _scaled(x, first, valid, target)
    if first == target.scale:  # the common case: no copy (rows not done are 0)
        units = scaled  # unscaled, at the column's scale
    else:
        units = np.zeros(len(x), dtype=np.int64)
        _keep(units, wide, np.flatnonzero(done), scaled[done], first, target)
    todo = ~done if valid is None else valid & ~done
    if todo.any():  # large values: at a smaller scale
        positions = np.flatnonzero(todo)
        some = x[positions]
        scales = _scales(some, target.scale)
        low = int(scales.min())
        for scale in (np.flatnonzero(np.bincount(scales - low)) + low).tolist():
            if scale == first:
                continue
            scaled, done = _scaled(some, scale, scales == scale, target)
            _keep(units, wide, positions[done], scaled[done], scale, target)
            todo[positions[done]] = False
    exact = pc.cast(pa.array(units, pa.int64(), mask=None if valid is None else ~valid),
                    pa.decimal128(38, 0))
    result = exact.view(target)  # the same 16-byte layout: the point moves; each value fits
    for rows, part in wide:
        mask = np.zeros(len(x), dtype=bool)
        mask[rows] = True
        result = pc.replace_with_mask(result, pa.array(mask), part)
    if todo.any():
        result = pc.replace_with_mask(result, pa.array(todo), _rows_of(array, todo, target))
    return result


def _keep(units: np.ndarray, wide: list[tuple[np.ndarray, pa.Array]], rows: np.ndarray,
          scaled: np.ndarray, scale: int, target: pa.DataType) -> None:
    """Put ``scaled * 10**-scale`` (proven values of ``rows``) at the column's scale: in
    ``units`` when it fits an int64, else as decimals in ``wide``."""
    if not len(rows):
        return
    shift = target.scale - scale
    if shift == 0:
        units[rows] = scaled
    elif shift <= 18 and int(np.abs(scaled).max()) < 2 ** 63 // 10 ** shift:
        units[rows] = scaled * 10 ** shift
    else:
        exact = pc.cast(pa.array(scaled, pa.int64()), pa.decimal128(38, 0))
        # cannot overflow: each value was checked to fit the target
        wide.append((rows, pc.cast(exact.view(pa.decimal128(38, scale)), target)))


def _scales(x: np.ndarray, scale: int) -> np.ndarray:
    """Per row, the scale at which its decimal would have at most 15 digits: the column's,
    or fewer for a large value (``123456.78`` into ``DECIMAL(38,10)`` is checked at scale 9;
    a value whose shortest form needs more fails the check there and goes to step 2)."""
    with np.errstate(all="ignore"):
        magnitude = np.floor(np.log10(np.abs(x)))  # -inf for 0, NaN for NaN
        wanted = np.minimum(float(scale), _MAX_DIGITS_FAST - 1 - magnitude)
    wanted = np.where(np.isfinite(wanted), wanted, float(scale))
    return np.clip(wanted, -_MAX_SCALE_FAST, min(scale, _MAX_SCALE_FAST)).astype(np.int64)


def _scaled(x: np.ndarray, scale: int, rows: np.ndarray | None, target: pa.DataType
            ) -> tuple[np.ndarray, np.ndarray]:
    """Step 1 at one scale: ``units`` (x * 10**scale, whole; 0 where not done) and which of
    ``rows`` (None: all) it proves to be their shortest form, fitting ``target``: the
    decimal ``units * 10**-scale`` has fewer than 10**(p-s) before the point exactly when
    ``|units| < 10**(p - s + scale)``."""
    power = 10.0 ** abs(scale)
    bound = min(10.0 ** _MAX_DIGITS_FAST,
                float(f"1e{target.precision - target.scale + scale}"))
    with np.errstate(all="ignore"):
        units = np.rint(x * power if scale >= 0 else x / power)
        done = (np.abs(units) < bound) & \
            ((units / power if scale >= 0 else units * power) == x)
    if rows is not None:
        done &= rows
    return np.where(done, units, 0.0).astype(np.int64), done  # NaN, inf: not cast


def _float_to_integer(array: pa.Array, target: pa.DataType) -> pa.Array:
    try:
        result = pc.cast(array, target, safe=True)  # refuses fractions and overflow
    except _ARROW_ERRORS:
        return _one_by_one(array, target)  # a value to refuse: find it and say why
    limit = _EXACT_WHOLE[array.type.bit_width]
    low, high = pc.min_max(array).values()  # NaN was refused by the cast
    if -limit < (low.as_py() or 0) and (high.as_py() or 0) < limit:
        return result
    big = pc.greater_equal(pc.abs(array), limit)
    rest = pc.fill_null(big, False).to_numpy(zero_copy_only=False)
    return pc.replace_with_mask(result, pa.array(rest), _rows_of(array, rest, target))


def _rows_of(array: pa.Array, rest: np.ndarray, target: pa.DataType) -> pa.Array:
    """Step 2 for the rows of ``rest`` (a mask), in order; a refusal names the whole
    array's position."""
    positions = np.flatnonzero(rest)
    try:
        return _one_by_one(array.take(pa.array(positions)), target)
    except Refused as refused:  # the rows before it are fine: step 1 took them
        raise Refused(int(positions[refused.position]), refused.reason) from None


def _one_by_one(array: pa.Array, target: pa.DataType,
                number_of: Callable[[Any], Decimal | None] | None = None) -> pa.Array:
    """Step 2: each float as the decimal its shortest form shows (or each value as
    ``number_of`` reads it), checked against ``target``, then written at the target's scale
    (pyarrow read Decimal("1.5000...0") of 42 digits into DECIMAL(10,2) as 0.00). Arrow's
    own text -> DECIMAL cast is no help here: it read "5e-324" into DECIMAL(18,4) as 0.0000,
    and a rescaled 1.75e16 into DECIMAL(38,30) overflowed into 0.4384..., without an error."""
    shortest = number_of or _SHORTEST[array.type.bit_width]
    values: list[Decimal | int | None] = []
    for position, value in enumerate(array.to_pylist()):
        if value is None:
            values.append(None)
            continue
        number = shortest(value)
        if number is None:
            raise Refused(position, "it is not a decimal number")
        reason = _why_not(number, target)
        if reason is not None:
            raise Refused(position, reason)
        values.append(_WIDE.quantize(number, Decimal(f"1E-{target.scale}"))
                      if pt.is_decimal(target) else int(number))
    return pa.array(values, type=target)


_WIDE = decimal.Context(prec=100)  # exact for every value that passed _why_not


_SHORTEST: dict[int, Callable[[float], Decimal]] = {
    64: lambda value: Decimal(repr(value)),
    32: lambda value: Decimal(str(np.float32(value))),  # numpy's shortest for the REAL
    16: lambda value: Decimal(str(np.float16(value))),
}


def _why_not(number: Decimal, target: pa.DataType) -> str | None:
    """Why ``number`` cannot go into ``target`` unchanged; None if it can."""
    kind = "a DECIMAL" if pt.is_decimal(target) else "an integer column"
    if number.is_nan():
        return f"it is NaN: {kind} holds numbers only"
    if number.is_infinite():
        return f"it is an infinity: {kind} holds finite numbers only"
    before, after = _digits(number)
    if pt.is_decimal(target):
        if after > target.scale:
            return (f"it has {after} digits after the point, the column keeps "
                    f"{target.scale}: it would be rounded (round it first)")
        if before > target.precision - target.scale:
            return (f"it is too large for the column: {before} digits before the point, "
                    f"the column keeps {target.precision - target.scale}")
        return None
    if after:
        return "it is not a whole number: it would be truncated"
    bits = target.bit_width
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1)) if pt.is_signed_integer(target) else \
        (0, 2 ** bits)
    return None if low <= int(number) < high else f"it is out of range for {target}"


def _digits(number: Decimal) -> tuple[int, int]:
    """(digits before the point, digits after it) of ``number`` without trailing zeros."""
    _, coefficient, exponent = number.as_tuple()
    assert isinstance(exponent, int), "finite numbers only"
    text = "".join(map(str, coefficient)).rstrip("0")
    if not text:
        return 0, 0
    exponent += len(coefficient) - len(text)
    return max(0, len(text) + exponent), max(0, -exponent)
