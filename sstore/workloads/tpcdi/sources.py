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

from __future__ import annotations

import re
import xml.parsers.expat
from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

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


# -- conversion: the one rule set -------------------------------------------------------------

def _clean(raw: pa.Array) -> pa.Array:
    """Trim every field; an empty field is NULL (by swapping the validity bitmap: if_else on
    strings copies every value and costs more than the whole CSV parse)."""
    text = pc.ascii_trim_whitespace(raw)
    keep = pc.and_kleene(pc.is_valid(text), pc.not_equal(text, ""))
    if text.offset or keep.offset:
        return pc.if_else(keep, text, pa.scalar(None, TEXT))
    return pa.Array.from_buffers(TEXT, len(text), [keep.buffers()[1], *text.buffers()[1:]])


def _cast_rows(text: pa.Array, type_: pa.DataType) -> tuple[pa.Array, pa.Array | None]:
    """``pc.cast`` with per-row outcome: one call for a clean column; otherwise bisect to the
    rows the cast refuses (cost grows with the number of bad rows, not the column length).
    Returns the values (NULL where refused) and the refused mask, None when there is none."""
    try:
        return pc.cast(text, type_), None
    except pa.ArrowInvalid:
        pass
    shape = _shape(type_)        # a superset of what the cast accepts: misfits are bad for sure
    misfit: pa.Array | None = None
    if shape is not None:
        misfit = pc.invert(pc.fill_null(pc.match_substring_regex(text, shape), True))
        text = pc.if_else(misfit, pa.scalar(None, TEXT), text)
        try:
            return pc.cast(text, type_), misfit
        except pa.ArrowInvalid:
            pass
    bad: list[int] = []

    def find(lo: int, hi: int) -> None:
        if hi - lo <= 16:
            bad.extend(i for i in range(lo, hi) if not _casts(text.slice(i, 1), type_))
            return
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            if not _casts(text.slice(a, b - a), type_):
                find(a, b)

    find(0, len(text))
    mask = _mask(len(text), bad)
    values = pc.cast(pc.if_else(mask, pa.scalar(None, TEXT), text), type_)
    return values, mask if misfit is None else pc.or_(mask, misfit)


def _shape(type_: pa.DataType) -> str | None:
    """A loose regex that every value Arrow's cast to ``type_`` accepts matches; the rows it
    does not match are refused without bisecting (keeps a badly damaged file fast)."""
    if pa.types.is_decimal(type_):
        return r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"
    if type_ == DATE:
        return r"^\d{4}-\d{2}-\d{2}$"
    if type_ == TS:
        return r"^\d{4}-\d{2}-\d{2}([ T].*)?$"
    return None


def _casts(text: pa.Array, type_: pa.DataType) -> bool:
    try:
        pc.cast(text, type_)
        return True
    except pa.ArrowInvalid:
        return False


def _mask(n: int, rows: Sequence[int]) -> pa.Array:
    flags = [False] * n
    for i in rows:
        flags[i] = True
    return pa.array(flags, BOOL)


def _convert(text: pa.Array, col: Col, bools: tuple[str, str]
             ) -> tuple[pa.Array, pa.Array | None]:
    """Typed values, and a mask of the rows this field refuses (unparsable, or required and
    missing; None if no row). Refused rows hold NULL. Numbers, ISO dates and times are
    Arrow's cast (strict: ``2017-02-30`` fails), integers digits only (no ``0x10``)."""
    type_, bad = col.type, None
    if type_ == TEXT:
        values = text
    elif type_ == BOOL:
        good = pc.is_in(text, value_set=pa.array(bools))
        values = pc.if_else(good, pc.equal(text, bools[0]), pa.scalar(None, BOOL))
        bad = pc.and_(pc.is_valid(text), pc.invert(good))
    elif col.fmt:   # FINWIRE's yyyymmdd forms: strptime, and the text must read back the same
        parsed = pc.strptime(text, format=col.fmt, unit="s", error_is_null=True)
        good = pc.fill_null(pc.equal(pc.strftime(parsed, format=col.fmt), text), False)
        values = pc.if_else(good, pc.cast(parsed, type_), pa.scalar(None, type_))
        bad = pc.and_(pc.is_valid(text), pc.invert(good))
    elif type_ == TIME:
        values, bad = _cast_rows(pc.binary_join_element_wise("1970-01-01 ", text, ""), TS)
        values = pc.cast(values, TIME)
    else:
        if pa.types.is_integer(type_) and not pc.all(pc.ascii_is_decimal(text)).as_py():
            signed = pc.utf8_slice_codeunits(text, 1, 1 << 20)
            digits = pc.ascii_is_decimal(pc.if_else(pc.starts_with(text, "-"), signed, text))
            letters = pc.and_(pc.is_valid(text), pc.invert(digits))
            if pc.any(letters).as_py():
                text = pc.if_else(letters, pa.scalar(None, TEXT), text)
                bad = letters
        values, refused = _cast_rows(text, type_)
        bad = refused if bad is None else bad if refused is None else pc.or_(bad, refused)
    if col.required and text.null_count:
        missing = pc.is_null(text)
        bad = missing if bad is None else pc.or_(bad, missing)
    return values, bad


