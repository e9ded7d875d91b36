"""Trade events as text lines in the incremental Trade.txt layout, for the stream's SP1 to parse.

Batch2/3 already are event files (one CDC row per state change). Batch1 is not: Trade.txt holds
each trade's final state and TradeHistory.txt its state times. Batch1 is turned into the same
CDC shape, one line per TradeHistory row in time order (the rules are in docs/tpcdi.md), so that
one parser and one set of procedures handle every batch, and Batch1 streams the way the trades
happened.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from sstore.base.duck import connect, registered
from sstore.workloads.tpcdi.sources import REJECT_SCHEMA, read_trade, read_trade_history

LINE_SCHEMA = pa.schema([("line", pa.string()), ("line_no", pa.int64()),
                         ("source", pa.string()), ("tpcdi_batch", pa.int32())])

# One line per TradeHistory row; insert = the trade's first state. Amounts only on CMPT.
BATCH1_EVENTS_SQL = """
SELECT concat_ws('|',
           CASE WHEN h.th_st_id = 'PNDG' OR (h.th_st_id = 'SBMT' AND t.t_tt_id IN ('TMB', 'TMS'))
                THEN 'I' ELSE 'U' END,
           row_number() OVER w,
           t.t_id, strftime(h.th_dts, '%Y-%m-%d %H:%M:%S'), h.th_st_id, t.t_tt_id,
           CASE WHEN t.t_is_cash THEN '1' ELSE '0' END, t.t_s_symb, t.t_qty,
           t.t_bid_price::VARCHAR, t.t_ca_id, coalesce(t.t_exec_name, ''),
           CASE WHEN h.th_st_id = 'CMPT' THEN coalesce(t.t_trade_price::VARCHAR, '') ELSE '' END,
           CASE WHEN h.th_st_id = 'CMPT' THEN coalesce(t.t_chrg::VARCHAR, '') ELSE '' END,
           CASE WHEN h.th_st_id = 'CMPT' THEN coalesce(t.t_comm::VARCHAR, '') ELSE '' END,
           CASE WHEN h.th_st_id = 'CMPT' THEN coalesce(t.t_tax::VARCHAR, '') ELSE '' END
       ) AS line,
       row_number() OVER w AS line_no
FROM history h JOIN trades t ON t.t_id = h.th_t_id
WINDOW w AS (ORDER BY h.th_dts, t.t_id,
             CASE h.th_st_id WHEN 'PNDG' THEN 0 WHEN 'SBMT' THEN 1 WHEN 'CNCL' THEN 2 ELSE 3 END)
ORDER BY line_no
"""


@dataclass(frozen=True)
class BatchEvents:
    """All event lines of one TPC-DI batch, plus what the file readers rejected."""

    tpcdi_batch: int
    lines: pa.Table  # LINE_SCHEMA
    rejects: pa.Table  # sources.REJECT_SCHEMA

    def chunks(self, size: int) -> Iterator[pa.Table]:
        for start in range(0, self.lines.num_rows, size):
            yield self.lines.slice(start, size)


def batch1_events(data_dir: str | Path) -> BatchEvents:
    """Batch1 Trade.txt + TradeHistory.txt as time-ordered CDC lines."""
    folder = Path(data_dir) / "Batch1"
    trades = read_trade(folder / "Trade.txt", 1)
    history = read_trade_history(folder / "TradeHistory.txt", 1)
    con = connect(":memory:")
    try:
        with registered(con, "trades", trades.table), registered(con, "history", history.table):
            lines = con.sql(BATCH1_EVENTS_SQL).to_arrow_table()
    finally:
        con.close()
    source = str(folder / "TradeHistory.txt")
    table = pa.table({
        "line": lines["line"], "line_no": lines["line_no"].cast(pa.int64()),
        "source": pa.array([source] * lines.num_rows, pa.string()),
        "tpcdi_batch": pa.array([1] * lines.num_rows, pa.int32())}, schema=LINE_SCHEMA)
    return BatchEvents(1, table, pa.concat_tables([trades.rejects, history.rejects]))


def incremental_events(data_dir: str | Path, batch: int) -> BatchEvents:
    """BatchN/Trade.txt line by line, as written (the parser handles bad lines)."""
    path = Path(data_dir) / f"Batch{batch}" / "Trade.txt"
    raw = path.read_bytes().decode("utf-8").split("\n")
    if raw and raw[-1] == "":
        raw.pop()
    lines = [line.rstrip("\r") for line in raw]
    table = pa.table({
        "line": pa.array(lines, pa.string()),
        "line_no": pa.array(range(1, len(lines) + 1), pa.int64()),
        "source": pa.array([str(path)] * len(lines), pa.string()),
        "tpcdi_batch": pa.array([batch] * len(lines), pa.int32())}, schema=LINE_SCHEMA)
    return BatchEvents(batch, table, REJECT_SCHEMA.empty_table())
