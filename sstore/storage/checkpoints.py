"""DuckDB checkpoints on the engine's terms: after a commit or when idle, never inside a TE.

DuckDB checkpoints by itself at COMMIT once its write-ahead log has grown past
``checkpoint_threshold`` (16 MiB by default). Under a streaming load that lands inside some
unlucky transaction execution: measured here, 10,000-row batches that upsert into a keyed state
table took 2.8 s for 60 batches with DuckDB's own checkpoints (a COMMIT of up to 443 ms) and
1.1 s with them moved out (COMMITs of at most 15 ms, then one 0.4 s checkpoint).

So a file-backed engine turns DuckDB's automatic checkpoint off and runs ``CHECKPOINT`` itself:

- after a commit (an ingest, a group of TEs, GC, an ad hoc transaction, ``Engine.execute``,
  ``Engine.load_table``: ``adhoc.checkpoint_if_due``), when the WAL holds ``wal_limit``
  bytes or more: the WAL, and so the replay after a crash, stays bounded;
- when the engine is idle (``Engine.run`` waiting for input) and the WAL holds ``idle_bytes``
  or more: the work is done while nothing waits for it.

A checkpoint takes the engine lock like any transaction, so a batch that arrives meanwhile waits
for it; it never runs between the statements of a transaction.
"""

from __future__ import annotations

import logging
import os
import time

import duckdb

log = logging.getLogger("sstore")

WAL_LIMIT_BYTES = 256 << 20
IDLE_BYTES = 8 << 20
DUCKDB_OFF = "1TB"  # DuckDB's own threshold, far above ours: it never checkpoints by itself


class Checkpoints:
    """Counts what it did (``count``, ``seconds``) for status and metrics."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: str,
                 wal_limit: int = WAL_LIMIT_BYTES, idle_bytes: int = IDLE_BYTES) -> None:
        self._con = con
        self._wal = path + ".wal"
        self.wal_limit = wal_limit
        self.idle_bytes = idle_bytes
        self.count = 0
        self.seconds = 0.0
        con.execute(f"SET checkpoint_threshold = '{DUCKDB_OFF}'")

    def wal_bytes(self) -> int:
        try:
            return os.path.getsize(self._wal)
        except OSError:  # no WAL: nothing was written since the last checkpoint
            return 0

    def after_commit(self) -> bool:
        """Checkpoint if the WAL has reached its limit. Caller holds the engine lock and no
        transaction is open."""
        return self._checkpoint_from(self.wal_limit, "the WAL reached its limit")

    def when_idle(self) -> bool:
        """Checkpoint if there is anything worth it. Caller holds the engine lock."""
        return self._checkpoint_from(self.idle_bytes, "idle")

    def _checkpoint_from(self, threshold: int, why: str) -> bool:
        size = self.wal_bytes()
        if size < threshold:
            return False
        began = time.perf_counter()
        self._con.execute("CHECKPOINT")
        took = time.perf_counter() - began
        self.count += 1
        self.seconds += took
        log.debug("checkpoint (%s, WAL %.1f MiB) in %.0f ms", why, size / 2**20, took * 1e3)
        return True