def _typed(raw: Sequence[pa.Array], cols: Sequence[Col], bools: tuple[str, str],
           nulls_done: bool = False) -> tuple[pa.Table, list[pa.Array], list[pa.Array | None]]:
    """Convert text columns: the typed table, the cleaned texts, and one mask per column.

    ``nulls_done``: empty fields are already NULL (pyarrow.csv did it), so only text columns
    need trimming; a number, date or flag with spaces around it fails its cast and sends the
    file to the line-by-line path, which trims first. Same outcome, less work when clean."""
    texts = [a if nulls_done and c.type != TEXT else _clean(a) for a, c in zip(raw, cols)]
    converted = [_convert(t, c, bools) for t, c in zip(texts, cols)]
    table = pa.table([v for v, _ in converted], names=[c.name for c in cols])
    return table, texts, [b for _, b in converted]


def _any(masks: Sequence[pa.Array | None], n: int) -> pa.Array:
    """Rows refused by any column."""
    out: pa.Array | None = None
    for mask in masks:
        if mask is not None:
            out = mask if out is None else pc.or_(out, mask)
    return out if out is not None else pa.repeat(pa.scalar(False), n)


def _reasons(rows: list[int], texts: Sequence[pa.Array], masks: Sequence[pa.Array | None],
             cols: Sequence[Col]) -> list[str]:
    """Why each refused row was refused: its first bad field."""
    idx = pa.array(rows, INT)
    flags = [[False] * len(rows) if m is None else m.take(idx).to_pylist() for m in masks]
    values = [t.take(idx).to_pylist() for t in texts]
    out = []
    for r in range(len(rows)):
        c = next(j for j in range(len(cols)) if flags[j][r])
        name, value = cols[c].name.upper(), values[c][r]
        out.append(f"missing {name}" if value is None else
                   f"unparsable {name}: {value!r} (expected {_expected(cols[c])})")
    return out


def _expected(col: Col) -> str:
    if col.fmt or col.type in _FORMATS:
        return col.fmt or _FORMATS[col.type]
    if pa.types.is_decimal(col.type):
        return f"decimal({col.type.precision},{col.type.scale})"
    return {BOOL: "boolean", F64: "number"}.get(col.type, "integer")


# -- lines, rejects ---------------------------------------------------------------------------

def _batch_of(path: Path) -> int | None:
    """``Batch2/Trade.txt`` and ``Batch2_audit.csv`` belong to batch 2."""
    for name in (path.parent.name, path.name):
        m = re.match(r"Batch(\d+)", name)
        if m:
            return int(m.group(1))
    return None


def _lines(data: bytes) -> tuple[pa.Array, pa.Array, list[tuple[int, str, str]]]:
    """Physical line numbers and texts of the non-blank lines, ``\\r`` stripped, as Arrow
    arrays; lines that are not UTF-8 come back as (number, text, reason) rejects."""
    bad: list[tuple[int, str, str]] = []
    try:
        raw = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        raw = []
        for i, chunk in enumerate(data.split(b"\n"), 1):
            try:
                raw.append(chunk.decode("utf-8"))
            except UnicodeDecodeError:
                raw.append("")
                bad.append((i, chunk.decode("utf-8", "replace").rstrip("\r"), "not UTF-8"))
    if raw and raw[0].startswith("\ufeff"):
        raw[0] = raw[0][1:]
    texts = pc.utf8_rtrim(pa.array(raw, TEXT), characters="\r")
    keep = pc.greater(pc.binary_length(texts), 0)
    numbers = pa.array(np.arange(1, len(raw) + 1, dtype=np.int64))
    return numbers.filter(keep), texts.filter(keep), bad


