"""What a dimension load did: rows per table, what each source file gave, time per step."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

T = TypeVar("T")


@dataclass(frozen=True)
class SourceCount:
    """One source file: ``rows_in = loaded + rejected`` (rejected by the reader or by a
    dimension rule). ``loaded`` rows may still be merged (same-day versions) or filtered
    (HR rows that are not brokers) on their way into a table."""

    source: str
    rows_in: int
    rejected: int

    @property
    def loaded(self) -> int:
        return self.rows_in - self.rejected


@dataclass(frozen=True)
class DimensionReport:
    """``rows``: rows written per table (historical: the table's row count; incremental: the
    new versions). ``ended``: versions this load closed (incremental only). ``seconds``: the
    whole call; ``steps``: seconds per step, in order."""

    schema: str
    batch_id: int
    rows: dict[str, int]
    sources: tuple[SourceCount, ...]
    seconds: float
    ended: dict[str, int] = field(default_factory=dict)
    steps: dict[str, float] = field(default_factory=dict)

    @property
    def rejected(self) -> int:
        return sum(s.rejected for s in self.sources)

    def summary(self) -> str:
        """A few human-readable lines."""
        rows = ", ".join(f"{t} {n}" for t, n in self.rows.items())
        ended = ", ".join(f"{t} {n}" for t, n in self.ended.items())
        lines = [f"batch {self.batch_id} into {self.schema} in {self.seconds:.1f} s: {rows}"]
        if ended:
            lines.append(f"  versions ended: {ended}")
        lines.append(f"  source rows rejected: {self.rejected}")
        return "\n".join(lines)


def source_label(path: str) -> str:
    """The source a reject belongs to: the file name, FINWIRE for every quarterly file."""
    name = Path(path).name
    return "FINWIRE" if re.fullmatch(r"FINWIRE(\d{4}Q[1-4])?", name) else name


def count_sources(rows_in: dict[str, int], rejects: pa.Table) -> tuple[SourceCount, ...]:
    """rows in and rejected per source, from the rejects actually stored."""
    rejected: dict[str, int] = {}
    for path in rejects["source_file"].to_pylist():
        label = source_label(path)
        rejected[label] = rejected.get(label, 0) + 1
    return tuple(SourceCount(s, n, rejected.get(s, 0)) for s, n in rows_in.items())


class Steps:
    """Seconds per step, in order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(self, name: str, work: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return work()
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0)
                                       + time.perf_counter() - started, 3)
