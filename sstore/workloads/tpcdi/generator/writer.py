"""Writing source files the way DIGen does: CRLF line ends, no header, empty field = NULL.

DIGen's default line separator is CRLF, and loaders written against real DIGen output strip
the ``\\r``; writing ``\\n`` would hide loaders that forget to. Values never contain the
separator, so nothing is quoted or escaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from pathlib import Path

import numpy as np

from .report import FileReport

CRLF = "\r\n"
_CHUNK_LINES = 100_000


def write_lines(root: Path, relative: str, lines: Iterable[str]) -> FileReport:
    """Write ``lines`` (without line ends) to ``root/relative`` with CRLF after each line.

    Lines are written in chunks so that large files never exist twice in memory.
    """
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = 0
    iterator = iter(lines)
    with open(path, "w", encoding="utf-8", newline="") as out:
        while chunk := list(islice(iterator, _CHUNK_LINES)):
            out.write(CRLF.join(chunk))
            out.write(CRLF)
            rows += len(chunk)
    return FileReport(relative, rows, path.stat().st_size)


def write_text(root: Path, relative: str, text: str) -> FileReport:
    """Write a whole document (CustomerMgmt.xml) as is; rows counts its lines."""
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as out:
        out.write(text)
    return FileReport(relative, text.count("\n"), path.stat().st_size)


def field(value: object) -> str:
    """One field's text: None is the empty (NULL) field."""
    return "" if value is None else str(value)


def pipe(values: Sequence[object]) -> str:
    """A ``|``-separated line of fields."""
    return "|".join(field(v) for v in values)


def money(cents: int) -> str:
    """Two-decimal text of an amount in cents, exactly (no float rounding)."""
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(int(cents)), 100)
    return f"{sign}{whole}.{frac:02d}"


def money_list(cents: np.ndarray) -> list[str]:
    """``money`` for an array of non-negative cents."""
    whole, frac = np.divmod(np.asarray(cents, dtype=np.int64), 100)
    return [f"{w}.{f:02d}" for w, f in zip(whole.tolist(), frac.tolist())]
