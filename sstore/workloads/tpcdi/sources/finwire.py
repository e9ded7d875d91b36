"""FINWIRE: quarterly files of fixed-width CMP, SEC and FIN records (FIN is counted and
skipped: DimTrade does not need financials)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sstore.base.errors import TerminalError
from sstore.workloads.tpcdi.sources.convert import (
    any_refused,
    refusal_reasons,
    split_lines,
    typed_columns,
)
from sstore.workloads.tpcdi.sources.layouts import (
    DATE,
    FINWIRE_NAME,
    INT,
    MONEY,
    REJECT_SCHEMA,
    TEXT,
    TS,
    Col,
    col,
)


def _fw(spec: str, start: int, end: int, type_: pa.DataType = TEXT) -> tuple[Col, int, int]:
    """A fixed-width field at 1-based inclusive positions; FINWIRE dates are yyyymmdd."""
    fmt = {DATE: "%Y%m%d", TS: "%Y%m%d-%H%M%S"}.get(type_)
    return col(spec, type_, fmt), start, end


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


class FinwireNameError(TerminalError):
    """A file in a Batch folder looks like FINWIRE data but is not named as DIGen names it."""


def finwire_files(directory: str | PathLike[str]) -> list[Path]:
    """The quarterly FINWIRE files (``FINWIRE<YYYY>Q<1-4>``) in quarter order; never an audit
    CSV (``FINWIRE1967Q1_audit.csv``, ``FINWIRE_audit.csv``).

    Any other file whose name starts with FINWIRE, in any case (``FINWIRE_1967Q1``,
    ``finwire1967q1``, ``FINWIRE1967Q5``, ``FINWIRE1967Q1.bak``), raises ``FinwireNameError``
    naming it: it is most likely a quarter the user meant to load, and skipping it would load
    the companies and securities without it, rows missing with nothing said."""
    files, misnamed = [], []
    for path in Path(directory).iterdir():
        if not path.is_file() or not path.name.upper().startswith("FINWIRE"):
            continue
        if FINWIRE_NAME.fullmatch(path.name):
            files.append(path)
        elif not path.name.endswith("_audit.csv"):
            misnamed.append(path.name)
    if misnamed:
        raise FinwireNameError(
            f"{directory}: {', '.join(sorted(misnamed))} look like FINWIRE but are not named "
            f"FINWIRE<YYYY>Q<1-4> (as DIGen names the quarterly files, e.g. FINWIRE1967Q1); "
            f"rename each to its quarter, or move it out of the folder if it is not data")
    return sorted(files)


@dataclass(frozen=True)
class FinwireRead:
    """CMP and SEC records in posting order; FIN records are counted, not returned.

    ``file_counts`` has, per file in quarter order, how many lines carry each record type
    (CMP, SEC, FIN; refused lines included): what DIGen's per-quarter
    ``FINWIRE<YYYY>Q<n>_audit.csv`` states as FW_CMP, FW_SEC and FW_FIN."""

    cmp: pa.Table
    sec: pa.Table
    rejects: pa.Table
    fin_records: int
    file_counts: tuple[tuple[str, dict[str, int]], ...] = ()

    @property
    def rows_in(self) -> int:
        return int(self.cmp.num_rows + self.sec.num_rows + self.rejects.num_rows + self.fin_records)


def read_finwire(directory: str | PathLike[str], batch_id: int = 1) -> FinwireRead:
    """Every FINWIRE file of a Batch1 folder. A line shorter than its record's width is
    read as if space-padded (DIGen may trim it); a longer one is refused. Lines are sorted
    by kind with Arrow, so the FIN bulk (~97% of the lines) costs no Python work."""
    files = finwire_files(directory)
    numbers, texts, owners = [], [], []
    rejected: list[tuple[str, int, str, str]] = []
    for k, path in enumerate(files):
        nums, lines, bad = split_lines(path.read_bytes())
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
        table, clean, masks = typed_columns([pc.utf8_slice_codeunits(taken, s - 1, e)
                                      for _, s, e in fields], cols, ("1", "0"))
        bad = any_refused(masks, len(rows))
        bad_rows = pc.indices_nonzero(bad).to_pylist()
        refuse(rows.take(pa.array(bad_rows, INT)), refusal_reasons(bad_rows, clean, masks, cols))
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
    return FinwireRead(tables["CMP"], sec, rejects, fin, _file_counts(files, owner_arr, kinds))


def _file_counts(files: Sequence[Path], owners: np.ndarray, kinds: pa.Array
                 ) -> tuple[tuple[str, dict[str, int]], ...]:
    """Lines per record type per file (one vectorised count per type)."""
    out = []
    per_kind = {k: np.bincount(owners[pc.equal(kinds, k).to_numpy(zero_copy_only=False)],
                               minlength=len(files)) for k in ("CMP", "SEC", "FIN")}
    for i, path in enumerate(files):
        out.append((str(path), {k: int(v[i]) for k, v in per_kind.items()}))
    return tuple(out)
