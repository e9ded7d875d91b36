"""Backfill a TPC-DI batch of the streamed DimTrade with Spark (docs/tpcdi.md, "Backfill").

The rows of interval "batch k" are, in ``<schema>.dimtrade``, the rows whose ``batchid`` is k
(the trades batch k touched last), and in ``<schema>.dimessages`` the DimTrade alerts of batch k
(``messagesource = 'DimTrade' AND batchid = k``). A backfill rebuilds them from the source files
with the Spark rules (``dimtrade_spark_rules``, the same rules as the stream) and replaces them
in one PostgreSQL transaction (``migrators.backfill.replace``), so the warehouse equals a clean
run's:

- a trade's row after batch k depends on its events in batches 1..k, so the rebuild replays
  the earlier batches' events *of the trades batch k touches* (in memory, nothing written),
  then applies batch k to that state;
- the dimensions are read as of batch k (versions made by batches up to k), whatever later
  batches have changed since;
- a rebuilt trade that a later batch has touched since (``batchid`` > k in the warehouse) is
  left as it is: its row belongs to the later interval. One whose row is older (``batchid`` <
  k: the stream's change of batch k is missing) is replaced.

The streaming pipeline seals "batch k" once all of it is in PostgreSQL (``seal_batch``); a
backfill of a batch that is not sealed is refused (``IntervalNotSealed``): the stream may still
be writing it. Re-running a backfill writes the same rows again and bumps the version.

Two more intervals: a **batch-id range** (``backfill_batches``: batches first..last rebuilt in
one replay, their intervals replaced in ONE transaction, a version per batch) and a **date
range** (``backfill_dates``, interval "dates D1..D2", ``date_slices``: the DimTrade rows of
trades *created* on those days, the DimTrade alerts of events *on* them). A date range is
rebuilt from every sealed batch 1..N (the trades with an event on those days, their whole
history), and rows of later batches (``batchid`` > N: streamed since) are kept. An interval
overlapping a recorded one of the same column with other bounds is refused
(``IntervalOverlap``).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from migrators import backfill, watermarks
from migrators.backfill import (
    Interval,
    IntervalNotSealed,
    IntervalOverlap,
    Replaced,
    Slice,
)
from migrators.postgres import connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from sstore.workloads.tpcdi.dimtrade_spark_rules import Dimensions

__all__ = ["BackfillReport", "IntervalNotSealed", "IntervalOverlap", "backfill_batch",
           "backfill_batches", "backfill_dates", "batch_interval", "date_slices",
           "parse_batch_range", "parse_date_range", "rebuild", "rebuild_batches",
           "rebuild_dates", "seal_batch", "sealed_batches", "slices", "versions"]


def batch_interval(batch: int) -> Interval:
    """TPC-DI batch ``batch`` as an interval of the ``batchid`` column."""
    if batch < 1:
        raise ValueError(f"TPC-DI batches are 1, 2, ...; got {batch}")
    return Interval(f"batch {batch}", "batchid", batch, batch)


def slices(schema: str, batch: int) -> tuple[Slice, Slice]:
    """The rows of batch ``batch`` in DimTrade (keyed by trade id) and its DimTrade alerts."""
    interval = batch_interval(batch)
    return (Slice(f"{schema}.dimtrade", interval, key=("tradeid",)),
            Slice(f"{schema}.dimessages", interval, where="messagesource = %s",
                  params=("DimTrade",)))


def seal_batch(url: str, schema: str, batch: int) -> list[int]:
    """The stream has every row of ``batch`` in the warehouse: record its version 1 (kept if
    the batch was sealed or backfilled before). Returns the versions."""
    with connect(url) as con:
        return backfill.seal(con, slices(schema, batch))


def sealed_batches(con: psycopg.Connection, schema: str) -> list[int]:
    """The TPC-DI batches of ``schema`` whose DimTrade interval is recorded (sealed by the
    stream, or backfilled since), sorted; no transaction left."""
    table = f"{schema}.dimtrade"
    return sorted(int(str(r["interval"]).removeprefix("batch ")) for r in
                  backfill.versions(con, table) if str(r["interval"]).startswith("batch "))


def versions(url: str, schema: str) -> list[dict[str, Any]]:
    """The recorded intervals of the schema's DimTrade and DImessages."""
    with connect(url) as con:
        rows = backfill.versions(con)
    return [r for r in rows if str(r["target"]).startswith(f"{schema}.")]


