"""The model's state: what every stream, table and the warehouse target must hold, kept in plain
Python from the operations that are known to have committed; and the comparison with what the
real system holds (``compare``), as multisets of rows.

What the model knows exactly it checks exactly. Where the engine may legitimately choose
(garbage collection removes a batch once nothing needs it any more), the check is the bound
it must respect: a batch that is gone must be one that nothing still needed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from benchmarks.model.dataflow import (
    DEFAULT_CHANNEL,
    Record,
    add_totals,
    enriched_rows,
    flagged_rows,
)

Row = tuple[Any, ...]


@dataclass
class Model:
    """What the real system must hold (module docstring)."""

    #: committed ``orders`` batches: batch-id -> records, in commit order
    batches: dict[int, list[Record]] = field(default_factory=dict)
    #: batches every procedure has processed (a prefix of ``batches`` once run)
    processed: set[int] = field(default_factory=set)
    #: the next record number a source would produce
    next_rec: int = 1
    #: rows ``archive`` holds (each ad hoc copy as it was seen when it committed)
    archive: Counter[Row] = field(default_factory=Counter)
    notes: Counter[Row] = field(default_factory=Counter)
    #: rows the PostgreSQL target must hold, by ``rec``; None: no target table
    target: dict[int, Row] | None = None
    #: the sink's target has every processed batch up to here
    delivered: int = 0
    #: the reader consumer acknowledged ``enriched`` up to here
    reader_acked: int = 0
    #: every consumer of ``enriched`` had acknowledged up to here before a weak-durability
    #: restart: garbage collection could remove those batches live (and replay repeats it),
    #: while the acknowledgements, not logged, come back lower (docs/engine.md)
    released: int = 0
    #: batches ``enrich`` may have run a second time (kept when a rename retired the old name):
    #: their totals may count once or twice
    reprocessed: list[int] = field(default_factory=list)
    #: the first batch after the model's ``append_columns`` step (None: not taken): the
    #: batches before it were sent without the appended columns and read NULL and the
    #: declared default in them since (``stored``)
    appended_from: int | None = None

    @property
    def last_id(self) -> int:
        return max(self.batches, default=0)

    def commit(self, batch_id: int, records: list[Record]) -> None:
        assert batch_id not in self.batches and batch_id > self.last_id, (batch_id, self.last_id)
        self.batches[batch_id] = list(records)
        self.next_rec = max(self.next_rec, max(r.rec for r in records) + 1)

    def run_all(self) -> None:
        """``run_until_idle`` returned: every committed batch is processed."""
        self.processed = set(self.batches)

    def processed_ids(self) -> list[int]:
        return sorted(self.processed)

    def totals_options(self) -> list[dict[int, tuple[int, Decimal]]]:
        """What ``totals`` may hold: every processed batch once, and, after a rename, the
        re-processed kept batches once more (the retired procedure's successor runs them)."""
        base: dict[int, tuple[int, Decimal]] = {}
        for b in self.processed_ids():
            add_totals(base, self.batches[b])
        options = [base]
        if self.reprocessed:
            more = dict(base)
            for b in self.reprocessed:
                add_totals(more, self.batches[b])
            options.append(more)
        return options

    def stored(self, batch_id: int) -> list[Record]:
        """Batch ``batch_id``'s records as the engine holds them now: as sent, and a batch
        sent before the columns were appended with their NULL and default (``batches``
        keeps them as sent: a re-send sends them so)."""
        records = self.batches[batch_id]
        if self.appended_from is None or batch_id >= self.appended_from:
            return records
        return [r._replace(channel=DEFAULT_CHANNEL) for r in records]

    def delivered_rows(self, through: int, after: int = 0) -> dict[int, Row]:
        return {row[0]: row for b in self.processed_ids() if after < b <= through
                for row in enriched_rows(self.stored(b))}


@dataclass
class Observed:
    """What the real system holds, read after a step (``system.System.observe``)."""

    orders: dict[int, Counter[Row]]
    enriched: dict[int, Counter[Row]]
    flagged: dict[int, Counter[Row]]
    totals: dict[int, tuple[int, Decimal]]
    archive: Counter[Row]
    notes: Counter[Row]
    target: Counter[Row] | None
    sink_acked: int
    reader_acked: int
    wal_bytes: int


def by_batch(rows: Iterable[Row]) -> dict[int, Counter[Row]]:
    """Rows whose first column is ``_batch_id`` -> {batch-id: multiset of the other columns}."""
    out: dict[int, Counter[Row]] = {}
    for row in rows:
        out.setdefault(row[0], Counter())[tuple(row[1:])] += 1
    return out


def _stream(name: str, seen: dict[int, Counter[Row]], want: dict[int, list[Row]],
            must_keep: set[int]) -> list[str]:
    """``seen`` must hold exactly ``want``'s rows for every batch it holds, no batch ``want``
    lacks, and every batch of ``must_keep`` (the ones something still needs)."""
    problems = []
    for b, rows in sorted(seen.items()):
        if b not in want:
            problems.append(f"{name}: batch {b} ({sum(rows.values())} rows) was never committed "
                            f"(or not yet processed)")
        elif rows != Counter(want[b]):
            problems.append(f"{name}: batch {b} holds {_diff(rows, Counter(want[b]))}")
    for b in sorted(must_keep - set(seen)):
        if want.get(b):
            problems.append(f"{name}: batch {b} ({len(want[b])} rows) is lost (still needed)")
    return problems


def _diff(seen: Counter[Row], want: Counter[Row]) -> str:
    extra, missing = seen - want, want - seen
    return (f"{sum(extra.values())} unexpected/duplicated rows (e.g. {list(extra)[:2]}), "
            f"{sum(missing.values())} missing (e.g. {list(missing)[:2]})")


def compare(model: Model, seen: Observed, *, wal_limit: int | None) -> list[str]:
    """Every difference between the model and the real system, as sentences (empty: equal)."""
    problems: list[str] = []
    processed = model.processed_ids()
    # orders: every committed batch as sent; one not yet processed must still be there
    problems += _stream("orders", seen.orders,
                        {b: [tuple(r) for r in model.stored(b)] for b in model.batches},
                        set(model.batches) - model.processed)
    # enriched: kept for the sink and the reader until both acknowledged it
    keep = {b for b in processed
            if b > max(min(seen.sink_acked, seen.reader_acked), model.released)}
    problems += _stream("enriched", seen.enriched,
                        {b: enriched_rows(model.stored(b)) for b in processed}, keep)
    # flagged: retain "all" and no consumer: every processed batch, for ever
    problems += _stream("flagged", seen.flagged,
                        {b: flagged_rows(model.batches[b]) for b in processed}, set(processed))
    if seen.totals not in model.totals_options():
        want = model.totals_options()[0]
        wrong = {k: (seen.totals.get(k), want.get(k)) for k in set(seen.totals) | set(want)
                 if seen.totals.get(k) != want.get(k)}
        problems.append(f"totals: (seen, want) differ for k: {wrong}")
    if seen.archive != model.archive:
        problems.append(f"archive: {_diff(seen.archive, model.archive)}")
    if seen.notes != model.notes:
        problems.append(f"notes: {_diff(seen.notes, model.notes)}")
    if seen.reader_acked != model.reader_acked:
        problems.append(f"reader: acknowledged {seen.reader_acked}, the model says "
                        f"{model.reader_acked}")
    if model.target is None:
        if seen.target is not None:
            problems.append(f"target: exists with {sum(seen.target.values())} rows; the model "
                            f"says it was never made (or was dropped)")
    elif seen.target is None:
        problems.append(f"target: missing; the model says it holds {len(model.target)} rows")
    elif seen.target != Counter(model.target.values()):
        problems.append(f"target: {_diff(seen.target, Counter(model.target.values()))}")
    if wal_limit is not None and seen.wal_bytes > wal_limit:
        problems.append(f"WAL: {seen.wal_bytes:,} bytes, above {wal_limit:,} (the engine "
                        f"checkpoints after a commit once it passes checkpoint_wal_bytes)")
    return problems
