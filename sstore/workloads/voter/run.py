"""Drive the voter workload: feed votes batch by batch, run the dataflow, measure it.

Batch-ids are positions in ``votes`` (batch i gets id ``first_batch_id + i``), so running the
same votes again on the same state file resumes where the last run stopped: batches already in
the file are no-ops (exactly-once ingest) and only the rest is processed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sstore.base.errors import SStoreError
from sstore.engine import Engine
from sstore.workloads.voter.generator import batches
from sstore.workloads.voter.procedures import VOTES, voter_counts

Progress = Callable[[int, int], None]  # (votes handled so far, votes in total)


class VoterHalted(SStoreError):
    """A voter procedure halted on an error, so the run could not finish."""


def run_voter(engine: Engine, votes: pa.Table, batch_size: int,
              progress: Progress | None = None, *, first_batch_id: int = 1) -> dict[str, Any]:
    """Ingest ``votes`` in batches of ``batch_size``, running the dataflow after each one.

    Each batch is processed completely before the next arrives, as in a stream that trickles in.
    Returns what this run did: ``votes``/``batches`` newly ingested, ``skipped_votes``/
    ``skipped_batches`` already in the state, ``valid``, ``rejected`` (by reason), ``removed``
    contestants, ``executions`` (transaction executions), ``elapsed_s``, ``votes_per_s`` and
    ``executions_per_s``. Raises ``VoterHalted`` if a procedure halted.
    """
    before = voter_counts(engine)
    total = votes.num_rows
    done = new_votes = new_batches = skipped_votes = skipped_batches = 0
    started = time.perf_counter()
    executions = engine.run_until_idle()  # work a previous run ingested but did not finish
    for i, batch in enumerate(batches(votes, batch_size)):
        ingested = engine.ingest(VOTES, batch, batch_id=first_batch_id + i)
        done += batch.num_rows
        if ingested.duplicate:
            skipped_votes += batch.num_rows
            skipped_batches += 1
        else:
            new_votes += batch.num_rows
            new_batches += 1
            ran = engine.run_until_idle()
            executions += ran
            if ran == 0:  # nothing could run: something upstream has halted
                _raise_if_halted(engine)
        if progress is not None:
            progress(done, total)
    elapsed = time.perf_counter() - started
    _raise_if_halted(engine)
    after = voter_counts(engine)
    rejected = {reason: n - before["rejected"].get(reason, 0)
                for reason, n in after["rejected"].items()}
    return {
        "votes": new_votes, "batches": new_batches, "batch_size": batch_size,
        "skipped_votes": skipped_votes, "skipped_batches": skipped_batches,
        "valid": after["valid"] - before["valid"], "rejected": rejected,
        "removed": [c for c in after["removed"] if c not in before["removed"]],
        "executions": executions, "elapsed_s": elapsed,
        "votes_per_s": new_votes / elapsed if elapsed > 0 else 0.0,
        "executions_per_s": executions / elapsed if elapsed > 0 else 0.0,
    }


def _raise_if_halted(engine: Engine) -> None:
    status = engine.status()
    if status.halted():
        raise VoterHalted(f"voter procedure halted: {status.halt_report()}")
