"""DimTrade and DImessages in PySpark: the ``--mode spark`` pipeline's trade part.

``load_historical`` loads Batch1 (Trade.txt + TradeHistory.txt), ``apply_batch`` an incremental
batch (Batch2/3 CDC Trade.txt), both by the rules of docs/tpcdi.md, which the streaming pipeline
implements too: the two must produce identical ``dimtrade`` and ``dimessages`` tables. The
dimensions are read from the warehouse (JDBC), so they must be built first: for Batch1 the
historical dimensions, for Batch N the dimension changes of Batch N.

Steps (modules): source files -> trade events (``dimtrade_spark_events``, using the shared
readers of ``sources``) -> the rules, set-oriented (``dimtrade_spark_rules``) -> PostgreSQL.

Exactly once. A batch is written in one PostgreSQL transaction: the DimTrade rows (Batch1: binary
COPY; Batch2/3: COPY into a stage table, then INSERT ... ON CONFLICT (tradeid) DO UPDATE), the
DImessages alerts, the rejects, and the watermark row (``sstore.watermarks``, source
``tpcdi DimTrade (spark)``, target ``<schema>.dimtrade``, batch_id = last batch applied). The
watermark row is locked and checked inside that transaction, so a batch that is already applied
changes nothing (the report says ``skipped``), and batches must come in order (1, 2, 3).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from sstore.base.extras import needs

with needs("spark"):
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

from migrators import delivery, watermarks
from migrators.errors import TargetBehind
from migrators.postgres import Session, copy_arrow, merge_rows
from migrators.spark import postgres_to_dataframe
from sstore.base.errors import TerminalError
from sstore.base.sql import ident, one_value
from sstore.workloads.tpcdi import sources
from sstore.workloads.tpcdi.dimtrade_spark_events import (
    BatchEvents,
    empty_rows,
    historical_events,
    incremental_events,
)
from sstore.workloads.tpcdi.dimtrade_spark_rules import (
    DIMESSAGES,
    DIMTRADE,
    Dimensions,
    alerts,
    dimtrade_rows,
    evaluate,
)

WATERMARK_SOURCE = "tpcdi DimTrade (spark)"
#: The watermark's stream: TPC-DI batch numbers, applied one after another.
WATERMARK_STREAM = "dimtrade batches"


class DimTradeLoadError(TerminalError):
    """A batch cannot be applied: out of order, or the dimensions are not built."""


@dataclass(frozen=True)
class TradeLoadReport:
    """What one batch did. ``rows_in`` counts events (Batch1: TradeHistory.txt lines; Batch2/3:
    Trade.txt lines) and ``rows_in == rows_loaded + rows_rejected``. ``other_rejects``: reject
    rows that are not events (Batch1 Trade.txt lines: refused by the reader, duplicate T_ID, no
    TradeHistory row; the events of such a trade are rejected too). ``skipped``: the batch was
    already applied, nothing changed."""

    batch_id: int
    rows_in: int
    rows_loaded: int
    rows_rejected: int
    alerts: int
    seconds: float
    trades_inserted: int = 0
    trades_updated: int = 0
    other_rejects: int = 0
    skipped: bool = False


def load_historical(spark: SparkSession, data_dir: str | PathLike[str], url: str,
                    schema: str = "tpcdi") -> TradeLoadReport:
    """Batch1 into an empty ``<schema>.dimtrade``; lookups take the dimension versions valid on
    each trade's create date."""
    return _run(spark, Path(data_dir), url, schema, 1)


def apply_batch(spark: SparkSession, data_dir: str | PathLike[str], url: str, schema: str,
                batch_id: int) -> TradeLoadReport:
    """Batch ``batch_id`` (2 or more) of CDC Trade.txt; lookups take the current dimension
    versions, so run it after that batch's dimension changes."""
    if batch_id < 2:
        raise ValueError(f"incremental batches start at 2 (Batch1 is load_historical), "
                         f"got {batch_id}")
    return _run(spark, Path(data_dir), url, schema, batch_id)


