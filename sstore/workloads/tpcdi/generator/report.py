"""What a generation run wrote: files with row counts and sizes, trade counts per batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: ``progress(step, done, total)``: called when a step starts (done < total) and at the end.
ProgressCallback = Callable[[str, int, int], None]


@dataclass(frozen=True)
class FileReport:
    """One written file: its path relative to the output directory (POSIX), rows, bytes."""

    path: str
    rows: int
    bytes: int


@dataclass(frozen=True)
class TradeCounts:
    """DimTrade audit counts of one batch's Trade.txt (the values of its Trade_audit.csv).

    ``records`` is every row, ``new`` the trades it creates (Batch1: all rows; BatchN: the
    ``I`` rows), ``canceled`` the CNCL rows, and the two ``invalid_*`` counts the completed
    rows whose commission or fee exceeds T_TRADE_PRICE * T_QTY (each raises one alert).
    """

    batch: int
    records: int
    new: int
    canceled: int
    invalid_commission: int
    invalid_charge: int


@dataclass(frozen=True)
class GenerationReport:
    """The result of ``generate``: enough to print a summary or to check a run in a test."""

    output: Path
    scale_factor: float
    seed: int
    bad_rows: int
    files: tuple[FileReport, ...]
    trades: dict[int, TradeCounts] = field(default_factory=dict)
    seconds: float = 0.0

    def file(self, path: str) -> FileReport:
        """The report of one file, by its relative path (``Batch1/Trade.txt``)."""
        for item in self.files:
            if item.path == path:
                return item
        raise KeyError(path)

    @property
    def total_bytes(self) -> int:
        """Bytes written over all files."""
        return sum(item.bytes for item in self.files)