def _rejects(source: str, batch: int | None, rows: Sequence[tuple[int, str, str]]) -> pa.Table:
    rows = sorted(rows)
    return pa.table([[source] * len(rows), [batch] * len(rows), [r[0] for r in rows],
                     [r[1] for r in rows], [r[2] for r in rows]], schema=REJECT_SCHEMA)


# -- delimited files --------------------------------------------------------------------------

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
    table, _, masks = _typed([c.combine_chunks() for c in raw.columns], layout.cols,
                             layout.bools, nulls_done=True)
    return None if pc.any(_any(masks, raw.num_rows)).as_py() else table


def _read_lines(data: bytes, layout: Layout, source: str, batch: int | None) -> SourceRead:
    """Line by line: the same conversion, and every refused line with its number."""
    numbers, texts, rejected = _lines(data)
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
    table, clean, masks = _typed([pc.list_element(parts, j) for j in range(n)], layout.cols,
                                 layout.bools)
    bad = _any(masks, len(keep))
    bad_rows = pc.indices_nonzero(bad).to_pylist()
    for row, reason in zip(bad_rows, _reasons(bad_rows, clean, masks, layout.cols)):
        line = keep[row].as_py()
        rejected.append((numbers[line].as_py(), texts[line].as_py(), reason))
    return SourceRead(source, table.filter(pc.invert(bad)), _rejects(source, batch, rejected))


def read_delimited(path: str | PathLike[str], layout: Layout, batch_id: int | None = None
                   ) -> SourceRead:
    """Read one delimited file; ``batch_id`` defaults to the ``BatchN`` folder it is in."""
    path = Path(path)
    data = path.read_bytes()
    batch = _batch_of(path) if batch_id is None else batch_id
    table = _read_fast(data, layout)
    if table is not None:
        return SourceRead(str(path), table, _rejects(str(path), batch, []))
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


# -- FINWIRE ----------------------------------------------------------------------------------

def _fw(spec: str, start: int, end: int, type_: pa.DataType = TEXT) -> tuple[Col, int, int]:
    """A fixed-width field at 1-based inclusive positions; FINWIRE dates are yyyymmdd."""
    fmt = {DATE: "%Y%m%d", TS: "%Y%m%d-%H%M%S"}.get(type_)
    return _c(spec, type_, fmt), start, end


_PTS = _fw("pts!", 1, 15, TS)
CMP_FIELDS = (_PTS, _fw("companyname!", 19, 78), _fw("cik!", 79, 88, INT),
              _fw("status!", 89, 92), _fw("industryid", 93, 94), _fw("sprating", 95, 98),
              _fw("foundingdate", 99, 106, DATE), _fw("addrline1", 107, 186),
              _fw("addrline2", 187, 266), _fw("postalcode", 267, 278), _fw("city", 279, 303),
              _fw("stateprovince", 304, 323), _fw("country", 324, 347),
              _fw("ceoname", 348, 393), _fw("description", 394, 543))
SEC_FIELDS = (_PTS, _fw("symbol!", 19, 33), _fw("issuetype", 34, 39), _fw("status!", 40, 43),
              _fw("name", 44, 113), _fw("exid", 114, 119), _fw("shout", 120, 132, INT),
              _fw("firsttradedate", 133, 140, DATE), _fw("firsttradeexchg", 141, 148, DATE),
              _fw("dividend", 149, 160, MONEY), _fw("conameorcik!", 161, 220))
_WIDTH = {"CMP": 543, "SEC": 220}


def finwire_files(directory: str | PathLike[str]) -> list[Path]:
    """The quarterly FINWIRE files in quarter order; never ``FINWIRE_audit.csv``."""
    return sorted(p for p in Path(directory).iterdir()
                  if p.is_file() and FINWIRE_NAME.fullmatch(p.name))


@dataclass(frozen=True)
class FinwireRead:
    """CMP and SEC records in posting order; FIN records are counted, not returned."""

    cmp: pa.Table
    sec: pa.Table
    rejects: pa.Table
    fin_records: int

    @property
    def rows_in(self) -> int:
        return self.cmp.num_rows + self.sec.num_rows + self.rejects.num_rows + self.fin_records