def range_interval(first: int, last: int) -> tuple[Interval, ...]:
    """TPC-DI batches ``first``..``last``: one interval per batch (replaced together)."""
    if last < first:
        raise ValueError(f"batch range {first}-{last}: the last batch is below the first")
    return tuple(batch_interval(b) for b in range(first, last + 1))


def parse_batch_range(text: str) -> tuple[int, int]:
    """"2-3" -> (2, 3); "2" -> (2, 2). ``ValueError`` saying what is wrong otherwise."""
    low, sep, high = text.strip().partition("-")
    high = high if sep else low
    if not (low.strip().isdigit() and high.strip().isdigit()):
        raise ValueError(f"batch range {text!r} is not FIRST-LAST (e.g. 2-3)")
    first, last = int(low), int(high)
    if first < 1 or last < first:
        raise ValueError(f"batch range {text!r}: batches are 1, 2, ... and FIRST must not "
                         f"exceed LAST")
    return first, last


def parse_date_range(first: str, last: str) -> tuple[dt.date, dt.date]:
    """Two ISO days (YYYY-MM-DD, both needed, inclusive) -> dates; ``ValueError`` if not."""
    if not first or not last:
        raise ValueError("a date range needs both its first and its last day (inclusive; "
                         "one day: the same date twice)")
    try:
        days = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    except ValueError:
        raise ValueError(f"date range {first}..{last}: days are YYYY-MM-DD") from None
    if days[1] < days[0]:
        raise ValueError(f"date range {first}..{last}: the last day is before the first")
    return days


def date_key(day: dt.date) -> int:
    """A date as DimDate's surrogate key (``sk_createdateid``): yyyymmdd."""
    return day.year * 10_000 + day.month * 100 + day.day


def date_slices(schema: str, first: dt.date, last: dt.date, through: int
                ) -> tuple[Slice, Slice]:
    """Interval "dates FIRST..LAST" (both inclusive): the DimTrade rows of the trades created
    on those days (``sk_createdateid``; a trade keeps its create date, so its row stays in
    the interval whatever later events do to it) and the DimTrade alerts of events on those
    days (``messagedateandtime``, the event's time). Rows of batches after ``through`` (the
    last batch the rebuild read) are newer: kept. The stream never seals a date interval:
    its first backfill records version 1."""
    if last < first:
        raise ValueError(f"date range {first}..{last}: the last day is before the first")
    name = f"dates {first.isoformat()}..{last.isoformat()}"
    days = Interval(name, "sk_createdateid", date_key(first), date_key(last))
    times = Interval(name, "messagedateandtime", dt.datetime.combine(first, dt.time()),
                     dt.datetime.combine(last, dt.time.max))
    return (Slice(f"{schema}.dimtrade", days, key=("tradeid",), newer=("batchid", through),
                  sealed=False),
            Slice(f"{schema}.dimessages", times, where="messagesource = %s",
                  params=("DimTrade",), newer=("batchid", through), sealed=False))


@dataclass(frozen=True)
class Rebuilt:
    """Batch k as a clean run makes it: its DimTrade rows and its alerts."""

    rows: pa.Table
    alerts: pa.Table
    trades_replayed: int   # trades of batch k with events in earlier batches


@dataclass
class BackfillReport:
    schema: str
    batch: int | None       # a single batch (``backfill_batch``), else None
    interval: str = ""      # "batch 2", "batches 2-3", "dates 2017-07-07..2017-07-08"
    replaced: list[Replaced] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def version(self) -> int:
        return self.replaced[0].version if self.replaced else 0

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "batch": self.batch,
                "interval": self.interval or f"batch {self.batch}", "version": self.version,
                "versions": {r.interval: r.version for r in self.replaced},
                "tables": [vars(r) for r in self.replaced],
                "seconds": {k: round(v, 3) for k, v in self.phases.items()}}