def _run(spark: SparkSession, data_dir: Path, url: str, schema: str, batch_id: int
         ) -> TradeLoadReport:
    started = time.perf_counter()
    target = f"{schema}.dimtrade"
    skipped = TradeLoadReport(batch_id, 0, 0, 0, 0, 0.0, skipped=True)
    session = Session(url)
    try:
        done = session.run(lambda con: _prepare(con, schema, target), "read DimTrade watermark")
        if done >= batch_id:
            return replace(skipped, seconds=time.perf_counter() - started)
        if done != batch_id - 1:
            raise DimTradeLoadError(f"{target}: batch {batch_id} cannot be applied before "
                                    f"batch {done + 1} (last applied: {done})")
        events = (historical_events(spark, data_dir) if batch_id == 1
                  else incremental_events(spark, data_dir, batch_id))
        dims = read_dimensions(spark, data_dir, url, schema, current=batch_id > 1)
        out = _compute(spark, events, dims, url, schema)
        if not session.run(lambda con: _write(con, schema, target, batch_id, out),
                           f"write DimTrade batch {batch_id}"):
            return replace(skipped, seconds=time.perf_counter() - started)
    finally:
        session.close()
    inserted = int(pc.sum(pc.invert(out.rows["existed"])).as_py() or 0)
    read_rejects = events.event_source_rejects   # event lines the reader refused
    return TradeLoadReport(
        batch_id, events.count + read_rejects, out.applied,
        events.count - out.applied + read_rejects, out.alerts.num_rows,
        time.perf_counter() - started, inserted, out.rows.num_rows - inserted, out.other_rejects)


@dataclass(frozen=True)
class _Output:
    """A batch's results on the driver, ready for PostgreSQL."""

    rows: pa.Table       # DimTrade rows (+ ``existed``)
    alerts: pa.Table     # DImessages rows
    rejects: pa.Table    # sources.REJECT_SCHEMA
    applied: int         # events applied
    other_rejects: int


def _key(target: str) -> delivery.SinkKey:
    return delivery.SinkKey(WATERMARK_SOURCE, WATERMARK_STREAM, target)


def _prepare(con: psycopg.Connection, schema: str, target: str) -> int:
    """The last batch applied (0: none, also when DimTrade was recreated since); refuses to
    start without dimension rows."""
    watermarks.ensure_watermarks(con)
    watermark = delivery.claim(con, _key(target))
    s = ident(schema)
    empty = [f"{schema}.{t}" for t in ("dimsecurity", "dimaccount") if not one_value(
        con.execute(f"SELECT EXISTS (SELECT 1 FROM {s}.{ident(t)})").fetchone())]
    con.commit()
    if empty:
        raise DimTradeLoadError(f"no rows in {' and '.join(empty)}: build the dimensions "
                                f"before DimTrade")
    return watermark.batch_id


def _names(table: pa.Table, code: str, name: str) -> dict[str, str]:
    return dict(zip(table[code].to_pylist(), table[name].to_pylist(), strict=True))


def read_dimensions(spark: SparkSession, data_dir: Path, url: str, schema: str, current: bool,
                    as_of: int | None = None) -> Dimensions:
    """What the DimTrade rules look up: status and type names from Batch1's reference files
    under ``data_dir``; DimSecurity and DimAccount of the warehouse ``schema`` as lazy
    DataFrames over JDBC (``current``: only the current versions, as Batch2/3 read them;
    else every version, which Batch1 picks by date). The bulk pipeline reads them once per
    batch; a streaming job that reuses them across micro-batches caches them itself.

    ``as_of`` (a backfill, which may run after later batches changed the dimensions): only
    the versions that batches up to ``as_of`` made; "current" is then the latest of those per
    key (a later batch closes a version by its EndDate and IsCurrent, never its BatchID)."""
    batch1 = data_dir / "Batch1"
    status = sources.read_status_type(batch1 / "StatusType.txt").table
    types = sources.read_trade_type(batch1 / "TradeType.txt").table
    s, where = ident(schema), " WHERE iscurrent" if current else ""
    if as_of is not None:
        where = f" WHERE batchid <= {int(as_of)}"
    securities = postgres_to_dataframe(url, spark=spark, query=(
        f"SELECT symbol, sk_securityid, sk_companyid, effectivedate, enddate "
        f"FROM {s}.dimsecurity{where}"))
    accounts = postgres_to_dataframe(url, spark=spark, query=(
        f"SELECT accountid, sk_accountid, sk_customerid, sk_brokerid, effectivedate, enddate "
        f"FROM {s}.dimaccount{where}"))
    return Dimensions(_names(status, "st_id", "st_name"), _names(types, "tt_id", "tt_name"),
                      securities, accounts, current)


