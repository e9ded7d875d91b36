"""The source files' layouts: each field's name, type and whether a row needs it.

Names are the specification's, lower-case; a ``!`` in a spec marks a required field. One
``Layout`` per delimited file; FINWIRE's fixed-width records and CustomerMgmt.xml's items are
declared beside their readers with the same ``Col``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

TEXT, INT, I32, F64 = pa.string(), pa.int64(), pa.int32(), pa.float64()
DATE, TS, TIME, BOOL = pa.date32(), pa.timestamp("s"), pa.time32("s"), pa.bool_()
PRICE, MONEY, RATE = pa.decimal128(8, 2), pa.decimal128(10, 2), pa.decimal128(6, 5)
#: How a date, timestamp or time must be written (named in refusal reasons).
FORMATS = {DATE: "date YYYY-MM-DD", TS: "timestamp YYYY-MM-DD HH:MM:SS", TIME: "time HH:MM:SS"}
REJECT_SCHEMA = pa.schema([("source_file", TEXT), ("batch_id", I32), ("line_number", INT),
                           ("raw_line", TEXT), ("reason", TEXT)])
FINWIRE_NAME = re.compile(r"FINWIRE\d{4}Q[1-4]")


@dataclass(frozen=True)
class Col:
    """One source field: output name (the source's name, lower-case), type, whether a row
    without it is refused, and the strptime format when the file does not use the usual one."""

    name: str
    type: pa.DataType = TEXT
    required: bool = False
    fmt: str | None = None


@dataclass(frozen=True)
class Layout:
    """A delimited file: its fields in order, delimiter, boolean tokens, header line or not."""

    name: str
    cols: tuple[Col, ...]
    delimiter: str = "|"
    bools: tuple[str, str] = ("1", "0")
    header: bool = False


@dataclass(frozen=True)
class SourceRead:
    """What one read produced. ``skipped`` counts records left out on purpose (FIN)."""

    source: str
    table: pa.Table
    rejects: pa.Table
    skipped: int = 0

    @property
    def rows_in(self) -> int:
        return int(self.table.num_rows + self.rejects.num_rows + self.skipped)


def col(spec: str, type_: pa.DataType = TEXT, fmt: str | None = None) -> Col:
    """A field from its spec: ``"t_id!"`` is a required field, ``"t_exec_name"`` an optional
    one. The layouts here, FINWIRE's and CustomerMgmt.xml's are written with it."""
    return Col(spec.rstrip("!"), type_, spec.endswith("!"), fmt)


_TRADE = (col("t_id!", INT), col("t_dts!", TS), col("t_st_id!"), col("t_tt_id!"),
          col("t_is_cash!", BOOL), col("t_s_symb!"), col("t_qty!", I32),
          col("t_bid_price!", PRICE), col("t_ca_id!", INT), col("t_exec_name"),
          col("t_trade_price", PRICE), col("t_chrg", MONEY), col("t_comm", MONEY),
          col("t_tax", MONEY))
_CDC = (col("cdc_flag!"), col("cdc_dsn!", INT))
_PHONES = tuple(col(f"c_{part}_{n}") for n in (1, 2, 3)
                for part in ("ctry", "area", "local", "ext"))
#: Customer.txt's fields after the CDC ones (CustomerMgmt.xml's reader takes them too).
CUSTOMER_FIELDS = (
    col("c_id!", INT), col("c_tax_id"), col("c_st_id"), col("c_l_name"), col("c_f_name"),
    col("c_m_name"), col("c_gndr"), col("c_tier"), col("c_dob", DATE), col("c_adline1"),
    col("c_adline2"), col("c_zipcode"), col("c_city"), col("c_state_prov"), col("c_ctry"),
    *_PHONES, col("c_email_1"), col("c_email_2"), col("c_lcl_tx_id"), col("c_nat_tx_id"))

TRADE = Layout("Trade.txt (Batch1)", _TRADE)
TRADE_CDC = Layout("Trade.txt (incremental)", _CDC + _TRADE)
TRADE_HISTORY = Layout("TradeHistory.txt", (col("th_t_id!", INT), col("th_dts!", TS),
                                            col("th_st_id!")))
STATUS_TYPE = Layout("StatusType.txt", (col("st_id!"), col("st_name!")))
TRADE_TYPE = Layout("TradeType.txt", (col("tt_id!"), col("tt_name!"), col("tt_is_sell!", BOOL),
                                      col("tt_is_mrkt!", BOOL)))
DATE_FILE = Layout("Date.txt", (
    col("sk_dateid!", INT), col("datevalue!", DATE), col("datedesc"), col("calendaryearid", I32),
    col("calendaryeardesc"), col("calendarqtrid", I32), col("calendarqtrdesc"),
    col("calendarmonthid", I32), col("calendarmonthdesc"), col("calendarweekid", I32),
    col("calendarweekdesc"), col("dayofweeknum", I32), col("dayofweekdesc"),
    col("fiscalyearid", I32), col("fiscalyeardesc"), col("fiscalqtrid", I32),
    col("fiscalqtrdesc"), col("holidayflag", BOOL)),
    bools=("true", "false"))
TIME_FILE = Layout("Time.txt", (
    col("sk_timeid!", INT), col("timevalue!", TIME), col("hourid", I32), col("hourdesc"),
    col("minuteid", I32), col("minutedesc"), col("secondid", I32), col("seconddesc"),
    col("markethoursflag", BOOL), col("officehoursflag", BOOL)), bools=("true", "false"))
HR = Layout("HR.csv", (
    col("employeeid!", INT), col("managerid", INT), col("employeefirstname"),
    col("employeelastname"), col("employeemi"), col("employeejobcode", I32), col("employeebranch"),
    col("employeeoffice"), col("employeephone")), delimiter=",")
INDUSTRY = Layout("Industry.txt", (col("in_id!"), col("in_name!"), col("in_sc_id!")))
TAX_RATE = Layout("TaxRate.txt", (col("tx_id!"), col("tx_name!"), col("tx_rate!", RATE)))
CUSTOMER = Layout("Customer.txt", _CDC + CUSTOMER_FIELDS)
ACCOUNT = Layout("Account.txt", _CDC + (
    col("ca_id!", INT), col("ca_b_id", INT), col("ca_c_id", INT), col("ca_name"),
    col("ca_tax_st", I32), col("ca_st_id")))
BATCH_DATE = Layout("BatchDate.txt", (col("batchdate!", DATE),))
# The fact sources DimTrade does not use, read so that a whole DIGen tree can be checked:
# Batch1's files have the fields below, Batch2/3's the CDC fields first.
_CASH = (col("ct_ca_id!", INT), col("ct_dts!", TS), col("ct_amt!", MONEY), col("ct_name"))
_MARKET = (col("dm_date!", DATE), col("dm_s_symb!"), col("dm_close!", PRICE),
           col("dm_high!", PRICE), col("dm_low!", PRICE), col("dm_vol!", INT))
_HOLDING = (col("hh_h_t_id!", INT), col("hh_t_id!", INT), col("hh_before_qty!", I32),
            col("hh_after_qty!", I32))
_WATCH = (col("w_c_id!", INT), col("w_s_symb!"), col("w_dts!", TS), col("w_action!"))
CASH_TRANSACTION = Layout("CashTransaction.txt", _CASH)
CASH_TRANSACTION_CDC = Layout("CashTransaction.txt (incremental)", _CDC + _CASH)
DAILY_MARKET = Layout("DailyMarket.txt", _MARKET)
DAILY_MARKET_CDC = Layout("DailyMarket.txt (incremental)", _CDC + _MARKET)
HOLDING_HISTORY = Layout("HoldingHistory.txt", _HOLDING)
HOLDING_HISTORY_CDC = Layout("HoldingHistory.txt (incremental)", _CDC + _HOLDING)
WATCH_HISTORY = Layout("WatchHistory.txt", _WATCH)
WATCH_HISTORY_CDC = Layout("WatchHistory.txt (incremental)", _CDC + _WATCH)
AUDIT = Layout("audit CSV", (col("dataset!"), col("batchid!", I32), col("date", DATE),
                             col("attribute!"), col("value", INT), col("dvalue", F64)),
               delimiter=",", header=True)