def backfill_batch(spark: SparkSession | None, data_dir: str | PathLike[str], url: str, schema: str,
                   batch: int, before_swap: Callable[[], None] | None = None,
                   before_commit: Callable[[psycopg.Connection], None] | None = None
                   ) -> BackfillReport:
    """Rebuild TPC-DI batch ``batch`` with Spark and replace the streamed rows of it (module
    docstring). Refused before any Spark work if the stream has not sealed the batch.
    ``spark``: None starts (or finds) the process's session (``get_spark``) after that
    check. ``before_swap``, ``before_commit``: test hooks (``migrators.backfill.replace``)."""
    report = backfill_batches(spark, data_dir, url, schema, batch, batch, before_swap,
                              before_commit)
    report.batch, report.interval = batch, f"batch {batch}"
    return report


def backfill_batches(spark: SparkSession | None, data_dir: str | PathLike[str], url: str,
                     schema: str, first: int, last: int,
                     before_swap: Callable[[], None] | None = None,
                     before_commit: Callable[[psycopg.Connection], None] | None = None
                     ) -> BackfillReport:
    """Rebuild TPC-DI batches ``first``..``last`` with Spark (one replay) and replace their
    streamed rows in ONE transaction, each batch's version bumped. Refused before any Spark
    work unless the stream has sealed every one of them."""
    range_interval(first, last)  # a backwards range is refused before anything else
    report = BackfillReport(schema, None, f"batches {first}-{last}")
    pieces = [piece for b in range(first, last + 1) for piece in slices(schema, b)]
    with connect(url) as con:
        missing = backfill.unsealed(con, pieces)
        backfill.check_overlaps(con, pieces)
    batches = sorted({int(p.interval.low) for p in missing})  # type: ignore[arg-type]
    if missing:
        raise IntervalNotSealed(_not_sealed(url, schema, batches))
    if spark is None:
        from migrators.spark_session import get_spark
        spark = get_spark()
    t0 = time.perf_counter()
    out = rebuild_batches(spark, data_dir, url, schema, first, last)
    report.phases["rebuild (Spark)"] = time.perf_counter() - t0
    staged = []
    for b in range(first, last + 1):
        trade, alert = slices(schema, b)
        staged += [(trade, out[b].rows), (alert, out[b].alerts)]
    t0 = time.perf_counter()
    report.replaced = backfill.replace(
        url, staged, not_sealed=lambda gone: _not_sealed(
            url, schema, sorted({int(p.interval.low) for p in gone})),  # type: ignore[arg-type]
        before_swap=before_swap, before_commit=before_commit)
    report.phases["stage and replace (PostgreSQL)"] = time.perf_counter() - t0
    return report


def backfill_dates(spark: SparkSession | None, data_dir: str | PathLike[str], url: str,
                   schema: str, first: dt.date, last: dt.date,
                   before_swap: Callable[[], None] | None = None,
                   before_commit: Callable[[psycopg.Connection], None] | None = None
                   ) -> BackfillReport:
    """Rebuild interval "dates ``first``..``last``" (``date_slices``) with Spark and replace
    it in ONE transaction. The rebuild replays every sealed batch (1..N; they must be
    contiguous) for the trades with an event on those days, so a trade's row has the state
    its whole history gives it; rows the stream has written since (batch > N) are kept."""
    date_slices(schema, first, last, 0)  # a backwards range is refused before anything else
    with connect(url) as con:
        sealed = sealed_batches(con, schema)
    through = len(sealed)
    if not sealed or sealed != list(range(1, through + 1)):
        gap = [b for b in range(1, (max(sealed) if sealed else 1) + 1) if b not in sealed]
        raise IntervalNotSealed(
            f"refusing to backfill dates {first}..{last} of {schema}.dimtrade: a date range "
            f"is rebuilt from every batch the stream has sealed, and Batch"
            f"{', Batch'.join(map(str, gap))} is not sealed (sealed: {sealed or 'none'}). "
            f"Wait until the stream has finished it, then run the backfill again. Nothing "
            f"was changed")
    pieces = date_slices(schema, first, last, through)
    with connect(url) as con:
        backfill.check_overlaps(con, pieces)
    report = BackfillReport(schema, None, pieces[0].interval.name)
    if spark is None:
        from migrators.spark_session import get_spark
        spark = get_spark()
    t0 = time.perf_counter()
    rows, alerts = rebuild_dates(spark, data_dir, url, schema, first, last, through)
    report.phases["rebuild (Spark)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    report.replaced = backfill.replace(url, [(pieces[0], rows), (pieces[1], alerts)],
                                       before_swap=before_swap, before_commit=before_commit)
    report.phases["stage and replace (PostgreSQL)"] = time.perf_counter() - t0
    return report


