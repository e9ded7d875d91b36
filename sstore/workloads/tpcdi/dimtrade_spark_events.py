"""Trade events for the Spark DimTrade pipeline: source files -> one Spark DataFrame per batch.

docs/tpcdi.md ("DimTrade rules") defines an event as one state of one trade. Here each event is
a row with the trade fields (``t_id``, ``t_dts``, ``t_st_id`` ... ``t_tax``), its CDC flag
(``I``/``U``), ``k`` (its position among the events of its trade, in the batch's event order),
``eid`` (the source line it came from, unique within a batch) and ``reason`` (why it is refused
before any rule runs, else NULL):

- Batch1: one event per ``TradeHistory.txt`` row, with the trade's fields from ``Trade.txt``;
  the amounts only on the CMPT event; ``I`` for PNDG, and for SBMT of a market order (TMB/TMS);
  order (TH_DTS, T_ID, PNDG < SBMT < CNCL < CMPT).
- Batch2/3: one event per ``Trade.txt`` row, in CDC_DSN order.

Files are parsed by ``sources`` (the project's readers: typed Arrow plus the lines they refuse,
with the reason). The refused lines are returned as reject rows; the raw text of any line can
be looked up afterwards (``SourceLines``) to report events the rules refuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from migrators.spark import arrow_to_spark
from sstore.workloads.tpcdi import sources
from sstore.workloads.tpcdi.sources import SourceRead

MARKET_TYPES = ("TMB", "TMS")
STATE_ORDER = ("PNDG", "SBMT", "CNCL", "CMPT")
TRADE_FIELDS = ("t_id", "t_dts", "t_st_id", "t_tt_id", "t_is_cash", "t_s_symb", "t_qty",
                "t_bid_price", "t_ca_id", "t_exec_name", "t_trade_price", "t_chrg", "t_comm",
                "t_tax")
AMOUNTS = ("t_trade_price", "t_chrg", "t_comm", "t_tax")
EVENT_COLUMNS = ("eid", "k", "cdc_flag", *TRADE_FIELDS, "reason")


@dataclass
class SourceLines:
    """Line number -> raw text of the source files of one batch, for reject rows."""

    texts: dict[str, tuple[np.ndarray, pa.Array]] = field(default_factory=dict)

    def add(self, path: Path, data: bytes) -> np.ndarray:
        numbers, texts, _ = sources.split_lines(data)   # the readers' own line splitting
        numbers_np: np.ndarray = numbers.to_numpy()
        self.texts[str(path)] = (numbers_np, texts)
        return numbers_np

    def raw(self, path: str, line: int) -> str | None:
        numbers, texts = self.texts.get(path, (np.zeros(0, np.int64), pa.array([], pa.string())))
        i = int(np.searchsorted(numbers, line))
        return texts[i].as_py() if i < len(numbers) and numbers[i] == line else None


@dataclass
class BatchEvents:
    """The events of one batch, the lines the readers refused, the files' raw lines, and for
    Batch1 the Trade.txt rows that make no trade (``extra``: line_number, reason)."""

    batch_id: int
    events: DataFrame
    event_file: str
    source_rejects: pa.Table
    event_source_rejects: int          # of source_rejects, those of the event file
    lines: SourceLines
    count: int                         # events (rows of the event file that were read)
    trade_ids: list[int]               # the trades the events name
    extra_file: str | None = None      # Batch1: Trade.txt, whose rows may make no event:
    extra: pa.Table | None = None      # their (line_number, reason)


def _numbered(path: Path, read: SourceRead, lines: SourceLines, line_column: str) -> pa.Table:
    """The reader's rows with the line number of each row in ``line_column``.

    The readers keep the order of the file and drop blank and refused lines, so the rows are
    the file's non-blank lines minus the refused ones, in order."""
    numbers = lines.add(path, path.read_bytes())
    refused = read.rejects["line_number"].to_numpy(zero_copy_only=False)
    good = numbers[~np.isin(numbers, refused)]
    if len(good) != read.table.num_rows:
        raise RuntimeError(f"{path}: {read.table.num_rows} rows read but {len(good)} lines "
                           f"left after the {len(refused)} refused ones")
    return read.table.append_column(line_column, pa.array(good, pa.int64()))


def _state_rank(state: Column) -> Column:
    rank = F.lit(len(STATE_ORDER))
    for i, name in reversed(list(enumerate(STATE_ORDER))):
        rank = F.when(state == name, F.lit(i)).otherwise(rank)
    return rank


