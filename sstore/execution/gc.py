"""Automatic garbage collection of stream rows, window rows and old commit records.

A batch of a stream is removed once every reader has committed it: every consuming procedure,
and every external holder (a migrator that has not yet been acknowledged by its target). A
stream nobody reads keeps its latest batch, for pull readers. Windows keep the rows that the
oldest unprocessed slide still shows. Procedures keep only their newest commit record. Border
streams keep what makes re-sent batch-ids no-ops for good, but compacted: once ``COMPACT_EVERY``
batch-ids of collected batches have piled up, their commit records become runs of consecutive
batch-ids (``systables.compact_statements``; the newest record stays), so a service of weeks
keeps a few rows per stream instead of one per batch (one per batch only if its ids have gaps).

GC runs as its own transaction between transaction executions, never inside one, so it adds no
statements to the hot path. Its rhythm (``due``): every ``gc_every`` TEs, but, with the
engine's default rhythm, not sooner than ``MIN_SECONDS`` after the previous GC unless
``DEFER_MAX`` times that many TEs have piled up. A GC costs a transaction of a few DELETEs
(15-20 ms) whatever it removes: at 100-trade TPC-DI batches 64 TEs pass in half a second, and
collecting every second instead halves what GC adds to a batch, while what waits for it is
at most a second of batches. The same transaction records, per stream, the highest batch-id it
removed (``sstore_sys.collected``): a consumer that would need one of those batches later
learns that it starts after a gap instead of silently missing them (``sstore.storage.consumers``).
"""

from __future__ import annotations

import bisect
import time

from sstore.base.faults import crash_point
from sstore.base.sql import ident
from sstore.dataflow.windows import WindowState
from sstore.execution.runtime import Runtime
from sstore.storage import consumers, systables

#: compact a border stream's commit records once this many batch-ids of collected batches
#: wait (a few statements in the GC transaction, so not at every GC)
COMPACT_EVERY = 4096
#: with the default rhythm, a GC waits at least this long after the previous one ...
MIN_SECONDS = 1.0
#: ... unless this many times ``gc_every`` TEs have piled up since
DEFER_MAX = 16


def due(rt: Runtime, every: int, min_seconds: float) -> bool:
    """Whether GC should run now: ``every`` TEs since the last one and ``min_seconds`` since
    it (or ``DEFER_MAX`` times ``every`` TEs, whatever the time)."""
    if rt.since_gc < every:
        return False
    return (rt.since_gc >= every * DEFER_MAX
            or time.monotonic() - rt.gc_at >= min_seconds)


