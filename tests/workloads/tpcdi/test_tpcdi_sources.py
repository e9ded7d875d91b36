"""TPC-DI source readers on small hand-written files in the exact layouts, with CRLF line ends
as TPC's generator writes them: typed values, and every bad line in ``rejects`` with its line
number and reason (rows_in = rows_out + rejects), FINWIRE positions, CustomerMgmt actions with
absent fields, and audit CSVs never read as data."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from sstore.base.errors import TerminalError
from sstore.workloads.tpcdi import sources as src
from sstore.workloads.tpcdi.sources import delimited

TS = dt.datetime


def write(path: Path, *lines: str, end: str = "\r\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("".join(line + end for line in lines).encode())
    return path


def rejects(read: src.SourceRead | src.FinwireRead) -> list[tuple[int, str]]:
    return [(r["line_number"], r["reason"]) for r in read.rejects.to_pylist()]


GOOD_TRADE = ("0|2012-07-07 00:02:08|CMPT|TMB|0|AAAAAAAAAAAADMO|2939|9.57|2|12646|10.02|58.95|"
              "27.31|1611.19")


def test_batch1_trade_typed_values_and_crlf(tmp_path: Path) -> None:
    path = write(tmp_path / "Batch1" / "Trade.txt", GOOD_TRADE,
                 "1|2012-07-07 00:03:00|PNDG|TLB|1|AAAAAAAAAAAAAAB  |10|1.01|3|777||||", "")
    read = src.read_trade(path)
    assert read.rejects.num_rows == 0 and read.rows_in == 2
    first, second = read.table.to_pylist()
    assert first == {"t_id": 0, "t_dts": TS(2012, 7, 7, 0, 2, 8), "t_st_id": "CMPT",
                     "t_tt_id": "TMB", "t_is_cash": False, "t_s_symb": "AAAAAAAAAAAADMO",
                     "t_qty": 2939, "t_bid_price": Decimal("9.57"), "t_ca_id": 2,
                     "t_exec_name": "12646", "t_trade_price": Decimal("10.02"),
                     "t_chrg": Decimal("58.95"), "t_comm": Decimal("27.31"),
                     "t_tax": Decimal("1611.19")}          # no '\r' left on the last field
    assert second["t_s_symb"] == "AAAAAAAAAAAAAAB"           # trimmed
    assert (second["t_is_cash"], second["t_trade_price"], second["t_tax"]) == (True, None, None)
    types = read.table.schema
    assert types.field("t_bid_price").type == pa.decimal128(8, 2)
    assert types.field("t_chrg").type == pa.decimal128(10, 2)
    assert types.field("t_dts").type == pa.timestamp("s") and types.field("t_id").type == pa.int64()


def test_every_kind_of_bad_line_is_rejected_with_number_and_reason(tmp_path: Path) -> None:
    lines = [
        GOOD_TRADE,                                                          # 1
        "1|2012-07-07 00:03:00|PNDG|TLB|1|SYM|10|1.01|3|777|||",             # 2: 13 fields
        "2|2012-07-07 00:03:00|PNDG|TLB|1|SYM|ten|1.01|3|777||||",           # 3: integer
        "3|2012-02-30 00:03:00|PNDG|TLB|1|SYM|10|1.01|3|777||||",            # 4: no such day
        "4|2012-07-07 00:03:00|PNDG|TLB|1|SYM|10|1.015|3|777||||",           # 5: 3 decimals
        "|2012-07-07 00:03:00|PNDG|TLB|1|SYM|10|1.01|3|777||||",             # 6: missing key
        "6|2012-07-07 00:03:00|PNDG|TLB|2|SYM|10|1.01|3|777||||",            # 7: boolean
        "",                                                                  # 8: blank
        "7|2012-07-07 00:03:00|PNDG|TLB|1|SYM|10|1.01|0x10|777||||",         # 9: hex
        "8|2012-07-07 00:03:00|CMPT|TLB|1|SYM| 10 |1.01|3|777|1.00|x|0.1|0.2",  # 10: money
        "9|2012-07-07 00:03:00|CMPT|TLB|1|SYM|10|1.01|3|777|1.00|0.5|0.1|0.2|",  # 11: 15
        "10|2012-07-07 00:03:00|PNDG|TLB|1|SYM|10| 1.01 |3|777||||",         # 12: good, padded
    ]
    read = src.read_trade(write(tmp_path / "Batch1" / "Trade.txt", *lines))
    assert rejects(read) == [
        (2, "expected 14 fields, found 13"),
        (3, "unparsable T_QTY: 'ten' (expected integer)"),
        (4, "unparsable T_DTS: '2012-02-30 00:03:00' (expected timestamp "
            + "YYYY-MM-DD HH:MM:SS)"),
        (5, "unparsable T_BID_PRICE: '1.015' (expected decimal(8,2))"),
        (6, "missing T_ID"),
        (7, "unparsable T_IS_CASH: '2' (expected boolean)"),
        (9, "unparsable T_CA_ID: '0x10' (expected integer)"),
        (10, "unparsable T_CHRG: 'x' (expected decimal(10,2))"),
        (11, "expected 14 fields, found 15"),
    ]
    rows = read.rejects.to_pylist()
    assert rows[0]["raw_line"] == lines[1] and rows[0]["batch_id"] == 1
    assert rows[0]["source_file"] == str(tmp_path / "Batch1" / "Trade.txt")
    assert read.table["t_id"].to_pylist() == [0, 10]
    assert read.table["t_bid_price"].to_pylist() == [Decimal("9.57"), Decimal("1.01")]
    assert read.rows_in == 11 == read.table.num_rows + read.rejects.num_rows   # blank: no row
    assert read.rejects.schema == src.REJECT_SCHEMA


def test_fast_path_and_line_path_agree(tmp_path: Path) -> None:
    """A clean file is read by pyarrow.csv; the line-by-line path gives the same table."""
    lines = [GOOD_TRADE.replace("0|", f"{i}|", 1) for i in range(50)]
    last = "51|2012-07-07 00:03:00|PNDG|TLB|1|S|10|1.01|3|||||"
    path = write(tmp_path / "Trade.txt", *lines, last)
    data = path.read_bytes()
    fast = delimited._read_fast(data, src.TRADE)
    assert fast is not None
    slow = delimited._read_lines(data, src.TRADE, str(path), None)
    assert slow.rejects.num_rows == 0 and fast.equals(slow.table)
    assert fast["t_exec_name"].to_pylist()[-1] is None


def test_incremental_trade_has_cdc_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "Batch2" / "Trade.txt",
                 "I|4000|1000|2017-07-08 09:00:00|PNDG|TLS|0|SYM|5|2.50|7|12||||",
                 "U|4001|1000|2017-07-08 10:00:00|SBMT|TLS|0|SYM|5|2.50|7|12||||",
                 GOOD_TRADE)                                         # a Batch1 line: 14 fields
    read = src.read_trade_incremental(path)
    assert read.table.column_names[:3] == ["cdc_flag", "cdc_dsn", "t_id"]
    assert read.table["cdc_flag"].to_pylist() == ["I", "U"]
    assert read.table["cdc_dsn"].to_pylist() == [4000, 4001]
    assert rejects(read) == [(3, "expected 16 fields, found 14")]
    assert read.rejects["batch_id"].to_pylist() == [2]


def test_trade_history_and_reference_files(tmp_path: Path) -> None:
    b1 = tmp_path / "Batch1"
    history = src.read_trade_history(write(
        b1 / "TradeHistory.txt", "0|2012-07-07 00:00:01|SBMT", "0|2012-07-07 00:02:08|CMPT",
        "1|2012-07-07 00:03:00"))
    assert history.table.to_pylist()[1] == {"th_t_id": 0, "th_dts": TS(2012, 7, 7, 0, 2, 8),
                                            "th_st_id": "CMPT"}
    assert rejects(history) == [(3, "expected 3 fields, found 2")]

    status = src.read_status_type(write(b1 / "StatusType.txt", "ACTV|Active", "CMPT|Completed",
                                        "CNCL|Canceled", "PNDG|Pending", "SBMT|Submitted",
                                        "INAC|Inactive"))
    assert dict(zip(status.table["st_id"].to_pylist(), status.table["st_name"].to_pylist())
                )["CNCL"] == "Canceled"
    types = src.read_trade_type(write(b1 / "TradeType.txt", "TMB|Market Buy|0|1",
                                      "TMS|Market Sell|1|1", "TSL|Stop Loss|1|1",
                                      "TLS|Limit Sell|1|0", "TLB|Limit Buy|0|0"))
    assert types.table.to_pylist()[3] == {"tt_id": "TLS", "tt_name": "Limit Sell",
                                          "tt_is_sell": True, "tt_is_mrkt": False}
    industry = src.read_industry(write(b1 / "Industry.txt", "AM|Aerospace & Defense|IN"))
    assert industry.table.to_pylist() == [{"in_id": "AM", "in_name": "Aerospace & Defense",
                                           "in_sc_id": "IN"}]
    tax = src.read_tax_rate(write(b1 / "TaxRate.txt", "US1|U.S. Income Tax Bracket|0.15000",
                                  "US2|bad|0.1234567"))
    assert tax.table["tx_rate"].to_pylist() == [Decimal("0.15000")]
    assert rejects(tax) == [(2, "unparsable TX_RATE: '0.1234567' (expected decimal(6,5))")]
    batch_date = src.read_batch_date(write(tmp_path / "Batch2" / "BatchDate.txt", "2017-07-08"))
    assert batch_date.table["batchdate"].to_pylist() == [dt.date(2017, 7, 8)]


def test_date_and_time_files(tmp_path: Path) -> None:
    date = src.read_date(write(
        tmp_path / "Date.txt",
        "19500101|1950-01-01|January 1, 1950|1950|1950|19501|1950 Q1|19501|1950 January|19501|"
        "1950-W1|7|Sunday|1950|1950|19503|1950 Q3|true",
        "19500102|1950-01-02|January 2, 1950|1950|1950|19501|1950 Q1|19501|1950 January|19501|"
        "1950-W1|1|Monday|1950|1950|19503|1950 Q3|1"))
    row = date.table.to_pylist()[0]
    assert (row["sk_dateid"], row["datevalue"], row["holidayflag"]) == \
        (19500101, dt.date(1950, 1, 1), True)
    assert (row["calendarmonthid"], row["dayofweekdesc"], row["fiscalqtrdesc"]) == \
        (19501, "Sunday", "1950 Q3")
    assert rejects(date) == [(2, "unparsable HOLIDAYFLAG: '1' (expected boolean)")]
    time = src.read_time(write(
        tmp_path / "Time.txt", "000000|00:00:00|00|00|00|00:00|00|00:00:00|false|false",
        "093000|09:30:00|09|09|30|09:30|00|09:30:00|true|true",
        "240000|24:00:00|24|24|00|24:00|00|24:00:00|false|false"))
    assert time.table["sk_timeid"].to_pylist() == [0, 93000]   # leading zeros: a number
    assert time.table["timevalue"].to_pylist() == [dt.time(0, 0), dt.time(9, 30)]
    assert time.table["markethoursflag"].to_pylist() == [False, True]
    assert rejects(time) == [(3, "unparsable TIMEVALUE: '24:00:00' (expected time HH:MM:SS)")]


def test_hr_customer_account(tmp_path: Path) -> None:
    b1, b2 = tmp_path / "Batch1", tmp_path / "Batch2"
    hr = src.read_hr(write(b1 / "HR.csv",
                           "0,1,Jane,Doe,Q,314,Main Branch,OFFICE1234,(212) 555-0101",
                           "1,1,John,Roe,,,,,",
                           "2,1,Too,Many,A,314,B,OFFICE0001,(212) 555-0102,extra"))
    assert hr.table.to_pylist()[0]["employeejobcode"] == 314
    assert hr.table.to_pylist()[1] == {"employeeid": 1, "managerid": 1,
                                       "employeefirstname": "John", "employeelastname": "Roe",
                                       "employeemi": None, "employeejobcode": None,
                                       "employeebranch": None, "employeeoffice": None,
                                       "employeephone": None}
    assert rejects(hr) == [(3, "expected 9 fields, found 10")]

    customer_fields = ["I", "17", "1005", "123-45-6789", "ACTV", "Doe", "Jane", "Q", "F", "1",
                       "1970-01-31", "1 Main St", "", "10001", "New York", "NY",
                       "United States of America", "1", "212", "555-0101", "", "", "",
                       "555-0102", "", "", "", "", "", "jane@example.com", "", "NY1", "US1"]
    assert len(customer_fields) == 33
    bad = customer_fields.copy()
    bad[10] = "1970-13-01"
    customer = src.read_customer(write(b2 / "Customer.txt", "|".join(customer_fields),
                                       "|".join(bad)))
    row = customer.table.to_pylist()[0]
    assert (row["cdc_flag"], row["cdc_dsn"], row["c_id"], row["c_st_id"]) == \
        ("I", 17, 1005, "ACTV")
    assert (row["c_dob"], row["c_tier"], row["c_adline2"], row["c_local_2"]) == \
        (dt.date(1970, 1, 31), "1", None, "555-0102")
    assert (row["c_email_1"], row["c_nat_tx_id"]) == ("jane@example.com", "US1")
    assert rejects(customer) == [(2, "unparsable C_DOB: '1970-13-01' (expected date "
                                     + "YYYY-MM-DD)")]
    account = src.read_account(write(b2 / "Account.txt", "U|18|42|7|1005|Savings|2|INAC",
                                     "I|19|43|7|1005|Checking|two|ACTV"))
    assert account.table.to_pylist() == [{"cdc_flag": "U", "cdc_dsn": 18, "ca_id": 42,
                                          "ca_b_id": 7, "ca_c_id": 1005, "ca_name": "Savings",
                                          "ca_tax_st": 2, "ca_st_id": "INAC"}]
    assert rejects(account) == [(2, "unparsable CA_TAX_ST: 'two' (expected integer)")]


def test_fact_files_batch1_and_cdc_layouts(tmp_path: Path) -> None:
    """CashTransaction, DailyMarket, HoldingHistory, WatchHistory: Batch1's fields, or the
    CDC fields first in Batch2+ (picked by folder, or by ``batch_id``), lines as DIGen 1.1.0
    writes them."""
    b1, b2 = tmp_path / "Batch1", tmp_path / "Batch2"
    cash = src.read_cash_transaction(write(b1 / "CashTransaction.txt",
                                           "466|2012-07-07 04:15:00|-5484.72|JfRh name"))
    assert cash.table.to_pylist() == [{"ct_ca_id": 466, "ct_dts": TS(2012, 7, 7, 4, 15),
                                       "ct_amt": Decimal("-5484.72"), "ct_name": "JfRh name"}]
    cdc = src.read_cash_transaction(write(b2 / "CashTransaction.txt",
                                          "I|1485223|1324|2017-07-08 11:34:20|8913.39|x"))
    assert cdc.table.column_names[:3] == ["cdc_flag", "cdc_dsn", "ct_ca_id"]
    market = src.read_daily_market(write(
        b2 / "DailyMarket.txt", "I|1282769|2017-07-07|AAAAAAAAAAAACCH|937.20|1317.08|891.53|"
        "773766563", "I|1282770|2017-07-07|AAAAAAAAAAAABSB|975.48|1054.45|890.06"))
    assert market.table.to_pylist()[0]["dm_vol"] == 773766563
    assert rejects(market) == [(2, "expected 8 fields, found 7")]
    holding = src.read_holding_history(write(b2 / "HoldingHistory.txt",
                                             "I|1488406|353232|372101|5225|0"))
    assert holding.table.to_pylist()[0]["hh_before_qty"] == 5225
    watch = src.read_watch_history(write(b2 / "WatchHistory.txt",
                                         "I|900042|1915|AAAAAAAAAAAABTZ|2017-07-08 00:00:19|ACTV",
                                         "I|900043|3869|AAAAAAAAAAAAAFU||ACTV"))
    assert watch.table["w_action"].to_pylist() == ["ACTV"]
    assert rejects(watch) == [(2, "missing W_DTS")]
    # outside a BatchN folder the batch says which layout: the CDC one needs 6 fields
    loose = write(tmp_path / "wh.txt", "1915|AAAAAAAAAAAABTZ|2017-07-08 00:00:19|ACTV")
    assert src.read_watch_history(loose).table.num_rows == 1
    wrong = src.read_watch_history(loose, batch_id=3)
    assert rejects(wrong) == [(1, "expected 6 fields, found 4")]


def test_not_utf8_line_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "StatusType.txt"
    path.write_bytes(b"ACTV|Active\r\nCMPT|Compl\xe9ted\r\nCNCL|Canceled\r\n")
    read = src.read_status_type(path)
    assert read.table["st_id"].to_pylist() == ["ACTV", "CNCL"]
    assert rejects(read) == [(2, "not UTF-8")] and read.rows_in == 3


# -- FINWIRE: built field by field from the widths of the layout, not from the reader -------

CMP_WIDTHS = (15, 3, 60, 10, 4, 2, 4, 8, 80, 80, 12, 25, 20, 24, 46, 150)
SEC_WIDTHS = (15, 3, 15, 6, 4, 70, 6, 13, 8, 8, 12)


def fixed(widths: tuple[int, ...], values: list[str], right: tuple[int, ...] = ()) -> str:
    """Space-padded fields (left-aligned, or right-aligned for the indexes in ``right``)."""
    assert len(values) == len(widths)
    return "".join(v.rjust(w) if i in right else v.ljust(w)
                   for i, (v, w) in enumerate(zip(values, widths)))


CMP = ["19671001-093512", "CMP", "Acme Widgets Incorporated", "0000000042", "ACTV", "AM",
       "AA+", "19450315", "1 Main Street", "", "10001", "New York", "NY",
       "United States of America", "Wile E. Coyote", "Makes widgets."]
SEC = ["19671002-101010", "SEC", "AAAAAAAAAAAADMO", "COMMON", "ACTV", "Acme Common Stock",
       "NYSE", "123456789", "19670103", "19670104", "1.25"]


def test_finwire_positions_and_records(tmp_path: Path) -> None:
    cmp_line = fixed(CMP_WIDTHS, CMP)
    sec_by_cik = fixed(SEC_WIDTHS, SEC, right=(7, 10)) + "0000000042"
    sec_by_name = fixed(SEC_WIDTHS, SEC[:2] + ["BBBBBBBBBBBBDMO", "PREF_A", "INAC"] + SEC[5:],
                        right=(7, 10)) + "Acme Widgets Incorporated".ljust(60)
    assert (len(cmp_line), len(sec_by_cik), len(sec_by_name)) == (543, 170, 220)
    b1 = tmp_path / "Batch1"
    write(b1 / "FINWIRE1967Q4", cmp_line, sec_by_cik,
          "19671003-000000FIN19674" + "1" * 170,              # FIN: counted, skipped
          sec_by_name.rstrip(),                                # trailing blanks cut off
          fixed(CMP_WIDTHS, CMP[:3] + ["00000000AB"] + CMP[4:]),
          "19671004-000000XYZ whatever",
          cmp_line + "extra")
    write(b1 / "FINWIRE1967Q3", fixed(CMP_WIDTHS, ["19670701-000000", "CMP", "Early Co"]
                                      + ["0000000001"] + CMP[4:]))
    write(b1 / "FINWIRE_audit.csv", "DataSet, BatchID ,Date , Attribute , Value, DValue",
          "DimCompany,1,,FW_CMP,3,")
    write(b1 / "FINWIRE1967Q4_audit.csv", "DataSet, BatchID ,Date , Attribute , Value, DValue")

    assert [p.name for p in src.finwire_files(b1)] == ["FINWIRE1967Q3", "FINWIRE1967Q4"]
    read = src.read_finwire(b1)
    assert read.cmp["companyname"].to_pylist() == ["Early Co", "Acme Widgets Incorporated"]
    acme = read.cmp.to_pylist()[1]
    assert acme == {"pts": TS(1967, 10, 1, 9, 35, 12), "companyname": "Acme Widgets Incorporated",
                    "cik": 42, "status": "ACTV", "industryid": "AM", "sprating": "AA+",
                    "foundingdate": dt.date(1945, 3, 15), "addrline1": "1 Main Street",
                    "addrline2": None, "postalcode": "10001", "city": "New York",
                    "stateprovince": "NY", "country": "United States of America",
                    "ceoname": "Wile E. Coyote", "description": "Makes widgets."}
    by_cik, by_name = read.sec.to_pylist()
    assert by_cik == {"pts": TS(1967, 10, 2, 10, 10, 10), "symbol": "AAAAAAAAAAAADMO",
                      "issuetype": "COMMON", "status": "ACTV", "name": "Acme Common Stock",
                      "exid": "NYSE", "shout": 123456789,
                      "firsttradedate": dt.date(1967, 1, 3),
                      "firsttradeexchg": dt.date(1967, 1, 4), "dividend": Decimal("1.25"),
                      "conameorcik": "0000000042", "co_cik": 42, "co_name": None}
    assert (by_name["symbol"], by_name["issuetype"], by_name["status"]) == \
        ("BBBBBBBBBBBBDMO", "PREF_A", "INAC")
    assert (by_name["co_cik"], by_name["co_name"]) == (None, "Acme Widgets Incorporated")
    assert read.fin_records == 1
    assert rejects(read) == [(5, "unparsable CIK: '00000000AB' (expected integer)"),
                             (6, "unknown record type 'XYZ'"),
                             (7, "CMP record of 548 characters, longer than 543")]
    assert set(read.rejects["source_file"].to_pylist()) == {str(b1 / "FINWIRE1967Q4")}
    assert read.rows_in == 8                                  # 8 lines in the two quarters
    # per file, lines of each type, refused ones included (DIGen's per-quarter audit counts)
    assert [(Path(f).name, c) for f, c in read.file_counts] == [
        ("FINWIRE1967Q3", {"CMP": 1, "SEC": 0, "FIN": 0}),
        ("FINWIRE1967Q4", {"CMP": 3, "SEC": 2, "FIN": 1})]


# -- CustomerMgmt.xml ----------------------------------------------------------------------

ACTIONS = """<?xml version="1.0" encoding="UTF-8"?>
<TPCDI:Actions xmlns:TPCDI="http://www.tpc.org/tpc-di">
\t<TPCDI:Action ActionType="NEW" ActionTS="2007-07-07T02:56:25">
\t\t<Customer C_ID="0" C_TAX_ID="923-45-6789" C_GNDR="F" C_TIER="1" C_DOB="1940-12-02">
\t\t\t<Name>
\t\t\t\t<C_L_NAME>Joannis</C_L_NAME>
\t\t\t\t<C_F_NAME>Adara</C_F_NAME>
\t\t\t\t<C_M_NAME/>
\t\t\t</Name>
\t\t\t<Address>
\t\t\t\t<C_ADLINE1>4779 Weller Way</C_ADLINE1>
\t\t\t\t<C_ADLINE2/>
\t\t\t\t<C_ZIPCODE>92624</C_ZIPCODE>
\t\t\t\t<C_CITY>Columbus</C_CITY>
\t\t\t\t<C_STATE_PROV>Ontario</C_STATE_PROV>
\t\t\t\t<C_CTRY>Canada</C_CTRY>
\t\t\t</Address>
\t\t\t<ContactInfo>
\t\t\t\t<C_PRIM_EMAIL>Adara.Joannis@moose-mail.com</C_PRIM_EMAIL>
\t\t\t\t<C_ALT_EMAIL>Adara.Joannis@gmx.com</C_ALT_EMAIL>
\t\t\t\t<C_PHONE_1>
\t\t\t\t\t<C_CTRY_CODE>1</C_CTRY_CODE>
\t\t\t\t\t<C_AREA_CODE>872</C_AREA_CODE>
\t\t\t\t\t<C_LOCAL>523-8928</C_LOCAL>
\t\t\t\t\t<C_EXT/>
\t\t\t\t</C_PHONE_1>
\t\t\t\t<C_PHONE_2>
\t\t\t\t\t<C_CTRY_CODE/>
\t\t\t\t\t<C_AREA_CODE/>
\t\t\t\t\t<C_LOCAL>492-3961</C_LOCAL>
\t\t\t\t\t<C_EXT/>
\t\t\t\t</C_PHONE_2>
\t\t\t</ContactInfo>
\t\t\t<TaxInfo>
\t\t\t\t<C_LCL_TX_ID>CA3</C_LCL_TX_ID>
\t\t\t\t<C_NAT_TX_ID>YT3</C_NAT_TX_ID>
\t\t\t</TaxInfo>
\t\t\t<Account CA_ID="0" CA_TAX_ST="1">
\t\t\t\t<CA_B_ID>17713</CA_B_ID>
\t\t\t\t<CA_NAME>CJlmMuFyibKOmKLHIaTeDhagzh</CA_NAME>
\t\t\t</Account>
\t\t</Customer>
\t</TPCDI:Action>
\t<TPCDI:Action ActionType="ADDACCT" ActionTS="2007-07-08T01:00:00">
\t\t<Customer C_ID="0">
\t\t\t<Account CA_ID="1" CA_TAX_ST="2">
\t\t\t\t<CA_B_ID>17713</CA_B_ID>
\t\t\t\t<CA_NAME>Second account</CA_NAME>
\t\t\t</Account>
\t\t</Customer>
\t</TPCDI:Action>
\t<TPCDI:Action ActionType="UPDACCT" ActionTS="2007-07-09T01:00:00">
\t\t<Customer C_ID="0">
\t\t\t<Account CA_ID="1">
\t\t\t\t<CA_B_ID>17714</CA_B_ID>
\t\t\t</Account>
\t\t</Customer>
\t</TPCDI:Action>
\t<TPCDI:Action ActionType="UPDCUST" ActionTS="2007-07-10T01:00:00">
\t\t<Customer C_ID="0" C_TIER="3">
\t\t\t<ContactInfo>
\t\t\t\t<C_ALT_EMAIL>adara@example.com</C_ALT_EMAIL>
\t\t\t\t<C_PHONE_3>
\t\t\t\t\t<C_CTRY_CODE/>
\t\t\t\t\t<C_AREA_CODE>212</C_AREA_CODE>
\t\t\t\t\t<C_LOCAL>555-0100</C_LOCAL>
\t\t\t\t\t<C_EXT>12</C_EXT>
\t\t\t\t</C_PHONE_3>
\t\t\t</ContactInfo>
\t\t</Customer>
\t</TPCDI:Action>
\t<TPCDI:Action ActionType="CLOSEACCT" ActionTS="2007-07-11T01:00:00">
\t\t<Customer C_ID="0">
\t\t\t<Account CA_ID="0"/>
\t\t</Customer>
\t</TPCDI:Action>
\t<TPCDI:Action ActionType="UPDCUST" ActionTS="2007-07-12T01:00:00">
\t\t<Customer C_ID="zero" C_TIER="2"/>
\t</TPCDI:Action>
\t<TPCDI:Action ActionType="INACT" ActionTS="2007-07-13T01:00:00">
\t\t<Customer C_ID="0"/>
\t</TPCDI:Action>
\t<TPCDI:Action ActionType="INACT" ActionTS="2007-07-32T01:00:00">
\t\t<Customer C_ID="0"/>
\t</TPCDI:Action>
</TPCDI:Actions>
"""


def present(row: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in row.items() if v is not None}


def test_customer_mgmt_one_row_per_action(tmp_path: Path) -> None:
    path = tmp_path / "Batch1" / "CustomerMgmt.xml"
    path.parent.mkdir()
    path.write_bytes(ACTIONS.replace("\n", "\r\n").encode())
    read = src.read_customer_mgmt(path)
    rows = read.table.to_pylist()
    assert [r["actiontype"] for r in rows] == ["NEW", "ADDACCT", "UPDACCT", "UPDCUST",
                                               "CLOSEACCT", "INACT"]
    new = present(rows[0])
    assert new == {
        "actiontype": "NEW", "actionts": TS(2007, 7, 7, 2, 56, 25), "c_id": 0,
        "c_tax_id": "923-45-6789", "c_l_name": "Joannis", "c_f_name": "Adara", "c_gndr": "F",
        "c_tier": "1", "c_dob": dt.date(1940, 12, 2), "c_adline1": "4779 Weller Way",
        "c_zipcode": "92624", "c_city": "Columbus", "c_state_prov": "Ontario",
        "c_ctry": "Canada", "c_ctry_1": "1", "c_area_1": "872", "c_local_1": "523-8928",
        "c_local_2": "492-3961", "c_email_1": "Adara.Joannis@moose-mail.com",
        "c_email_2": "Adara.Joannis@gmx.com", "c_lcl_tx_id": "CA3", "c_nat_tx_id": "YT3",
        "ca_id": 0, "ca_tax_st": 1, "ca_b_id": 17713, "ca_name": "CJlmMuFyibKOmKLHIaTeDhagzh",
        "empty_fields": ["c_m_name", "c_adline2", "c_ext_1", "c_ctry_2", "c_area_2",
                         "c_ext_2"]}
    assert present(rows[1]) == {"actiontype": "ADDACCT", "actionts": TS(2007, 7, 8, 1),
                                "c_id": 0, "ca_id": 1, "ca_tax_st": 2, "ca_b_id": 17713,
                                "ca_name": "Second account"}
    assert present(rows[2]) == {"actiontype": "UPDACCT", "actionts": TS(2007, 7, 9, 1),
                                "c_id": 0, "ca_id": 1, "ca_b_id": 17714}   # the rest: absent
    assert present(rows[3]) == {"actiontype": "UPDCUST", "actionts": TS(2007, 7, 10, 1),
                                "c_id": 0, "c_tier": "3", "c_email_2": "adara@example.com",
                                "c_area_3": "212", "c_local_3": "555-0100", "c_ext_3": "12",
                                "empty_fields": ["c_ctry_3"]}
    assert present(rows[4]) == {"actiontype": "CLOSEACCT", "actionts": TS(2007, 7, 11, 1),
                                "c_id": 0, "ca_id": 0}
    assert present(rows[5]) == {"actiontype": "INACT", "actionts": TS(2007, 7, 13, 1),
                                "c_id": 0}
    assert rejects(read) == [(77, "unparsable C_ID: 'zero' (expected integer)"),
                             (83, "unparsable ACTIONTS: '2007-07-32T01:00:00' (expected "
                                  + "timestamp YYYY-MM-DD HH:MM:SS)")]
    raw = read.rejects["raw_line"].to_pylist()[0]
    assert raw.startswith('<TPCDI:Action ActionType="UPDCUST" ActionTS="2007-07-12T01:00:00">')
    assert raw.endswith("</TPCDI:Action>") and 'C_ID="zero"' in raw
    assert read.rows_in == 8 and read.rejects["batch_id"].to_pylist() == [1, 1]


def test_customer_mgmt_syntax_error_keeps_what_was_read(tmp_path: Path) -> None:
    broken = ACTIONS.split("\t<TPCDI:Action ActionType=\"UPDACCT\"")[0] + "\t<TPCDI:Action oops"
    path = tmp_path / "CustomerMgmt.xml"
    path.write_text(broken)
    read = src.read_customer_mgmt(path)
    assert read.table["actiontype"].to_pylist() == ["NEW", "ADDACCT"]
    [(line, reason)] = rejects(read)
    assert line == 52 and reason.startswith("XML error") and "nothing after it" in reason


# -- audit CSVs ----------------------------------------------------------------------------

def test_audit_files_read_as_audit_never_as_data(tmp_path: Path) -> None:
    header = "DataSet, BatchID ,Date , Attribute , Value, DValue"
    write(tmp_path / "Batch1_audit.csv", header, "Batch,1,1950-01-01,FirstDay,,",
          "Batch,1,2017-07-07,LastDay,,")
    write(tmp_path / "Generator_audit.csv", header, "Generator,1,,SF,,10000.0",
          "Generator,1,,ONE_YEAR_IN_MILLISECONDS,,31557600000")
    write(tmp_path / "Batch1" / "Trade_audit.csv", header, "DimTrade,1,,T_NEW,1300000,",
          "DimTrade,1,,T_InvalidCommision,0,", "DimTrade,1,x,T_CanceledTrades,75880,")
    write(tmp_path / "Batch1" / "FINWIRE_audit.csv", header, "DimSecurity,1,,FW_SEC_DUP,-1,")
    write(tmp_path / "Batch1" / "Trade.txt", GOOD_TRADE)
    read = src.read_audit(tmp_path)
    rows = {(r["dataset"], r["attribute"]): r for r in read.table.to_pylist()}
    assert rows[("Batch", "LastDay")]["date"] == dt.date(2017, 7, 7)
    assert rows[("DimTrade", "T_NEW")]["value"] == 1300000
    assert rows[("DimSecurity", "FW_SEC_DUP")]["value"] == -1
    assert rows[("Generator", "ONE_YEAR_IN_MILLISECONDS")]["dvalue"] == 31557600000.0
    assert len(rows) == 7 and read.rows_in == 8                # headers are not rows
    assert rejects(read) == [(4, "unparsable DATE: 'x' (expected date YYYY-MM-DD)")]
    assert src.finwire_files(tmp_path / "Batch1") == []


@pytest.mark.parametrize("name", ["FINWIRE_1967Q1", "finwire1967q1", "FINWIRE1967Q5",
                                  "FINWIRE1967Q4.bak", "Finwire1967Q2", "FINWIRE67Q1"])
def test_a_misnamed_finwire_file_is_an_error_naming_it(tmp_path: Path, name: str) -> None:
    """A file that looks like FINWIRE but is not named FINWIRE<YYYY>Q<1-4> is a quarter the
    user meant to load: skipping it would lose its companies and securities without a word."""
    b1 = tmp_path / "Batch1"
    line = fixed(CMP_WIDTHS, CMP)
    write(b1 / "FINWIRE1967Q4", line)
    write(b1 / "FINWIRE1967Q4_audit.csv", "DataSet, BatchID ,Date , Attribute , Value, DValue")
    write(b1 / "FINWIRE_audit.csv", "DataSet, BatchID ,Date , Attribute , Value, DValue")
    assert [p.name for p in src.finwire_files(b1)] == ["FINWIRE1967Q4"]
    write(b1 / name, line)
    for call in (src.finwire_files, src.read_finwire):
        with pytest.raises(src.FinwireNameError, match=re.escape(
                f"{name} look like FINWIRE but are not named FINWIRE<YYYY>Q<1-4>")):
            call(b1)
    assert issubclass(src.FinwireNameError, TerminalError)


@pytest.mark.parametrize("end", ["\r\n", "\n"])
def test_line_ends_do_not_matter(tmp_path: Path, end: str) -> None:
    path = write(tmp_path / "TradeHistory.txt", "0|2012-07-07 00:00:01|SBMT",
                 "0|2012-07-07 00:02:08|CMPT", end=end)
    read = src.read_trade_history(path)
    assert read.table["th_st_id"].to_pylist() == ["SBMT", "CMPT"] and read.rejects.num_rows == 0
