"""The shapes a user hands a batch to the engine in (tuples, dicts, Arrow, pandas), with amounts
as Python floats (as typed: ``19.99``) or as Decimals. Every shape must give the same rows:
a value goes in exactly as the user wrote it (issue 34 item 10)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from benchmarks.model.dataflow import APPENDED, Record

SHAPES = ("tuples", "dicts", "arrow", "pandas")


def shaped(records: Sequence[Record], shape: str, floats: bool, appended: bool = False) -> Any:
    """``records`` as ``shape``; amounts as floats (the shortest decimal that reads back as the
    float is the record's amount) or as Decimals. ``appended``: with the appended columns
    (``dataflow.APPENDED``), once the program declares them."""
    amounts = [float(r.amt) if floats else r.amt for r in records]
    more = list(APPENDED) if appended else []
    if shape == "tuples":
        return [(r.rec, r.k, a, r.ts, *(getattr(r, c) for c in more))
                for r, a in zip(records, amounts)]
    if shape == "dicts":
        return [{"rec": r.rec, "k": r.k, "amt": a, "ts": r.ts,
                 **{c: getattr(r, c) for c in more}} for r, a in zip(records, amounts)]
    table = pa.table({
        "rec": pa.array([r.rec for r in records], pa.int64()),
        "k": pa.array([r.k for r in records], pa.int32()),
        "amt": pa.array(amounts, pa.float64() if floats else pa.decimal128(10, 2)),
        "ts": pa.array([r.ts for r in records], pa.timestamp("us")),
        **{c: pa.array([getattr(r, c) for r in records], pa.string()) for c in more},
    })
    return table if shape == "arrow" else table.to_pandas()