def _not_sealed(url: str, schema: str, batches: list[int]) -> str:
    """Why ``batches`` cannot be backfilled, with where the stream stands."""
    from sstore.workloads.tpcdi.streaming.batch_ids import ID_STRIDE

    with connect(url) as con:
        last = watermarks.watermark_of(con, "dimtrade_changes", f"{schema}.dimtrade")
    where = "the stream has delivered nothing to it"
    if last is not None:
        where = (f"the stream has delivered up to event line {last % ID_STRIDE:,} of Batch"
                 f"{last // ID_STRIDE}" if last else "the stream has delivered nothing to it")
    names = ", Batch".join(map(str, batches))
    return (f"refusing to backfill Batch{names} of {schema}.dimtrade: the stream has not "
            f"finished loading {'them' if len(batches) > 1 else 'it'} ({where}). A replace "
            f"now could lose rows the stream is still writing. Wait until `sstore tpcdi run` "
            f"(or the tpcdi_incremental DAG) has finished Batch{names}, then run the "
            f"backfill again. Nothing was changed.")


def rebuild(spark: SparkSession, data_dir: str | PathLike[str], url: str, schema: str,
            batch: int) -> Rebuilt:
    """Batch ``batch``'s DimTrade rows and alerts as a clean run makes them (nothing
    written): the events of batches 1..batch-1 of the trades batch ``batch`` touches are
    replayed in memory for their state before it, each batch with its dimensions as of it."""
    return rebuild_batches(spark, data_dir, url, schema, batch, batch)[batch]


def rebuild_batches(spark: SparkSession, data_dir: str | PathLike[str], url: str, schema: str,
                    first: int, last: int) -> dict[int, Rebuilt]:
    """Batches ``first``..``last`` as a clean run makes them, in one replay: the events of
    batches 1..last of the trades those batches touch."""
    events = _events(spark, data_dir)
    wanted = {b: events(b) for b in range(first, last + 1)}
    trades = sorted({t for e in wanted.values() for t in e.trade_ids})
    out: dict[int, Rebuilt] = {}

    def keep(b: int, rows: pa.Table, alerts: pa.Table | None, state: pa.Table | None) -> None:
        if b >= first:
            assert alerts is not None
            out[b] = Rebuilt(rows, alerts, 0 if state is None else pc.sum(pc.is_in(
                rows["tradeid"], state["tradeid"])).as_py() or 0)

    _replay(spark, data_dir, url, schema, last, trades,
            lambda b: wanted[b] if b in wanted else events(b), first, keep)
    return out


