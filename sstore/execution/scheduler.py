"""Which transaction execution runs next.

The rule is S-Store's: always the runnable (batch-id, topological position) that is smallest.
It keeps both orders (per procedure: batch b before b+1; per batch: upstream before downstream)
and pushes a batch through the whole graph before the next one starts.
"""

from __future__ import annotations

from sstore.storage.ledger import Ledger


class Scheduler:
    """``halted``: procedure -> why; a halted procedure (and so everything downstream of it,
    which waits for its batches) is never chosen. The engine fills it from ``sstore_sys.halts``
    when it starts, so a halt outlives the process until ``Engine.resume``."""

    def __init__(self, ledger: Ledger, topo_order: list[str]) -> None:
        self.ledger = ledger
        self.order = topo_order
        self.halted: dict[str, str] = {}

    def next(self) -> tuple[str, int] | None:
        best: tuple[int, int, str] | None = None
        for position, name in enumerate(self.order):
            if name in self.halted:
                continue
            batch_id = self.ledger.next_batch(name)
            if batch_id is not None and (best is None or (batch_id, position) < best[:2]):
                best = (batch_id, position, name)
        return None if best is None else (best[2], best[0])