def read_finwire(directory: str | PathLike[str], batch_id: int = 1) -> FinwireRead:
    """Every FINWIRE file of a Batch1 folder. A line shorter than its record's width is
    read as if space-padded (DIGen may trim it); a longer one is refused. Lines are sorted
    by kind with Arrow, so the FIN bulk (~97% of the lines) costs no Python work."""
    files = finwire_files(directory)
    numbers, texts, owners = [], [], []
    rejected: list[tuple[str, int, str, str]] = []
    for k, path in enumerate(files):
        nums, lines, bad = _lines(path.read_bytes())
        numbers.append(nums)
        texts.append(lines)
        owners.append(np.full(len(lines), k, dtype=np.int64))
        rejected += [(str(path), *b) for b in bad]
    lines_arr = pa.chunked_array(texts, TEXT).combine_chunks()
    number_arr = pa.chunked_array(numbers, INT).combine_chunks()
    owner_arr = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)

    def refuse(rows: pa.Array, reasons: Sequence[str]) -> None:
        for i, reason in zip(rows.to_pylist(), reasons):
            rejected.append((str(files[owner_arr[i]]), number_arr[i].as_py(),
                             lines_arr[i].as_py(), reason))

    kinds = pc.utf8_slice_codeunits(lines_arr, 15, 18)
    unknown = pc.indices_nonzero(pc.invert(pc.is_in(kinds, pa.array(["CMP", "SEC", "FIN"]))))
    refuse(unknown, [f"unknown record type {k!r}" for k in kinds.take(unknown).to_pylist()])
    tables: dict[str, pa.Table] = {}
    for kind, fields in (("CMP", CMP_FIELDS), ("SEC", SEC_FIELDS)):
        rows = pc.indices_nonzero(pc.equal(kinds, kind))
        length = pc.utf8_length(pc.utf8_rtrim_whitespace(lines_arr.take(rows)))
        long = pc.greater(length, _WIDTH[kind])
        refuse(rows.filter(long), [f"{kind} record of {n} characters, longer than "
                                   f"{_WIDTH[kind]}" for n in length.filter(long).to_pylist()])
        rows = rows.filter(pc.invert(long))
        taken = lines_arr.take(rows)
        cols = [f[0] for f in fields]
        table, clean, masks = _typed([pc.utf8_slice_codeunits(taken, s - 1, e)
                                      for _, s, e in fields], cols, ("1", "0"))
        bad = _any(masks, len(rows))
        bad_rows = pc.indices_nonzero(bad).to_pylist()
        refuse(rows.take(pa.array(bad_rows, INT)), _reasons(bad_rows, clean, masks, cols))
        tables[kind] = table.filter(pc.invert(bad))
    sec = tables["SEC"]
    is_cik = pc.fill_null(pc.match_substring_regex(sec["conameorcik"], r"^\d{1,18}$"), False)
    sec = sec.append_column("co_cik", pc.cast(pc.if_else(is_cik, sec["conameorcik"],
                                                         pa.scalar(None, TEXT)), INT))
    sec = sec.append_column("co_name", pc.if_else(is_cik, pa.scalar(None, TEXT),
                                                  sec["conameorcik"]))
    rejected.sort()
    rejects = pa.table([[r[0] for r in rejected], [batch_id] * len(rejected),
                        [r[1] for r in rejected], [r[2] for r in rejected],
                        [r[3] for r in rejected]], schema=REJECT_SCHEMA)
    fin = pc.sum(pc.equal(kinds, "FIN")).as_py() or 0
    return FinwireRead(tables["CMP"], sec, rejects, fin)


# -- CustomerMgmt.xml -------------------------------------------------------------------------

CUSTOMER_MGMT_COLS = (
    _c("actiontype!"), _c("actionts!", TS), _c("c_id!", INT),
    *(c for c in _CUSTOMER if c.name not in ("c_id", "c_st_id")),
    _c("ca_id", INT), _c("ca_tax_st", I32), _c("ca_b_id", INT), _c("ca_name"))
_LEAVES = {name.upper(): name for name in (
    "c_l_name", "c_f_name", "c_m_name", "c_adline1", "c_adline2", "c_zipcode", "c_city",
    "c_state_prov", "c_ctry", "c_lcl_tx_id", "c_nat_tx_id", "ca_b_id", "ca_name")}
_LEAVES |= {"C_PRIM_EMAIL": "c_email_1", "C_ALT_EMAIL": "c_email_2"}
_PHONES_XML = {f"C_PHONE_{n}": {"C_CTRY_CODE": f"c_ctry_{n}", "C_AREA_CODE": f"c_area_{n}",
                                "C_LOCAL": f"c_local_{n}", "C_EXT": f"c_ext_{n}"}
               for n in (1, 2, 3)}
_ATTRS = {"ActionType": "actiontype", "ActionTS": "actionts", "C_ID": "c_id",
          "C_TAX_ID": "c_tax_id", "C_GNDR": "c_gndr", "C_TIER": "c_tier", "C_DOB": "c_dob",
          "CA_ID": "ca_id", "CA_TAX_ST": "ca_tax_st"}