def _existing(spark: SparkSession, events: BatchEvents, url: str, schema: str
              ) -> DataFrame | None:
    """The DimTrade rows of the batch's trades (a pushed-down IN list: batches are small);
    None for Batch1, which starts from an empty DimTrade."""
    if events.batch_id == 1:
        return None
    if not events.trade_ids:
        return empty_rows(spark, DIMTRADE)
    rows = postgres_to_dataframe(url, table=f"{schema}.dimtrade", spark=spark)
    return rows.where(F.col("tradeid").isin(events.trade_ids)).select(*DIMTRADE.names)


def _compute(spark: SparkSession, events: BatchEvents, dims: Dimensions, url: str,
             schema: str) -> _Output:
    """Run the rules; bring the DimTrade rows, alerts and refused events to the driver as
    Arrow: three Spark actions over the cached evaluation (cache, not localCheckpoint: the
    cache is released here, checkpoint blocks only when the JVM collects the plan)."""
    existing = _existing(spark, events, url, schema)
    if existing is not None:
        existing = existing.cache()
    evaluated = evaluate(events.events, existing, dims).cache()
    try:
        rows = dimtrade_rows(evaluated, existing, events.batch_id).toArrow()
        messages = alerts(evaluated, events.batch_id).toArrow()
        refused = evaluated.where(~F.col("applied")).select("eid", "reason").orderBy("eid") \
            .toArrow()
    finally:
        evaluated.unpersist()
        if existing is not None:
            existing.unpersist()
    if refused["reason"].null_count:
        raise AssertionError(f"{refused['reason'].null_count} events neither applied nor "
                             f"rejected")
    rejects = [events.source_rejects, _rejects(events, events.event_file,
                                               refused["eid"].to_pylist(),
                                               refused["reason"].to_pylist())]
    extra = events.extra if events.extra is not None else pa.table({"line_number": [],
                                                                    "reason": []})
    if extra.num_rows:
        rejects.append(_rejects(events, str(events.extra_file),
                                extra["line_number"].to_pylist(), extra["reason"].to_pylist()))
    table = pa.concat_tables(rejects).sort_by([("source_file", "ascending"),
                                               ("line_number", "ascending")])
    other = events.source_rejects.num_rows - events.event_source_rejects + extra.num_rows
    return _Output(rows, messages.select(DIMESSAGES.names).cast(DIMESSAGES), table,
                   events.count - refused.num_rows, other)


def _rejects(events: BatchEvents, path: str, lines: list[int], reasons: list[str]) -> pa.Table:
    return pa.table([[path] * len(lines), [events.batch_id] * len(lines), lines,
                     [events.lines.raw(path, n) for n in lines], reasons],
                    schema=sources.REJECT_SCHEMA)


def _write(con: psycopg.Connection, schema: str, target: str, batch_id: int, out: _Output
           ) -> bool:
    """One delivery (``migrators.delivery``): lock the watermark, write rows, alerts,
    rejects, advance it, commit. False (and nothing written) if another run applied the batch
    meanwhile."""
    rows = out.rows.select(DIMTRADE.names).cast(DIMTRADE)

    def write(cur: psycopg.Cursor, _watermark: int) -> int:
        if batch_id == 1:
            copy_arrow(cur, target, rows)
        else:
            merge_rows(cur, target, rows, ["tradeid"])
        copy_arrow(cur, f"{schema}.dimessages", out.alerts)
        copy_arrow(cur, f"{schema}.rejects", out.rejects)
        return int(rows.num_rows)

    try:
        done = delivery.deliver(con, _key(target), batch_id, batch_id, write, after=batch_id - 1)
    except TargetBehind as behind:
        raise DimTradeLoadError(f"{target}: batch {batch_id} cannot be applied before batch "
                                f"{behind.watermark.batch_id + 1} (last applied: "
                                f"{behind.watermark.batch_id})") from behind
    return not done.skipped
