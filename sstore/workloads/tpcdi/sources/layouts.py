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
_FORMATS = {DATE: "date YYYY-MM-DD", TS: "timestamp YYYY-MM-DD HH:MM:SS", TIME: "time HH:MM:SS"}
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
        return self.table.num_rows + self.rejects.num_rows + self.skipped


def _c(spec: str, type_: pa.DataType = TEXT, fmt: str | None = None) -> Col:
    """``"t_id!"`` is a required field, ``"t_exec_name"`` an optional one."""
    return Col(spec.rstrip("!"), type_, spec.endswith("!"), fmt)


_TRADE = (_c("t_id!", INT), _c("t_dts!", TS), _c("t_st_id!"), _c("t_tt_id!"),
          _c("t_is_cash!", BOOL), _c("t_s_symb!"), _c("t_qty!", I32),
          _c("t_bid_price!", PRICE), _c("t_ca_id!", INT), _c("t_exec_name"),
          _c("t_trade_price", PRICE), _c("t_chrg", MONEY), _c("t_comm", MONEY), _c("t_tax", MONEY))
_CDC = (_c("cdc_flag!"), _c("cdc_dsn!", INT))
_PHONES = tuple(_c(f"c_{part}_{n}") for n in (1, 2, 3) for part in ("ctry", "area", "local", "ext"))
_CUSTOMER = (_c("c_id!", INT), _c("c_tax_id"), _c("c_st_id"), _c("c_l_name"), _c("c_f_name"),
             _c("c_m_name"), _c("c_gndr"), _c("c_tier"), _c("c_dob", DATE), _c("c_adline1"),
             _c("c_adline2"), _c("c_zipcode"), _c("c_city"), _c("c_state_prov"), _c("c_ctry"),
             *_PHONES, _c("c_email_1"), _c("c_email_2"), _c("c_lcl_tx_id"), _c("c_nat_tx_id"))

TRADE = Layout("Trade.txt (Batch1)", _TRADE)
TRADE_CDC = Layout("Trade.txt (incremental)", _CDC + _TRADE)
TRADE_HISTORY = Layout("TradeHistory.txt", (_c("th_t_id!", INT), _c("th_dts!", TS),
                                            _c("th_st_id!")))
STATUS_TYPE = Layout("StatusType.txt", (_c("st_id!"), _c("st_name!")))
TRADE_TYPE = Layout("TradeType.txt", (_c("tt_id!"), _c("tt_name!"), _c("tt_is_sell!", BOOL),
                                      _c("tt_is_mrkt!", BOOL)))
DATE_FILE = Layout("Date.txt", (
    _c("sk_dateid!", INT), _c("datevalue!", DATE), _c("datedesc"), _c("calendaryearid", I32),
    _c("calendaryeardesc"), _c("calendarqtrid", I32), _c("calendarqtrdesc"),
    _c("calendarmonthid", I32), _c("calendarmonthdesc"), _c("calendarweekid", I32),
    _c("calendarweekdesc"), _c("dayofweeknum", I32), _c("dayofweekdesc"), _c("fiscalyearid", I32),
    _c("fiscalyeardesc"), _c("fiscalqtrid", I32), _c("fiscalqtrdesc"), _c("holidayflag", BOOL)),
    bools=("true", "false"))
TIME_FILE = Layout("Time.txt", (
    _c("sk_timeid!", INT), _c("timevalue!", TIME), _c("hourid", I32), _c("hourdesc"),
    _c("minuteid", I32), _c("minutedesc"), _c("secondid", I32), _c("seconddesc"),
    _c("markethoursflag", BOOL), _c("officehoursflag", BOOL)), bools=("true", "false"))
HR = Layout("HR.csv", (
    _c("employeeid!", INT), _c("managerid", INT), _c("employeefirstname"),
    _c("employeelastname"), _c("employeemi"), _c("employeejobcode", I32), _c("employeebranch"),
    _c("employeeoffice"), _c("employeephone")), delimiter=",")
INDUSTRY = Layout("Industry.txt", (_c("in_id!"), _c("in_name!"), _c("in_sc_id!")))
TAX_RATE = Layout("TaxRate.txt", (_c("tx_id!"), _c("tx_name!"), _c("tx_rate!", RATE)))
CUSTOMER = Layout("Customer.txt", _CDC + _CUSTOMER)
ACCOUNT = Layout("Account.txt", _CDC + (
    _c("ca_id!", INT), _c("ca_b_id", INT), _c("ca_c_id", INT), _c("ca_name"),
    _c("ca_tax_st", I32), _c("ca_st_id")))
BATCH_DATE = Layout("BatchDate.txt", (_c("batchdate!", DATE),))
AUDIT = Layout("audit CSV", (_c("dataset!"), _c("batchid!", I32), _c("date", DATE),
                             _c("attribute!"), _c("value", INT), _c("dvalue", F64)),
               delimiter=",", header=True)
