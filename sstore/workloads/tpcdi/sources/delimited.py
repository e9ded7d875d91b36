"""Delimited files (``|`` or ``,``): a clean file goes through pyarrow.csv and one cast per
column; a file with any problem is read again line by line to name every bad line."""

from __future__ import annotations

from os import PathLike
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from sstore.workloads.tpcdi.sources.convert import (
    any_refused,
    batch_of,
    refusal_reasons,
    reject_table,
    split_lines,
    typed_columns,
)
from sstore.workloads.tpcdi.sources.layouts import (
    ACCOUNT,
    AUDIT,
    BATCH_DATE,
    CASH_TRANSACTION,
    CASH_TRANSACTION_CDC,
    CUSTOMER,
    DAILY_MARKET,
    DAILY_MARKET_CDC,
    DATE_FILE,
    HOLDING_HISTORY,
    HOLDING_HISTORY_CDC,
    HR,
    INDUSTRY,
    REJECT_SCHEMA,
    STATUS_TYPE,
    TAX_RATE,
    TEXT,
    TIME_FILE,
    TRADE,
    TRADE_CDC,
    TRADE_HISTORY,
    TRADE_TYPE,
    WATCH_HISTORY,
    WATCH_HISTORY_CDC,
    Layout,
    SourceRead,
)


def _read_fast(data: bytes, layout: Layout) -> pa.Table | None:
    """The whole file through pyarrow.csv; None when any line needs a closer look."""
    names = [c.name for c in layout.cols]
    invalid: list[object] = []

    def on_invalid(row: object) -> str:
        invalid.append(row)
        return "skip"

    try:
        raw = pacsv.read_csv(
            pa.py_buffer(data),
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=int(layout.header)),
            parse_options=pacsv.ParseOptions(delimiter=layout.delimiter, quote_char=False,
                                             escape_char=False, invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(column_types={n: TEXT for n in names},
                                                 null_values=[""], strings_can_be_null=True))
    except pa.ArrowInvalid:
        return None
    if invalid:
        return None
    table, _, masks = typed_columns([c.combine_chunks() for c in raw.columns], layout.cols,
                             layout.bools, nulls_done=True)
    return None if pc.any(any_refused(masks, raw.num_rows)).as_py() else table


def _read_lines(data: bytes, layout: Layout, source: str, batch: int | None) -> SourceRead:
    """Line by line: the same conversion, and every refused line with its number."""
    numbers, texts, rejected = split_lines(data)
    if layout.header and len(numbers) and numbers[0].as_py() == 1:
        numbers, texts = numbers.slice(1), texts.slice(1)
    n = len(layout.cols)
    parts = pc.split_pattern(texts, pattern=layout.delimiter)
    counts = pc.list_value_length(parts)
    wrong = pc.not_equal(counts, n)
    for i in pc.indices_nonzero(wrong).to_pylist():
        rejected.append((numbers[i].as_py(), texts[i].as_py(),
                         f"expected {n} fields, found {counts[i].as_py()}"))
    keep = pc.indices_nonzero(pc.invert(wrong))
    parts = parts.take(keep)
    table, clean, masks = typed_columns([pc.list_element(parts, j) for j in range(n)], layout.cols,
                                 layout.bools)
    bad = any_refused(masks, len(keep))
    bad_rows = pc.indices_nonzero(bad).to_pylist()
    for row, reason in zip(bad_rows, refusal_reasons(bad_rows, clean, masks, layout.cols)):
        line = keep[row].as_py()
        rejected.append((numbers[line].as_py(), texts[line].as_py(), reason))
    return SourceRead(source, table.filter(pc.invert(bad)), reject_table(source, batch, rejected))


def read_delimited(path: str | PathLike[str], layout: Layout, batch_id: int | None = None
                   ) -> SourceRead:
    """Read one delimited file; ``batch_id`` defaults to the ``BatchN`` folder it is in."""
    path = Path(path)
    data = path.read_bytes()
    batch = batch_of(path) if batch_id is None else batch_id
    table = _read_fast(data, layout)
    if table is not None:
        return SourceRead(str(path), table, reject_table(str(path), batch, []))
    return _read_lines(data, layout, str(path), batch)


