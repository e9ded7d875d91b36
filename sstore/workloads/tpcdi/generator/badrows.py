"""Malformed rows injected into the incremental Trade.txt files, and their manifest.

The streaming pipeline must route bad input to a reject table instead of failing or loading
it; these rows let a test check that it does. Each injected row is an ``I`` row of a trade id
above every valid one (so rejecting it leaves no trace in DimTrade), with exactly one defect:

- ``field_count``: 15 or 17 fields instead of 16
- ``bad_number``: T_QTY or T_BID_PRICE does not parse as a number
- ``bad_date``: T_DTS does not parse as a timestamp
- ``unknown_status`` / ``unknown_type``: a T_ST_ID / T_TT_ID code that does not exist
- ``unknown_symbol`` / ``unknown_account``: a well-formed symbol / account id that no FINWIRE
  record / no account has

Kinds are dealt in this order (so 7 rows cover all kinds), alternately to Batch2 and Batch3,
at random positions. Injection draws from its own random stream and does not touch the valid
rows, so removing the manifest's lines gives back the files of a run without ``bad_rows``; the
audit counts describe the valid rows only. ``bad_rows.json`` lists every injected row.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .dates import SECONDS_PER_DAY, batch_start, date_of_day, format_datetime
from .rand import UPPER
from .report import FileReport

MANIFEST = "bad_rows.json"
KINDS = ("field_count", "bad_number", "bad_date", "unknown_status", "unknown_type",
         "unknown_symbol", "unknown_account")
_FIELDS = ("CDC_FLAG", "CDC_DSN", "T_ID", "T_DTS", "T_ST_ID", "T_TT_ID", "T_IS_CASH",
           "T_S_SYMB", "T_QTY", "T_BID_PRICE", "T_CA_ID", "T_EXEC_NAME", "T_TRADE_PRICE",
           "T_CHRG", "T_COMM", "T_TAX")


@dataclass(frozen=True)
class BadRow:
    """One injected row: where it is (1-based line), what is wrong, and its exact text."""

    batch: int
    file: str
    line: int
    kind: str
    field: str
    t_id: int
    text: str


@dataclass(frozen=True)
class Context:
    """Valid values to build bad rows around, and ids guaranteed to be unknown."""

    first_t_id: int
    symbols: tuple[str, ...]
    account_ids: np.ndarray
    brokers: np.ndarray


def _row(kind: str, t_id: int, batch: int, ctx: Context, rng: np.random.Generator,
         serial: int) -> tuple[str, str]:
    """(defective field name, line text) of one bad row."""
    moment = batch_start(batch) + int(rng.integers(0, SECONDS_PER_DAY))
    limit = bool(rng.random() < 0.5)
    fields = ["I", str(4 * t_id + (0 if limit else 1)), str(t_id), format_datetime(moment),
              "PNDG" if limit else "SBMT", str(rng.choice(["TLB", "TLS"] if limit else
                                                       ["TMB", "TMS"])),
              str(int(rng.random() < 0.2)), ctx.symbols[int(rng.integers(0, len(ctx.symbols)))],
              str(int(rng.integers(10, 10_001))), f"{rng.integers(101, 1_001) / 100:.2f}",
              str(int(ctx.account_ids[int(rng.integers(0, len(ctx.account_ids)))])),
              str(int(ctx.brokers[int(rng.integers(0, len(ctx.brokers)))])), "", "", "", ""]
    name = "-"
    if kind == "field_count":
        if rng.random() < 0.5:
            fields.pop()
        else:
            fields.append("0.00")
    elif kind == "bad_number":
        name = "T_QTY" if rng.random() < 0.5 else "T_BID_PRICE"
        fields[_FIELDS.index(name)] = "12O4" if name == "T_QTY" else "9.9.9"
    elif kind == "bad_date":
        name = "T_DTS"
        day = date_of_day(moment // SECONDS_PER_DAY)
        fields[3] = (f"{day.isoformat()} 25:61:99" if rng.random() < 0.5
                     else f"{day.day:02d}/{day.month:02d}/{day.year} noon")
    elif kind == "unknown_status":
        name, fields[4] = "T_ST_ID", "XXXX"
    elif kind == "unknown_type":
        name, fields[5] = "T_TT_ID", "TXX"
    elif kind == "unknown_symbol":
        known = set(ctx.symbols)
        symbol = ctx.symbols[0]
        while symbol in known:
            symbol = "ZZZZZZZZZZ" + "".join(UPPER[int(i)] for i in rng.integers(0, 26, 5))
        name, fields[7] = "T_S_SYMB", symbol
    elif kind == "unknown_account":
        name = "T_CA_ID"
        fields[10] = str(int(ctx.account_ids.max()) + 1_000_000 + serial)
    else:
        raise ValueError(f"unknown bad-row kind {kind!r}")
    return name, "|".join(fields)


def inject_bad_rows(lines: dict[int, list[str]], count: int, ctx: Context,
                    rng: np.random.Generator) -> tuple[dict[int, list[str]], tuple[BadRow, ...]]:
    """The incremental Trade.txt lines with ``count`` bad rows inserted, and what they are."""
    if count < 0:
        raise ValueError(f"bad_rows must be >= 0, got {count}")
    planned: dict[int, list[tuple[str, str, int, str]]] = {2: [], 3: []}
    for i in range(count):
        batch = 2 if i % 2 == 0 else 3
        kind = KINDS[i % len(KINDS)]
        t_id = ctx.first_t_id + i
        name, text = _row(kind, t_id, batch, ctx, rng, i)
        planned[batch].append((kind, name, t_id, text))
    out: dict[int, list[str]] = {}
    rows: list[BadRow] = []
    for batch, valid in lines.items():
        bad = planned.get(batch, [])
        positions = np.sort(rng.integers(0, len(valid) + 1, len(bad))).tolist()
        merged: list[str] = []
        start = 0
        for position, (kind, name, t_id, text) in zip(positions, bad):
            merged += valid[start:position]
            start = position
            merged.append(text)
            rows.append(BadRow(batch, f"Batch{batch}/Trade.txt", len(merged), kind, name, t_id,
                               text))
        merged += valid[start:]
        out[batch] = merged
    rows.sort(key=lambda r: (r.batch, r.line))
    return out, tuple(rows)


def write_manifest(root: Path, rows: tuple[BadRow, ...], scale_factor: float,
                   seed: int) -> FileReport:
    """Write ``bad_rows.json`` beside the batch folders (always, also when empty)."""
    path = root / MANIFEST
    document = {
        "description": "Malformed rows injected into incremental Trade.txt files; audit "
                       "counts exclude them. line is 1-based.",
        "scale_factor": scale_factor, "seed": seed, "count": len(rows),
        "kinds": list(KINDS), "rows": [asdict(r) for r in rows],
    }
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return FileReport(MANIFEST, len(rows), path.stat().st_size)