class _Actions:
    """expat handlers that flatten each ``Action`` into one row of texts. An item the action
    does not carry is absent from the row (NULL); one present but empty is recorded in
    ``empty`` too, because for UPDCUST/UPDACCT "absent" means unchanged. Handlers are kept
    lean (one dict lookup for the common leaf element): they run ~30 times per action."""

    def __init__(self, parser: xml.parsers.expat.XMLParserType) -> None:
        self.parser = parser
        self.rows: list[dict[str, str]] = []
        self.empty: list[list[str]] = []
        self.spans: list[tuple[int, int, int]] = []   # start line, start byte, end byte
        self.row: dict[str, str] | None = None
        self.start = (0, 0)
        self.leaves = _LEAVES
        self.column: str | None = None
        self.text: list[str] = []

    def start_element(self, name: str, attrs: dict[str, str]) -> None:
        column = self.leaves.get(name)
        if column is not None:
            self.column, self.text = column, []
        elif name in _PHONES_XML:
            self.leaves = _PHONES_XML[name]
        elif attrs:
            if name.rpartition(" ")[2] == "Action":
                self.row = {}
                self.empty.append([])
                self.start = (self.parser.CurrentLineNumber, self.parser.CurrentByteIndex)
            for key, value in attrs.items():
                if key in _ATTRS:
                    self._set(_ATTRS[key], value)

    def end_element(self, name: str) -> None:
        if self.column is not None:
            self._set(self.column, "".join(self.text))
            self.column = None
        elif name in _PHONES_XML:
            self.leaves = _LEAVES
        elif self.row is not None and name.rpartition(" ")[2] == "Action":
            self.rows.append(self.row)
            self.spans.append((*self.start, self.parser.CurrentByteIndex))
            self.row = None

    def data(self, text: str) -> None:
        self.text.append(text)

    def _set(self, column: str, value: str) -> None:
        if self.row is None:
            return
        if not value.strip():
            self.empty[-1].append(column)
        self.row[column] = value


def _xml_raw(path: Path, start: int, end: int) -> str:
    """The text of one Action element, from its start tag to the end of its end tag."""
    with path.open("rb") as f:
        f.seek(start)
        blob = f.read(end - start + 256)
    close = blob.find(b">", end - start)
    return blob[:close + 1 if close >= 0 else len(blob)].decode("utf-8", "replace")


def read_customer_mgmt(path: str | PathLike[str], batch_id: int | None = None) -> SourceRead:
    """CustomerMgmt.xml: one row per Action, in file order, with ActionType, ActionTS and the
    fields the action carries (Customer.txt's column names; C_PRIM_EMAIL/C_ALT_EMAIL are
    c_email_1/2, phone parts c_ctry_n, c_area_n, c_local_n, c_ext_n). ``empty_fields`` lists
    the items present but empty. Streams with expat, so line numbers of refused actions are
    exact; a syntax error ends the read with one reject that says so."""
    path = Path(path)
    batch = _batch_of(path) if batch_id is None else batch_id
    parser = xml.parsers.expat.ParserCreate(namespace_separator=" ")
    actions = _Actions(parser)
    parser.buffer_text = True
    parser.StartElementHandler = actions.start_element
    parser.EndElementHandler = actions.end_element
    parser.CharacterDataHandler = actions.data
    rejected: list[tuple[int, str, str]] = []
    try:
        with path.open("rb") as f:
            parser.ParseFile(f)
    except xml.parsers.expat.ExpatError as exc:
        rejected.append((exc.lineno, "", f"XML error ({exc}); nothing after it was read"))
    cols = CUSTOMER_MGMT_COLS
    n = len(actions.rows)
    raw = [pa.array([row.get(c.name) for row in actions.rows], TEXT) for c in cols]
    table, clean, masks = _typed(raw, cols, ("1", "0"))
    table = table.append_column("empty_fields", pa.array(
        [e or None for e in actions.empty[:n]], pa.list_(TEXT)))
    bad = _any(masks, n)
    bad_rows = pc.indices_nonzero(bad).to_pylist()
    for row, reason in zip(bad_rows, _reasons(bad_rows, clean, masks, cols)):
        line, start, end = actions.spans[row]
        rejected.append((line, _xml_raw(path, start, end), reason))
    return SourceRead(str(path), table.filter(pc.invert(bad)),
                      _rejects(str(path), batch, rejected))
