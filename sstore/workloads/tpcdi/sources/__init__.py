"""Readers for the TPC-DI source files that DimTrade and the dimensions it looks up need.

Each reader returns typed Arrow columns and the lines it refused, with the reason: a line with
the wrong number of fields, an unparsable number or date, or a missing key goes to ``rejects``
(source file, batch, line number, raw line, reason). A bad line never stops the read and is
never dropped silently, so for every file ``rows_in = rows_out + rejects`` (plus FINWIRE's FIN
records, which are counted and skipped on purpose).

One rule set for every file, applied per value, so that a value's fate never depends on its
neighbours: every field is trimmed and an empty field is NULL; numbers, ISO dates and
timestamps are what Arrow's cast accepts (a decimal with more digits than its column, or
``2017-02-30``, is refused), integers are digits with an optional minus (no ``0x10``); FINWIRE's
``yyyymmdd`` dates must read back unchanged; booleans are the file's two tokens. Clean
delimited files go through ``pyarrow.csv`` (multi-threaded) and one cast per column; only a
file with a problem is split again line by line, to name the bad lines. Files come from TPC's
DIGen or from our generator: CRLF or LF line ends, space-padded fixed-width fields, audit CSVs
beside the data (never taken for data).
"""

from sstore.workloads.tpcdi.sources.convert import split_lines
from sstore.workloads.tpcdi.sources.customer_mgmt import (
    CUSTOMER_MGMT_COLS,
    read_customer_mgmt,
)
from sstore.workloads.tpcdi.sources.delimited import (
    read_account,
    read_audit,
    read_batch_date,
    read_cash_transaction,
    read_customer,
    read_daily_market,
    read_date,
    read_delimited,
    read_holding_history,
    read_hr,
    read_industry,
    read_status_type,
    read_tax_rate,
    read_time,
    read_trade,
    read_trade_history,
    read_trade_incremental,
    read_trade_type,
    read_watch_history,
)
from sstore.workloads.tpcdi.sources.finwire import (
    CMP_FIELDS,
    SEC_FIELDS,
    FinwireNameError,
    FinwireRead,
    finwire_files,
    read_finwire,
)
from sstore.workloads.tpcdi.sources.layouts import (
    ACCOUNT,
    AUDIT,
    BATCH_DATE,
    BOOL,
    CASH_TRANSACTION,
    CASH_TRANSACTION_CDC,
    CUSTOMER,
    DAILY_MARKET,
    DAILY_MARKET_CDC,
    DATE,
    DATE_FILE,
    F64,
    FINWIRE_NAME,
    HOLDING_HISTORY,
    HOLDING_HISTORY_CDC,
    HR,
    I32,
    INDUSTRY,
    INT,
    MONEY,
    PRICE,
    RATE,
    REJECT_SCHEMA,
    STATUS_TYPE,
    TAX_RATE,
    TEXT,
    TIME,
    TIME_FILE,
    TRADE,
    TRADE_CDC,
    TRADE_HISTORY,
    TRADE_TYPE,
    TS,
    WATCH_HISTORY,
    WATCH_HISTORY_CDC,
    Col,
    Layout,
    SourceRead,
)

__all__ = [
    "ACCOUNT", "AUDIT", "BATCH_DATE", "BOOL", "CASH_TRANSACTION", "CASH_TRANSACTION_CDC",
    "CMP_FIELDS", "CUSTOMER", "CUSTOMER_MGMT_COLS", "DAILY_MARKET", "DAILY_MARKET_CDC",
    "DATE", "DATE_FILE", "F64", "FINWIRE_NAME", "HOLDING_HISTORY", "HOLDING_HISTORY_CDC",
    "HR", "I32", "INDUSTRY", "INT", "MONEY", "PRICE",
    "RATE", "REJECT_SCHEMA", "SEC_FIELDS", "STATUS_TYPE", "TAX_RATE", "TEXT", "TIME",
    "TIME_FILE", "TRADE", "TRADE_CDC", "TRADE_HISTORY", "TRADE_TYPE", "TS", "WATCH_HISTORY",
    "WATCH_HISTORY_CDC", "Col",
    "FinwireNameError", "FinwireRead", "Layout", "SourceRead", "finwire_files", "read_account",
    "read_audit", "read_batch_date", "read_cash_transaction", "read_customer",
    "read_customer_mgmt", "read_daily_market", "read_date", "read_delimited", "read_finwire",
    "read_holding_history", "read_hr", "read_industry", "read_status_type",
    "read_tax_rate", "read_time", "read_trade", "read_trade_history", "read_trade_incremental",
    "read_trade_type", "read_watch_history", "split_lines",
]