def read_trade(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    """Batch1/Trade.txt: 14 fields, each trade's last state within Batch1."""
    return read_delimited(path, TRADE, batch_id)


def read_trade_incremental(path: str | PathLike[str], batch_id: int | None = None
                           ) -> SourceRead:
    """Batch2/3 Trade.txt: CDC_FLAG, CDC_DSN and the 14 trade fields, one row per change."""
    return read_delimited(path, TRADE_CDC, batch_id)


def read_trade_history(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    return read_delimited(path, TRADE_HISTORY, batch_id)


def read_status_type(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    return read_delimited(path, STATUS_TYPE, batch_id)


def read_trade_type(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    return read_delimited(path, TRADE_TYPE, batch_id)


def read_date(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    return read_delimited(path, DATE_FILE, batch_id)


def read_time(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    return read_delimited(path, TIME_FILE, batch_id)


def read_hr(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    """HR.csv, all employees; DimBroker keeps those with EmployeeJobCode 314."""
    return read_delimited(path, HR, batch_id)


def read_industry(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    return read_delimited(path, INDUSTRY, batch_id)


def read_tax_rate(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    return read_delimited(path, TAX_RATE, batch_id)


def read_customer(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    """Customer.txt (Batch2+), 33 fields. C_TIER stays text: DimCustomer reports invalid
    tiers in an alert that quotes the raw value."""
    return read_delimited(path, CUSTOMER, batch_id)


def read_account(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    return read_delimited(path, ACCOUNT, batch_id)


def read_batch_date(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    return read_delimited(path, BATCH_DATE, batch_id)


def _by_batch(path: str | PathLike[str], batch_id: int | None, historical: Layout,
              incremental: Layout) -> SourceRead:
    """Batch1's file has the plain fields, a later batch's the CDC fields first: the batch
    (given, or the ``BatchN`` folder) picks the layout; no batch at all means Batch1's."""
    batch = batch_of(Path(path)) if batch_id is None else batch_id
    return read_delimited(path, incremental if (batch or 1) > 1 else historical, batch)


def read_cash_transaction(path: str | PathLike[str], batch_id: int | None = None
                          ) -> SourceRead:
    """CashTransaction.txt (FactCashBalances' source; DimTrade does not need it)."""
    return _by_batch(path, batch_id, CASH_TRANSACTION, CASH_TRANSACTION_CDC)


def read_daily_market(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    """DailyMarket.txt (FactMarketHistory's source)."""
    return _by_batch(path, batch_id, DAILY_MARKET, DAILY_MARKET_CDC)


def read_holding_history(path: str | PathLike[str], batch_id: int | None = None
                         ) -> SourceRead:
    """HoldingHistory.txt (FactHoldings' source)."""
    return _by_batch(path, batch_id, HOLDING_HISTORY, HOLDING_HISTORY_CDC)


def read_watch_history(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    """WatchHistory.txt (FactWatches' source)."""
    return _by_batch(path, batch_id, WATCH_HISTORY, WATCH_HISTORY_CDC)


def read_audit(data_dir: str | PathLike[str]) -> SourceRead:
    """Every audit CSV of a DIGen output tree (``BatchN_audit.csv`` and ``BatchN/*_audit.csv``)
    as one table; the header line of each file is skipped."""
    root = Path(data_dir)
    files = sorted(root.glob("*_audit.csv")) + sorted(root.glob("Batch*/*_audit.csv"))
    reads = [read_delimited(f, AUDIT) for f in files]
    empty = pa.schema([pa.field(c.name, c.type) for c in AUDIT.cols])
    return SourceRead(str(root), pa.concat_tables([r.table for r in reads]) if reads
                      else empty.empty_table(),
                      pa.concat_tables([r.rejects for r in reads] + [REJECT_SCHEMA.empty_table()]))