def collect(rt: Runtime, keep: dict[str, int] | None = None) -> int:
    """Remove what no reader needs any more. Returns the number of statements it ran.

    Weak durability logs each GC with ``bounds`` (stream -> lowest batch-id kept) before its
    COMMIT, and its replay passes them back as ``keep``: the bounds depend on consumers'
    acknowledgements and on when GC ran (the clock), neither of which replay has, and a
    stream's table must hold at replay what it held live (an ad hoc transaction reading it
    would otherwise do something else)."""
    rt.gc_at = time.monotonic()
    plan: list[tuple[str, list[object]]] = []
    trims: list[tuple[str, int]] = []
    window_lows: list[tuple[WindowState, int]] = []
    collected: list[tuple[str, int]] = []
    deleted: list[tuple[str, int]] = []
    commit_trims: list[tuple[str, int]] = []  # (stream, keep_from): one statement for all
    graph, ledger = rt.graph, rt.ledger
    bounds: dict[str, int] = {}
    for name in graph.streams:
        if rt.store.schema(name) is None:
            continue
        batches = ledger.node_batches(name)
        if keep is not None:
            if name not in keep:
                continue
            keep_from = keep[name]
        else:
            retained = ledger.retain_from(name)
            keep_from = retained if retained is not None else ledger.frontier(name) + 1
        if not batches.ids or batches.ids[0] >= keep_from:
            continue
        bounds[name] = keep_from
        if rt.store.may_hold_rows_before(name, keep_from):  # else: all passed in memory
            plan.append((f"DELETE FROM {ident(name)} WHERE _batch_id < ?", [keep_from]))
            deleted.append((name, keep_from))
        removed = batches.ids[bisect.bisect_left(batches.ids, keep_from) - 1]
        if ledger.collected.get(name, 0) < removed:  # a group may have recorded it already
            plan.append(systables.collected_statement(name, removed))
            collected.append((name, removed))
        if not graph.is_border(name):
            commit_trims.append((name, keep_from))
        trims.append((name, keep_from))
    if commit_trims:
        plan.append(("DELETE FROM sstore_sys.commits WHERE " + " OR ".join(
            ["(node = ? AND batch_id < ?)"] * len(commit_trims)),
            [v for trim in commit_trims for v in trim]))
    for name, state in rt.store.windows.items():
        batches = ledger.node_batches(name)
        readers = graph.consumers_of(name)
        done = min((ledger.progress.get(r, 0) for r in readers), default=None)
        first_open = batches.first_after(done) if done is not None else None
        number = batches.number(first_open) if first_open is not None else None
        # first_after answers one of the ids, and every id has a number
        promoted = number if number is not None else state.promoted
        low, _ = state.bounds(promoted)
        if low > state.collected_through:
            plan.append((f"DELETE FROM {ident(state.rows_table)} WHERE _seq <= ?", [low]))
            window_lows.append((state, low))
        cut = done if done is not None else (batches.ids[-1] - 1 if batches.ids else 0)
        if batches.ids and batches.ids[0] <= cut:  # slide records nobody will read again
            plan.append(("DELETE FROM sstore_sys.commits WHERE node = ? AND batch_id <= ?",
                         [name, cut]))
            trims.append((name, cut + 1))
    compacted: list[tuple[str, int]] = []
    newly = dict(collected)
    for name in graph.streams:
        if not graph.is_border(name):
            continue
        through = min(max(ledger.collected.get(name, 0), newly.get(name, 0)),
                      ledger.last_ingested.get(name, 0) - 1)  # the newest record stays
        if through - ledger.compacted.get(name, 0) >= COMPACT_EVERY:
            plan += systables.compact_statements(name, ledger.compacted.get(name, 0), through)
            compacted.append((name, through))
    if rt.since_gc:
        procs = sorted(set(graph.procedures) | {h for hs in ledger.holders.values() for h in hs})
        placeholders = ", ".join("?" * len(procs))
        if procs:
            plan.append((f"DELETE FROM sstore_sys.commits c WHERE node IN ({placeholders}) AND "
                         f"batch_id < (SELECT max(batch_id) FROM sstore_sys.commits m "
                         f"WHERE m.node = c.node)", list[object](procs)))
    acks = consumers.ack_records(rt.pending_acks)
    if acks:  # first: the acknowledgements this GC relies on commit with what it removes
        plan.insert(0, systables.insert_commits_statement(acks))
    if not plan:
        return 0
    con = rt.con
    logged: int | None = None
    con.begin()
    try:
        for sql, params in plan:
            con.execute(sql, params)
        if rt.input_log is not None and not rt.replaying:
            logged = rt.input_log.append_gc(bounds, rt.te_seq)
        crash_point("gc.before_commit")
        con.commit()
    except BaseException:
        con.rollback()
        if logged is not None and rt.input_log is not None:
            rt.input_log.undo(logged)
        raise
    consumers.acks_written(rt.pending_acks, acks)
    for name, keep_from in trims:
        ledger.node_batches(name).drop_through(keep_from - 1)
        rt.drop_committed(name, keep_from - 1)
    for name, removed in collected:
        ledger.collected[name] = max(ledger.collected.get(name, 0), removed)
    for name, keep_from in deleted:
        rt.store.deleted_before(name, keep_from)
    for name, through in compacted:
        ledger.compacted[name] = through
    for state, low in window_lows:
        state.collected_through = low
    rt.since_gc = 0
    return len(plan)
