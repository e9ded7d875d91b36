"""``python -m benchmarks.tpcdi --profile``: where an sstore batch's time goes, per batch, by
phase, cheap enough to leave the numbers meaningful.

Sources, all public or the benchmark's own:

- the engine's commit observers (``Engine.observe``, ``runtime.CommitEvent``): for the ingest
  and every transaction execution (TE), its BEGIN-to-COMMIT ``seconds``, ``rows`` and
  ``rows_in``;
- timing wrappers installed for the run only (class level, restored afterwards, calls made by
  other threads ignored): ``Transaction.sql`` / ``Transaction.execute`` (a procedure's SQL,
  run and converted to Arrow) and ``duckdb.DuckDBPyConnection.commit`` (the COMMIT);
- the feed's own clock around ``ingest`` + ``run_until_idle`` and the sinks' delivery times
  (``tpcdi_runs.CommitProbe``).

Phases per batch (ms): ``ingest: append + commit records`` and ``ingest: COMMIT`` (the feed
uses ``Engine.ingest_and_run``: the ingest then leads the batch's group, and its COMMIT is
the group's); per
procedure ``SQL`` and ``outputs, stream appends`` (the TE's own seconds minus its SQL); the
group commit's COMMIT and its other closing steps (held-back rows, commit records), once per
group (with ``group_commit=False``: per procedure ``outputs, stream appends, commit records``
and ``COMMIT``); ``engine outside transactions`` (the feed's wall time minus every
transaction's seconds: scheduling, reading input batches, registering them, observers); and
``sinks: last commit -> visible in PostgreSQL`` (overlaps the next batches: the sinks run in
their own threads). Off (the default), nothing is wrapped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import duckdb
from rich.table import Table

from benchmarks.common import percentile
from sstore.execution.runtime import CommitEvent
from sstore.execution.transaction import Transaction

OUTSIDE = "engine outside transactions (scheduling, input reads)"
SINKS = "sinks: last commit -> visible in PostgreSQL"
TOTAL = "ingest + run_until_idle (the feed's wall time)"
GROUP_COMMIT = "group commit: COMMIT"
GROUP_CLOSING = "group commit: held-back rows, commit records"


class EngineProfile:
    """Per-batch phase times of one engine run (see the module docstring)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.batches: dict[int, dict[str, float]] = {}
        self.order: list[str] = []
        self._sql: dict[str, float] = {}  # procedure (None: not a TE) -> SQL seconds
        self._commit = 0.0
        self._group_at: float | None = None  # commit time of the group last counted
        self.active = False

    # -- collecting ------------------------------------------------------------------------------
    @contextmanager
    def installed(self) -> Iterator[None]:
        """Wrap the timed calls for the block's duration (this thread's calls only)."""
        wrapped = ((Transaction, "sql", "_sql"), (Transaction, "execute", "_sql"),
                   (duckdb.DuckDBPyConnection, "commit", "_commit"))
        originals = {(cls, name): getattr(cls, name) for cls, name, _ in wrapped}
        for cls, name, slot in wrapped:
            setattr(cls, name, self._timed(originals[(cls, name)], slot))
        self.active = True
        try:
            yield
        finally:
            self.active = False
            for (cls, name), fn in originals.items():
                setattr(cls, name, fn)

    def _timed(self, fn: Callable[..., Any], slot: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self.thread:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                took = time.perf_counter() - t0
                if slot == "_sql":  # a group runs several procedures before one COMMIT
                    key = getattr(args[0], "procedure", None) or ""
                    self._sql[key] = self._sql.get(key, 0.0) + took
                else:
                    self._commit += took
        return timed

    def observe(self, event: CommitEvent) -> None:
        """An ``Engine.observe`` observer: the transaction just committed gets the SQL and
        COMMIT time accumulated since the previous one."""
        if not self.active or threading.get_ident() != self.thread:
            return
        if event.kind == "ingest" and event.group > 1:  # it led a group: its own work only
            self._sql.pop("", None)
            parts = {"ingest: append + commit records": event.seconds,
                     "_transactions": event.seconds}
        elif event.kind == "ingest":
            commit, self._commit = self._commit, 0.0
            self._sql.pop("", None)
            parts = {"ingest: append + commit records": event.seconds - commit,
                     "ingest: COMMIT": commit}
            parts["_transactions"] = event.seconds
        else:
            sql = self._sql.pop(event.node, 0.0)
            parts = {f"{event.node}: SQL": sql}
            if event.group:  # its own work; the group's closing steps are counted once
                parts[f"{event.node}: outputs, stream appends"] = event.seconds - sql
                parts["_transactions"] = event.seconds
                if event.at != self._group_at:
                    self._group_at = event.at
                    commit, self._commit = self._commit, 0.0
                    parts[GROUP_COMMIT] = commit
                    parts[GROUP_CLOSING] = event.commit_seconds - commit
                    parts["_transactions"] += event.commit_seconds
            else:
                commit, self._commit = self._commit, 0.0
                parts[f"{event.node}: outputs, stream appends, commit records"] = \
                    event.seconds - sql - commit
                parts[f"{event.node}: COMMIT"] = commit
                parts["_transactions"] = event.seconds
        batch = self.batches.setdefault(event.batch_id, {})
        for name, seconds in parts.items():
            if name not in batch and name not in self.order and not name.startswith("_"):
                self.order.append(name)
            batch[name] = batch.get(name, 0.0) + seconds

    def end_batch(self, batch_id: int, wall: float) -> None:
        """The feed's wall time of ``batch_id`` (ingest + run_until_idle)."""
        batch = self.batches.setdefault(batch_id, {})
        batch[TOTAL] = wall
        batch[OUTSIDE] = wall - batch.get("_transactions", 0.0)

    # -- reporting -------------------------------------------------------------------------------
    def summary(self, batch_ids: list[int], sink_wait: dict[int, float]) -> dict[str, Any]:
        """ms per batch of each phase over ``batch_ids`` (the measured full-size batches);
        ``sink_wait``: seconds from a batch's last commit to its rows visible in PostgreSQL."""
        names = [*self.order, OUTSIDE, SINKS, TOTAL]
        rows = []
        for name in names:
            values = [(sink_wait[b] if name == SINKS else self.batches[b][name]) * 1000
                      for b in batch_ids if b in self.batches
                      and (b in sink_wait if name == SINKS else name in self.batches[b])]
            if values:
                rows.append({"phase": name, "p50_ms": round(percentile(values, 0.5), 3),
                             "mean_ms": round(sum(values) / len(values), 3),
                             "p99_ms": round(percentile(values, 0.99), 3),
                             "batches": len(values)})
        total = next((r["mean_ms"] for r in rows if r["phase"] == TOTAL), 0.0)
        for r in rows:
            r["share_of_wall"] = round(r["mean_ms"] / total, 4) \
                if total and r["phase"] not in (TOTAL, SINKS) else None
        return {"phases": rows, "batches": len(batch_ids), "definitions": __doc__}


def profile_table(records: list[dict[str, Any]]) -> Table:
    table = Table(title="sstore profile (--profile): ms per batch by phase, historical phase's "
                        "measured batches; share = of the mean wall time of ingest + "
                        "run_until_idle (sinks overlap the next batches)")
    for name in ("SF", "batch", "phase", "p50 ms", "mean ms", "p99 ms", "share"):
        table.add_column(name, justify="left" if name == "phase" else "right")
    for r in records:
        profile = r.get("profile")
        if not profile:
            continue
        for p in profile["phases"]:
            share = "" if p["share_of_wall"] is None else f"{p['share_of_wall']:.0%}"
            table.add_row(f"{r['scale_factor']:g}", r.get("batch_label", str(r["batch_trades"])),
                          p["phase"], f"{p['p50_ms']:,.2f}", f"{p['mean_ms']:,.2f}",
                          f"{p['p99_ms']:,.2f}", share)
        table.add_section()
    return table
