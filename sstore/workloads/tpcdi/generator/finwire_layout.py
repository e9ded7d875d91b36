"""FINWIRE fixed-width record layouts (CMP 543, SEC 170/220, FIN 196/246 characters).

The positions are the specification (1-based, inclusive, from the layouts document); both the
writer and any reader use these tables, and ``parse_record`` exists so that tests and loaders
read records back by the same positions. The last field of SEC and FIN (CoNameOrCIK) is 10
characters for a CIK or 60 for a company name, hence two lengths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    """One fixed-width field: 1-based start, width, and whether numbers are right-aligned."""

    name: str
    start: int
    width: int
    right: bool = False

    @property
    def end(self) -> int:
        """1-based inclusive end position."""
        return self.start + self.width - 1


def _layout(*spec: tuple[str, int, bool]) -> tuple[Field, ...]:
    fields: list[Field] = []
    position = 1
    for name, width, right in spec:
        fields.append(Field(name, position, width, right))
        position += width
    return tuple(fields)


_HEAD = (("PTS", 15, False), ("RecType", 3, False))

CMP_FIELDS = _layout(
    *_HEAD, ("CompanyName", 60, False), ("CIK", 10, False), ("Status", 4, False),
    ("IndustryID", 2, False), ("SPrating", 4, False), ("FoundingDate", 8, False),
    ("AddrLine1", 80, False), ("AddrLine2", 80, False), ("PostalCode", 12, False),
    ("City", 25, False), ("StateProvince", 20, False), ("Country", 24, False),
    ("CEOname", 46, False), ("Description", 150, False))

_SEC_BODY = (
    ("Symbol", 15, False), ("IssueType", 6, False), ("Status", 4, False), ("Name", 70, False),
    ("ExID", 6, False), ("ShOut", 13, True), ("FirstTradeDate", 8, False),
    ("FirstTradeExchg", 8, False), ("Dividend", 12, True))
SEC_FIELDS_CIK = _layout(*_HEAD, *_SEC_BODY, ("CoNameOrCIK", 10, False))
SEC_FIELDS_NAME = _layout(*_HEAD, *_SEC_BODY, ("CoNameOrCIK", 60, False))

_FIN_BODY = (
    ("Year", 4, False), ("Quarter", 1, False), ("QtrStartDate", 8, False),
    ("PostingDate", 8, False), ("Revenue", 17, True), ("Earnings", 17, True),
    ("EPS", 12, True), ("DilutedEPS", 12, True), ("Margin", 12, True),
    ("Inventory", 17, True), ("Assets", 17, True), ("Liabilities", 17, True),
    ("ShOut", 13, True), ("DilutedShOut", 13, True))
FIN_FIELDS_CIK = _layout(*_HEAD, *_FIN_BODY, ("CoNameOrCIK", 10, False))
FIN_FIELDS_NAME = _layout(*_HEAD, *_FIN_BODY, ("CoNameOrCIK", 60, False))

CMP_LENGTH = CMP_FIELDS[-1].end                      # 543
SEC_LENGTHS = (SEC_FIELDS_CIK[-1].end, SEC_FIELDS_NAME[-1].end)   # 170, 220
FIN_LENGTHS = (FIN_FIELDS_CIK[-1].end, FIN_FIELDS_NAME[-1].end)   # 196, 246


def format_record(fields: tuple[Field, ...], values: Mapping[str, object]) -> str:
    """A full-width line; every field padded with spaces. Raises if a value is too long."""
    parts: list[str] = []
    for f in fields:
        text = str(values[f.name])
        if len(text) > f.width:
            raise ValueError(f"FINWIRE {f.name} {text!r} longer than {f.width}")
        parts.append(text.rjust(f.width) if f.right else text.ljust(f.width))
    return "".join(parts)


def company_reference(cik: str, name: str, by_name: bool) -> tuple[tuple[Field, ...], str]:
    """Which SEC layout and CoNameOrCIK value names a company by name or by CIK."""
    return (SEC_FIELDS_NAME, name) if by_name else (SEC_FIELDS_CIK, cik)


def parse_record(line: str) -> dict[str, str]:
    """The trimmed fields of one FINWIRE line (any line end stripped).

    CoNameOrCIK is read from its start up to 60 characters, so both lengths parse the same.
    """
    line = line.rstrip("\r\n")
    kind = line[15:18]
    if kind == "CMP":
        fields = CMP_FIELDS
    elif kind == "SEC":
        fields = SEC_FIELDS_NAME
    elif kind == "FIN":
        fields = FIN_FIELDS_NAME
    else:
        raise ValueError(f"unknown FINWIRE record type {kind!r}")
    return {f.name: line[f.start - 1:f.end].strip() for f in fields}
