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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from migrators import backfill
from migrators.backfill import Interval, IntervalNotSealed, Replaced, Slice
from migrators.postgres import connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from sstore.workloads.tpcdi.dimtrade_spark_rules import Dimensions

__all__ = ["BackfillReport", "IntervalNotSealed", "backfill_batch", "batch_interval",
           "rebuild", "seal_batch", "sealed_batches", "slices", "versions"]


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


@dataclass(frozen=True)
class Rebuilt:
    """Batch k as a clean run makes it: its DimTrade rows and its alerts."""

    rows: pa.Table
    alerts: pa.Table
    trades_replayed: int   # trades of batch k with events in earlier batches


@dataclass
class BackfillReport:
    schema: str
    batch: int
    replaced: list[Replaced] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def version(self) -> int:
        return self.replaced[0].version if self.replaced else 0

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "batch": self.batch, "version": self.version,
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
    report = BackfillReport(schema, batch)
    pieces = slices(schema, batch)
    with connect(url) as con:
        missing = backfill.unsealed(con, pieces)
    if missing:
        raise IntervalNotSealed(_not_sealed(url, schema, batch))
    if spark is None:
        from migrators.spark_session import get_spark
        spark = get_spark()
    t0 = time.perf_counter()
    out = rebuild(spark, data_dir, url, schema, batch)
    report.phases["rebuild (Spark)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    report.replaced = backfill.replace(
        url, [(pieces[0], out.rows), (pieces[1], out.alerts)],
        not_sealed=lambda _missing: _not_sealed(url, schema, batch),
        before_swap=before_swap, before_commit=before_commit)
    report.phases["stage and replace (PostgreSQL)"] = time.perf_counter() - t0
    return report


def _not_sealed(url: str, schema: str, batch: int) -> str:
    """Why batch ``batch`` cannot be backfilled, with where the stream stands."""
    from sstore.workloads.tpcdi.streaming.pipeline import ID_STRIDE

    with connect(url) as con:
        known = con.execute("SELECT to_regclass('sstore.watermarks') IS NOT NULL").fetchone()
        rows = con.execute("SELECT batch_id FROM sstore.watermarks WHERE target = %s AND "
                           "stream = 'dimtrade_changes'", (f"{schema}.dimtrade",)
                           ).fetchall() if known and known[0] else []
    where = "the stream has delivered nothing to it"
    if rows:
        last = max(int(r[0]) for r in rows)
        where = (f"the stream has delivered up to event line {last % ID_STRIDE:,} of Batch"
                 f"{last // ID_STRIDE}" if last else "the stream has delivered nothing to it")
    return (f"refusing to backfill Batch{batch} of {schema}.dimtrade: the stream has not "
            f"finished loading it ({where}). A replace now could lose rows the stream is "
            f"still writing. Wait until `sstore tpcdi run` (or the tpcdi_incremental DAG) has "
            f"finished Batch{batch}, then run the backfill again. Nothing was changed.")


def rebuild(spark: SparkSession, data_dir: str | PathLike[str], url: str, schema: str,
            batch: int) -> Rebuilt:
    """Batch ``batch``'s DimTrade rows and alerts as a clean run makes them (nothing
    written): the events of batches 1..batch-1 of the trades batch ``batch`` touches are
    replayed in memory for their state before it, each batch with its dimensions as of it."""
    from pyspark.sql import functions as F

    from sstore.workloads.tpcdi.dimtrade_spark import read_dimensions
    from sstore.workloads.tpcdi.dimtrade_spark_events import (
        historical_events,
        incremental_events,
    )

    data = Path(data_dir)

    def events(b: int) -> Any:
        return historical_events(spark, data) if b == 1 else incremental_events(spark, data, b)

    def dims(b: int) -> Dimensions:
        return read_dimensions(spark, data, url, schema, current=b > 1, as_of=b)

    target = events(batch)
    state: pa.Table | None = None
    for earlier in range(1, batch):
        replay = events(earlier).events.where(F.col("t_id").isin(target.trade_ids))
        rows, _ = _apply(spark, replay, state, dims(earlier), earlier, alerts_too=False)
        state = _overlay(state, rows)
    rows, messages = _apply(spark, target.events, state, dims(batch), batch, alerts_too=True)
    assert messages is not None
    return Rebuilt(rows, messages, state.num_rows if state is not None else 0)


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