def _trades_without_events(trades: pa.Table, history: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Trade.txt rows that make no trade: a T_ID's later lines (its first line is the trade)
    and trades without a TradeHistory.txt row. Checked on the driver, where the rows already
    are (cheaper than a Spark job for what is nearly always nothing). Returns the unique
    trades and (line_number, reason) of the others."""
    firsts = trades.group_by("t_id", use_threads=False).aggregate([("tline", "min")])
    dup = pc.invert(pc.is_in(trades["tline"], value_set=firsts["tline_min"]))
    lonely = pc.invert(pc.is_in(trades["t_id"], value_set=history["th_t_id"]))
    refused = pc.or_(dup, lonely)
    extra = trades.filter(refused)
    reasons = [f"duplicate T_ID {t} in Trade.txt (its first line is the trade)" if d else
               f"trade {t} has no TradeHistory.txt row" for t, d in
               zip(extra["t_id"].to_pylist(), dup.filter(refused).to_pylist(), strict=True)]
    return trades.filter(pc.invert(dup)), pa.table({"line_number": extra["tline"],
                                                    "reason": pa.array(reasons, pa.string())})


def historical_events(spark: SparkSession, data_dir: Path) -> BatchEvents:
    """Batch1: TradeHistory.txt rows joined with Trade.txt."""
    trade_path, history_path = data_dir / "Batch1" / "Trade.txt", \
        data_dir / "Batch1" / "TradeHistory.txt"
    trade_read = sources.read_trade(trade_path, batch_id=1)
    history_read = sources.read_trade_history(history_path, batch_id=1)
    lines = SourceLines()
    trades = _numbered(trade_path, trade_read, lines, "tline")
    history = _numbered(history_path, history_read, lines, "eid")
    trades, extra = _trades_without_events(trades, history)
    fixed = arrow_to_spark(spark, trades.drop_columns(["t_dts", "t_st_id", "tline"])) \
        .withColumn("known", F.lit(True))
    joined = arrow_to_spark(spark, history).join(fixed, F.col("th_t_id") == F.col("t_id"), "left")
    completed = F.col("th_st_id") == "CMPT"
    market = F.col("t_tt_id").isin(*MARKET_TYPES)
    first_state = (F.col("th_st_id") == "PNDG") | ((F.col("th_st_id") == "SBMT") & market)
    events = joined.select(
        "eid",
        F.when(first_state, F.lit("I")).otherwise(F.lit("U")).alias("cdc_flag"),
        F.col("th_t_id").alias("t_id"), F.col("th_dts").alias("t_dts"),
        F.col("th_st_id").alias("t_st_id"),
        *[F.col(c) for c in TRADE_FIELDS[3:10]],
        *[F.when(completed, F.col(c)).alias(c) for c in AMOUNTS],
        F.when(F.col("known").isNull(), F.format_string(
            "trade %d has no valid Trade.txt row", F.col("th_t_id"))).alias("reason"))
    order = Window.partitionBy("t_id").orderBy("t_dts", _state_rank(F.col("t_st_id")), "eid")
    events = events.withColumn("k", F.row_number().over(order)).select(*EVENT_COLUMNS)
    rejects = pa.concat_tables([history_read.rejects, trade_read.rejects])
    return BatchEvents(1, events, str(history_path), rejects, history_read.rejects.num_rows,
                       lines, history_read.table.num_rows, [], str(trade_path), extra)


def incremental_events(spark: SparkSession, data_dir: Path, batch_id: int) -> BatchEvents:
    """Batch2/3: Trade.txt rows (CDC) in CDC_DSN order."""
    path = data_dir / f"Batch{batch_id}" / "Trade.txt"
    read = sources.read_trade_incremental(path, batch_id=batch_id)
    lines = SourceLines()
    rows = arrow_to_spark(spark, _numbered(path, read, lines, "eid"))
    order = Window.partitionBy("t_id").orderBy("cdc_dsn", "eid")
    events = (rows.withColumn("k", F.row_number().over(order))
              .withColumn("reason", F.when(~F.col("cdc_flag").isin("I", "U"), F.format_string(
                  "unknown CDC_FLAG '%s'", F.col("cdc_flag"))))
              .select(*EVENT_COLUMNS))
    ids = pc.unique(read.table["t_id"]).to_pylist()
    return BatchEvents(batch_id, events, str(path), read.rejects, read.rejects.num_rows, lines,
                       read.table.num_rows, ids)


def empty_rows(spark: SparkSession, schema: pa.Schema) -> DataFrame:
    return arrow_to_spark(spark, schema.empty_table())

