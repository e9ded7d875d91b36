"""CustomerMgmt.xml: one row per Action, streamed with expat (exact line numbers for refused
actions)."""

from __future__ import annotations

import xml.parsers.expat
from os import PathLike
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from sstore.workloads.tpcdi.sources.convert import (
    any_refused,
    batch_of,
    refusal_reasons,
    reject_table,
    typed_columns,
)
from sstore.workloads.tpcdi.sources.layouts import (
    CUSTOMER_FIELDS,
    I32,
    INT,
    TEXT,
    TS,
    SourceRead,
    col,
)

CUSTOMER_MGMT_COLS = (
    col("actiontype!"), col("actionts!", TS), col("c_id!", INT),
    *(c for c in CUSTOMER_FIELDS if c.name not in ("c_id", "c_st_id")),
    col("ca_id", INT), col("ca_tax_st", I32), col("ca_b_id", INT), col("ca_name"))
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
    batch = batch_of(path) if batch_id is None else batch_id
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
    table, clean, masks = typed_columns(raw, cols, ("1", "0"))
    table = table.append_column("empty_fields", pa.array(
        [e or None for e in actions.empty[:n]], pa.list_(TEXT)))
    bad = any_refused(masks, n)
    bad_rows = pc.indices_nonzero(bad).to_pylist()
    for row, reason in zip(bad_rows, refusal_reasons(bad_rows, clean, masks, cols)):
        line, start, end = actions.spans[row]
        rejected.append((line, _xml_raw(path, start, end), reason))
    return SourceRead(str(path), table.filter(pc.invert(bad)),
                      reject_table(str(path), batch, rejected))