def rebuild_dates(spark: SparkSession, data_dir: str | PathLike[str], url: str, schema: str,
                  first: dt.date, last: dt.date, through: int) -> tuple[pa.Table, pa.Table]:
    """Interval "dates ``first``..``last``" as a clean run of batches 1..``through`` makes
    it: the rows of the trades created on those days and the alerts of events on them. The
    trades with an event on those days are replayed through every batch (their state and
    their alerts depend on their earlier events; a trade created earlier can raise an alert
    on those days)."""
    from pyspark.sql import functions as F

    events = _events(spark, data_dir)
    loaded = {b: events(b) for b in range(1, through + 1)}
    trades: set[int] = set()
    for e in loaded.values():
        on_days = e.events.where(F.to_date("t_dts").between(first, last)).select("t_id")
        trades.update(int(r[0]) for r in on_days.distinct().collect())
    alerts: list[pa.Table] = []
    final: list[pa.Table | None] = [None]

    def keep(_b: int, _rows: pa.Table, messages: pa.Table | None, _state: pa.Table | None
             ) -> None:
        assert messages is not None
        alerts.append(messages)

    final[0] = _replay(spark, data_dir, url, schema, through, sorted(trades), loaded.__getitem__,
                       1, keep)
    from sstore.workloads.tpcdi.dimtrade_spark_rules import DIMESSAGES, DIMTRADE

    state = final[0] if final[0] is not None else DIMTRADE.empty_table()
    created = pc.cast(state["sk_createdateid"], pa.int64())
    rows = state.filter(pc.and_(pc.greater_equal(created, date_key(first)),
                                pc.less_equal(created, date_key(last))))
    messages = pa.concat_tables(alerts) if alerts else DIMESSAGES.empty_table()
    day = pc.cast(messages["messagedateandtime"], pa.date32())
    messages = messages.filter(pc.and_(pc.greater_equal(day, pa.scalar(first, pa.date32())),
                                       pc.less_equal(day, pa.scalar(last, pa.date32()))))
    return rows, messages


def _events(spark: SparkSession, data_dir: str | PathLike[str]) -> Callable[[int], Any]:
    from sstore.workloads.tpcdi.dimtrade_spark_events import (
        historical_events,
        incremental_events,
    )

    data = Path(data_dir)
    return lambda b: (historical_events(spark, data) if b == 1
                      else incremental_events(spark, data, b))


def _replay(spark: SparkSession, data_dir: str | PathLike[str], url: str, schema: str,
            through: int, trades: list[int], events: Callable[[int], Any], alerts_from: int,
            keep: Callable[[int, pa.Table, pa.Table | None, pa.Table | None], None]
            ) -> pa.Table | None:
    """Batches 1..``through`` over the events of ``trades`` only, each batch with its
    dimensions as of it; ``keep(batch, rows, alerts, state before)`` sees each batch's
    result (alerts from batch ``alerts_from`` on). Returns the state after the last batch."""
    from pyspark.sql import functions as F

    from sstore.workloads.tpcdi.dimtrade_spark import read_dimensions

    state: pa.Table | None = None
    for b in range(1, through + 1):
        replay = events(b).events.where(F.col("t_id").isin(trades))
        dims = read_dimensions(spark, Path(data_dir), url, schema, current=b > 1, as_of=b)
        rows, messages = _apply(spark, replay, state, dims, b, alerts_too=b >= alerts_from)
        keep(b, rows, messages, state)
        state = _overlay(state, rows)
    return state


def _apply(spark: SparkSession, events: DataFrame, state: pa.Table | None, dims: Dimensions,
           batch: int, alerts_too: bool) -> tuple[pa.Table, pa.Table | None]:
    """One batch's rules over ``events`` on top of ``state`` (the DimTrade rows before it)."""
    from migrators.spark import arrow_to_spark
    from sstore.workloads.tpcdi.dimtrade_spark_rules import (
        DIMESSAGES,
        DIMTRADE,
        alerts,
        dimtrade_rows,
        evaluate,
    )

    existing = None if batch == 1 else arrow_to_spark(
        spark, state if state is not None else DIMTRADE.empty_table())
    evaluated = evaluate(events, existing, dims).cache()
    try:
        rows = dimtrade_rows(evaluated, existing, batch).select(*DIMTRADE.names).toArrow()
        messages = alerts(evaluated, batch).toArrow() if alerts_too else None
    finally:
        evaluated.unpersist()
    return (rows.cast(DIMTRADE),
            messages.select(DIMESSAGES.names).cast(DIMESSAGES) if messages is not None
            else None)


def _overlay(state: pa.Table | None, rows: pa.Table) -> pa.Table:
    """``state`` with ``rows`` replacing the rows of their trades."""
    if state is None or state.num_rows == 0:
        return rows
    kept = state.filter(pc.invert(pc.is_in(state["tradeid"], rows["tradeid"])))
    return pa.concat_tables([kept, rows])
