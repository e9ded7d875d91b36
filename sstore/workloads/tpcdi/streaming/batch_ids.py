"""The engine batch-ids of the streaming DimTrade: TPC-DI batch ``b``'s chunks get ids in
``(b * ID_STRIDE, (b + 1) * ID_STRIDE)``, each the line number of its last event, so the ids grow
with the data whatever the chunk size, and a re-run sends the same ids (exactly once).

A module of its own because the pipeline, the backfill and the benchmarks all need it and the
backfill must not import the pipeline (it is imported by it).
"""

from __future__ import annotations

#: Engine batch-ids of TPC-DI batch ``b`` lie in ``(b * ID_STRIDE, (b + 1) * ID_STRIDE)``.
ID_STRIDE = 1_000_000_000


def engine_batch_id(tpcdi_batch: int, line_no: int) -> int:
    """The engine batch-id of a chunk of TPC-DI batch ``tpcdi_batch`` whose last event line is
    ``line_no`` (1-based): ids grow with the data, whatever the chunk size."""
    if tpcdi_batch < 1 or not 1 <= line_no < ID_STRIDE:
        raise ValueError(f"no engine batch-id for TPC-DI batch {tpcdi_batch}, line {line_no}")
    return tpcdi_batch * ID_STRIDE + line_no
