"""Group commit: the transaction executions (TEs) of one batch, one after another, committed as
one DuckDB transaction.

A batch usually flows through a chain of procedures at once (the scheduler runs batch b through
the whole graph before b+1). Committing each TE on its own costs a COMMIT (a WAL fsync), a
commit-record statement and an intermediate stream append per procedure. A group runs the
runnable TEs of batch b in schedule order inside one transaction and commits them together:

1. BEGIN; open the ledger's journal.
   b. ``ingest_and_run`` only: append the ingested batch (the group's lead) and record it.
2. For each member, in the order the scheduler picks them (each time the smallest runnable
   (batch, position), so the order is exactly the one-at-a-time order):
   a. its inputs: a batch produced earlier in the group comes from memory, any other one as in
      a single TE (``Runtime.input_batch``);
   b. call the procedure, check its outputs;
   c. append its outputs (triggers, windows). The rows of a stream that nothing can read from
      its table are held back in memory (``StreamStore.append(store_rows=False)``), as
      ``sstore.execution.passing`` decides; a later statement of a member that may read them stores
      them first (``_before_statement``);
   d. record its commits in the ledger's journal, so the scheduler sees it done and can pick
      the next member. The group ends when the next runnable TE belongs to another batch, at
      ``limit`` members, or after a member that created a stream or moved a window (their
      in-memory state is applied only after COMMIT).
3. Store the held-back rows of every stream that has a reader outside the group (of every
   stream, if the group was cut short); record the others as collected (a consumer that
   starts on such a stream later gets ``GapError``).
4. Insert all members' commit records in one statement, with the consumers' acknowledgements
   taken since the last such statement (``sstore.storage.consumers``, step 3).
5. COMMIT; close the journal.
6. Apply each member to memory (windows, cache, subscribers) and tell the observers.

Every TE keeps its own guarantees: a member's effects are all in the group's COMMIT or none of
them is; a crash before step 5 leaves nothing (every member runs again), after it the commit
records say each member ran. A member that fails rolls the whole group back (DuckDB has no
savepoints); then the members before it run again as a group of their own and the failing one
runs alone (``executor.run_te``), with its retries and error policy, exactly as without groups.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from sstore.base.faults import crash_point
from sstore.dataflow import fusion
from sstore.dataflow.graph import ProcedureDecl
from sstore.execution import executor, passing
from sstore.execution.interrupts import Reason, Stopped, TimedOut
from sstore.execution.runtime import CommitEvent, Runtime
from sstore.execution.transaction import Transaction
from sstore.storage import consumers, systables
from sstore.storage.streams import PendingCommit

MAX_MEMBERS = 64  # a group never holds more TEs than this (bounds the work lost to a failure)


@dataclass
class _Member:
    decl: ProcedureDecl
    tx: Transaction
    pending: PendingCommit
    rows_in: int
    rows_out: int = 0
    seconds: float = 0.0


@dataclass
class _Group:
    batch_id: int
    members: list[_Member] = field(default_factory=list)
    produced: dict[str, pa.Table] = field(default_factory=dict)  # this batch of each output
    held_back: dict[str, pa.Table] = field(default_factory=dict)  # outputs not stored yet
    commit_seconds: float = 0.0  # steps 3-5
    unstored: list[str] = field(default_factory=list)  # held back for good: collected
    #: SQL procedures may be chained in this attempt (``sstore.dataflow.fusion``), up to ``most``
    #: TEs
    chaining: bool = False
    most: int = MAX_MEMBERS
    #: the chain waiting for its next procedure: (stream, composed SELECT, its reader)
    chained: tuple[str, str, str] | None = None
    chain_rows: int = 0  # rows of the chain's first input
    #: (stream, reader) of every batch chained away in this group: never materialized
    chained_away: list[tuple[str, str]] = field(default_factory=list)
    #: a member's statement may read a chained-away batch: run the group again unchained
    unchain: bool = False
    #: the group ended before every runnable TE of its batch ran (``_next_member``)
    cut: bool = False

    def names(self) -> set[str]:
        return {m.decl.name for m in self.members}


@dataclass
class Lead:
    """An ingest that opens a group (``ingest_and_run``): its batch is appended in the group's
    transaction before the first member, and commits with the members or not at all."""

    stream: str
    table: pa.Table
    #: the batch's fingerprint (``sstore.base.fingerprint.soon``: maybe still being computed),
    #: recorded with it at the end of the group
    fingerprint: Callable[[], int]
    pending: PendingCommit = field(default_factory=PendingCommit)
    seconds: float = 0.0


class _LeadFailed(Exception):
    """The lead ingest itself failed (the batch breaks a constraint, say): the caller gets
    ``error`` exactly as from a plain ingest."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _GroupFailed(Exception):
    """The group rolled back because of ``error``; ``chain`` names its members in order, the
    last one being the member that failed (or, for a failure after every member had run, the
    last member)."""

    def __init__(self, chain: list[str], error: Exception) -> None:
        super().__init__(f"{chain[-1] if chain else 'the group'} failed: {error}")
        self.chain = chain
        self.error = error


def run_batch(rt: Runtime, name: str, batch_id: int, limit: int | None = None) -> None:
    """Run TE (``name``, ``batch_id``) and the TEs of the same batch that become runnable after
    it, as one group (at most ``limit`` TEs: weak durability's replay must not run past a
    logged input). Caller holds ``rt.lock``. Raises ``Stopped`` like ``executor.run_te``."""
    most = MAX_MEMBERS if limit is None else min(limit, MAX_MEMBERS)
    if most <= 1:
        executor.run_te(rt, name, batch_id)
        return
    try:
        _run_group(rt, name, batch_id, most, fixed=None)
        return
    except _GroupFailed as failed:
        chain, error = failed.chain, failed.error
    if len(chain) > 1:
        try:
            _run_group(rt, name, batch_id, len(chain) - 1, fixed=chain[:-1])
        except _GroupFailed:
            # members that succeeded a moment ago failed now: no group, one TE at a time
            executor.run_te(rt, name, batch_id)
            return
    executor.run_te(rt, chain[-1], batch_id, first_failure=error)


def ingest_and_run(rt: Runtime, stream: str, batch_id: int, table: pa.Table,
                   fingerprint: Callable[[], int], ingest_alone: Callable[[], None]) -> None:
    """Ingest batch ``batch_id`` of border stream ``stream`` and run the TEs of that batch that
    become runnable, all in one DuckDB transaction: the ingest is the group's lead (step 1b of
    the module docstring) and its rows, when only the group's members read them, are never
    stored. Caller holds ``rt.lock`` and has checked the batch-id (new, in order);
    ``fingerprint`` gives the batch's fingerprint (``sstore.base.fingerprint.soon``), recorded with
    it.

    If anything fails, everything rolls back and the work is done the way ``ingest`` followed
    by ``run_until_idle`` does it: a batch the stream refuses raises its error and nothing is
    recorded; otherwise ``ingest_alone()`` commits the batch on its own, the members before
    the failing one run again as a group and the failing one alone with its first failure
    (``run_batch``'s recovery). A stop request (``Stopped``) also commits the batch alone
    first: the client handed it over, the engine keeps it."""
    lead = Lead(stream, table, fingerprint)
    try:
        _run_group(rt, None, batch_id, MAX_MEMBERS, fixed=None, lead=lead)
        return
    except _GroupFailed as failed:
        chain, error = failed.chain, failed.error
    except Stopped:
        ingest_alone()
        raise
    ingest_alone()
    if not chain:
        return
    if len(chain) > 1:
        try:
            _run_group(rt, chain[0], batch_id, len(chain) - 1, fixed=chain[:-1])
        except _GroupFailed:
            return  # the caller's run_until_idle runs them one at a time
    executor.run_te(rt, chain[-1], batch_id, first_failure=error)


def _append_lead(rt: Runtime, group: _Group, lead: Lead, most: int) -> str | None:
    """Step 1b: append the lead's batch (held back like a member's output when only
    procedures read it) and record it, so that the scheduler sees the batch; return the first
    member, or None if no TE of this batch is runnable next."""
    began = time.perf_counter()
    hold = _can_hold_back(rt, lead.stream)
    try:
        rt.store.append(lead.stream, group.batch_id, lead.table, lead.pending,
                        store_rows=not hold)
    except BaseException as exc:
        raise _LeadFailed(exc) from exc
    if hold:
        group.held_back[lead.stream] = lead.table
    group.produced[lead.stream] = lead.table
    for node, batch, number in lead.pending.records:
        rt.ledger.record(node, batch, number)
    lead.seconds = time.perf_counter() - began
    if most < 1 or lead.pending.created or lead.pending.window_updates:
        return None  # their in-memory state is applied after COMMIT only
    nxt = rt.scheduler.next()
    return nxt[0] if nxt is not None and nxt[1] == group.batch_id else None


def _run_group(rt: Runtime, name: str | None, batch_id: int, most: int,
               fixed: list[str] | None, lead: Lead | None = None, chain: bool = True) -> None:
    """Steps 1-6 of the module docstring; raises ``_GroupFailed`` after rolling back (the
    lead's own error, unwrapped, if the lead ingest is what failed). ``chain``: SQL
    procedures may be chained (``sstore.dataflow.fusion``); an attempt that chained and failed runs
    again without, so that failures are met and blamed exactly as without chaining."""
    con = rt.con
    group = _Group(batch_id, chaining=chain and fixed is None and rt.chaining.enabled,
                   most=most)
    rt.ledger.begin_journal()
    con.begin()  # step 1
    try:
        current: str | None = name
        if lead is not None:
            current = _append_lead(rt, group, lead, most)
        while current is not None:  # step 2
            member = _run_member(rt, group, rt.graph.procedures[current])
            group.members.append(member)
            for node, batch, number in member.pending.records:  # d.
                rt.ledger.record(node, batch, number)
            current = _next_member(rt, group, most, fixed)
            if group.chained is not None and current != group.chained[2]:
                raise _Unchain(f"the group of batch {batch_id} would end before "
                               f"{group.chained[2]!r} reads its chained input")
        closing = time.perf_counter()
        _store_held_back(rt, group)  # step 3
        records = [r for m in group.members for r in m.pending.records]
        acks = consumers.ack_records(rt.pending_acks)  # written with them, no COMMIT of their own
        if lead is not None:  # waited for only now: computed meanwhile on another core
            lead.pending.fingerprints[(lead.stream, batch_id)] = lead.fingerprint()
        systables.insert_commits(con, (records if lead is None else lead.pending.records + records)
                                 + acks, None if lead is None else lead.pending.fingerprints)
        crash_point("te.before_commit")
        con.commit()  # step 5
        group.commit_seconds = time.perf_counter() - closing
    except BaseException as exc:
        reason = rt.interrupts.disarm(quiet=True)
        con.rollback()
        rt.ledger.rollback_journal()
        for member in group.members:
            member.tx._mark_rolled_back()
            rt.store.forget(member.pending)
        if lead is not None:
            rt.store.forget(lead.pending)
            if isinstance(exc, _LeadFailed):
                raise exc.error from None  # the batch itself was refused: nothing ran
        members = [m.decl.name for m in group.members]
        if isinstance(exc, _MemberRun):
            members.append(exc.name)
            exc = exc.error
        if reason is Reason.STOP or isinstance(exc, Stopped) or rt.interrupts.stopping():
            raise Stopped(f"stopped: the group of batch {batch_id} rolled back") from exc
        if not isinstance(exc, Exception):
            raise exc  # noqa: TRY201 (exc is the member's own error, unwrapped above)
        if group.chained_away or group.chained is not None:
            again = None if lead is None else Lead(lead.stream, lead.table, lead.fingerprint)
            return _run_group(rt, name, batch_id, most, fixed, again, chain=False)
        raise _GroupFailed(members, exc) from exc
    rt.ledger.end_journal()
    consumers.acks_written(rt.pending_acks, acks)
    crash_point("te.after_commit")
    _apply(rt, group, lead)  # step 6


class _Unchain(Exception):
    """A chained batch's reader is not the group's next member: run the group unchained."""


class _MemberRun(Exception):
    """A member's own failure, as opposed to one of the group's closing steps."""

    def __init__(self, name: str, error: BaseException) -> None:
        super().__init__(str(error))
        self.name = name
        self.error = error


def _run_member(rt: Runtime, group: _Group, decl: ProcedureDecl) -> _Member:
    con, guard, batch_id = rt.con, rt.interrupts, group.batch_id
    chained_in: str | None = None  # the SELECT this member reads as ``batch`` (a chain's)
    if group.chained is not None and group.chained[2] == decl.name:
        chained_in, group.chained = group.chained[1], None
        inputs: dict[str, pa.Table] = {}  # ``batch`` is still the chain's first input
        rows_in = group.chain_rows
    else:
        inputs = {node: group.produced[node] if node in group.produced
                  else rt.input_batch(node, batch_id) for node in decl.inputs}  # a.
        rows_in = sum(t.num_rows for t in inputs.values())
    member = _Member(decl, Transaction(con, batch_id, decl.name, rows_in=rows_in,
                                       streams=rt.stream_tables,
                                       before=functools.partial(_before_statement, rt, group),
                                       digests=rt.input_log is not None),
                     PendingCommit(), rows_in)
    began = time.perf_counter()
    reader = _chain_reader(rt, group, decl)
    if reader is not None:  # chained: runs nothing now (sstore.dataflow.fusion)
        assert decl.sql is not None
        if chained_in is None:
            executor.register_inputs(con, inputs)
            group.chain_rows = rows_in
        stream = decl.outputs[0]
        group.chained = (stream, decl.sql if chained_in is None
                         else fusion.over(chained_in, decl.sql), reader)
        group.chained_away.append((stream, reader))
        member.pending.records += [(stream, batch_id, 0), (decl.name, batch_id, 0)]
        member.seconds = time.perf_counter() - began
        return member
    try:
        executor.register_inputs(con, inputs)
        guard.arm(con, decl.timeout)
        guard.check()
        with guard.procedure_code():  # b.
            if chained_in is not None:
                assert decl.sql is not None
                result: object = member.tx.sql(fusion.over(chained_in, decl.sql))
            else:
                result = decl.fn(member.tx, inputs[decl.inputs[0]] if len(inputs) == 1
                                 else dict(inputs))
        if member.tx.failure is not None:  # it caught a failed statement: DuckDB aborted
            raise member.tx.failure
        if group.unchain:
            raise _Unchain(f"{decl.name!r} read a chained-away batch from its table")
        outputs = executor.check_outputs(rt, decl, batch_id, result)
        member.tx._note_outputs(outputs)
        if decl.sql is not None and chained_in is None:
            rt.chaining.learn(decl.name, result, outputs[decl.outputs[0]])
        for stream, table in outputs.items():  # c.
            hold = _can_hold_back(rt, stream)
            rt.store.append(stream, batch_id, table, member.pending, store_rows=not hold)
            if hold:
                group.held_back[stream] = table
            group.produced[stream] = table
        member.rows_out = sum(t.num_rows for t in outputs.values())
        member.pending.records.append((decl.name, batch_id, member.rows_out))
        guard.disarm()  # raises if the member was interrupted meanwhile
    except BaseException as exc:
        reason = guard.disarm(quiet=True)
        rt.store.forget(member.pending)
        error: BaseException = exc
        if member.tx.failure is not None and isinstance(exc, Exception):
            error = member.tx.failure  # the statement it caught, not what failed after it
        if reason is Reason.TIMEOUT:
            assert decl.timeout is not None
            error = TimedOut(decl.name, batch_id, decl.timeout)
        elif reason is Reason.STOP:
            error = Stopped(f"stopped: procedure {decl.name!r} batch {batch_id} rolled back")
        raise _MemberRun(decl.name, error) from exc
    member.seconds = time.perf_counter() - began
    return member


def _chain_reader(rt: Runtime, group: _Group, decl: ProcedureDecl) -> str | None:
    """The procedure ``decl``'s output can be chained into (``sstore.dataflow.fusion``), or None:
    both are SQL procedures without a timeout, ``decl`` has returned its stream's schema exactly
    before, and the stream has that one reader, could be held back and feeds no event
    window. The reader must also be the TE the scheduler picks next (it follows ``decl`` in
    the topological order, is not halted, and the group has room for it): otherwise the
    group would roll back and run again unchained (``_Unchain``), every batch."""
    if not group.chaining or decl.sql is None or decl.timeout is not None \
            or decl.name not in rt.chaining.exact or len(decl.outputs) != 1 \
            or len(group.members) + 2 > group.most:
        return None
    stream = decl.outputs[0]
    readers = rt.graph.consumers_of(stream)
    if len(readers) != 1 or stream in rt.chaining.stored:
        return None
    reader = rt.graph.procedures[readers[0]]
    order = rt.scheduler.order
    if reader.sql is None or reader.timeout is not None or len(reader.inputs) != 1 \
            or reader.name in rt.scheduler.halted \
            or order.index(reader.name) != order.index(decl.name) + 1 \
            or not _can_hold_back(rt, stream) or rt.graph.event_windows_on(stream):
        # a chained-away batch is never appended (``StreamStore.append``): an event window
        # fed from it would miss it, though its rows may be held back (it reads the batch)
        return None
    return reader.name


def _can_hold_back(rt: Runtime, stream: str) -> bool:
    """Whether the rows of ``stream`` may wait in memory until the group ends: decided by
    ``sstore.execution.passing`` (only procedures read it, nothing checks its rows, no trigger's SQL
    reads its table); a member's statement that may read its table stores it first
    (``_before_statement``)."""
    return passing.eligible(rt, stream)


def _before_statement(rt: Runtime, group: _Group, statement: str) -> None:
    """Each statement a member runs, before it runs (``Transaction``): store the held-back
    batches it may read from their tables, and if it may read a chained-away batch (never
    computed), mark the group to run again unchained (``_Unchain`` once the member returns:
    raised here, a procedure that catches errors could swallow it)."""
    if not group.held_back and not group.chained_away:
        return
    held = {name.lower(): name for name in group.held_back}
    chained = {name.lower(): name for name, _ in group.chained_away}
    read = rt.passing.reads(rt.con, statement, held.keys() | chained.keys())
    for name in read & held.keys():
        stream = held[name]
        rt.store.insert(stream, group.batch_id, group.held_back.pop(stream))
    for name in read & chained.keys():
        rt.chaining.stored.add(chained[name])
        group.unchain = True


def _next_member(rt: Runtime, group: _Group, most: int, fixed: list[str] | None) -> str | None:
    """The next member, or None: the group ends. ``group.cut`` says it ended while TEs of its
    batch may still run after it, in another transaction (``_store_held_back``)."""
    last = group.members[-1].pending
    if len(group.members) >= most or last.created or last.window_updates \
            or (fixed is not None and len(group.members) >= len(fixed)):
        group.cut = True  # created/window: their in-memory state is applied after COMMIT only
        return None
    if fixed is not None:
        return fixed[len(group.members)]
    nxt = rt.scheduler.next()
    if nxt is None or nxt[1] != group.batch_id:
        return None
    return nxt[0]


def _store_held_back(rt: Runtime, group: _Group) -> None:
    """Store the held-back batches that a reader outside the group still needs, and all of
    them when the group was cut short (a TE of the batch that runs later, in a transaction
    of its own, may read any stream's table: ``sstore.execution.passing``); the others are never
    stored, so they are recorded as collected (``sstore_sys.collected``), exactly as garbage
    collection records what it removes: a consumer that starts on the stream later must get
    ``GapError`` for them, never an empty batch in their place."""
    ran = group.names()
    for stream, table in group.held_back.items():
        if group.cut or not set(rt.graph.consumers_of(stream)) <= ran:
            rt.store.insert(stream, group.batch_id, table)
        else:
            group.unstored.append(stream)
    group.unstored += [stream for stream, _ in group.chained_away]
    if group.unstored:
        systables.record_collected(rt.con, group.unstored, group.batch_id, rt.ledger.collected)


def _apply(rt: Runtime, group: _Group, lead: Lead | None = None) -> None:
    for stream in group.unstored:
        rt.ledger.collected[stream] = max(rt.ledger.collected.get(stream, 0), group.batch_id)
    for stream, reader in group.chained_away:
        rt.latest.pop(stream, None)
        rt.chaining.unmaterialized[stream] = (group.batch_id, reader)
    ran = group.names()
    consumed = frozenset(s for s in group.produced if set(rt.graph.consumers_of(s)) <= ran)
    now = time.perf_counter()
    if lead is not None:
        rt.finish(lead.pending, recorded=True, consumed=consumed)
        if rt.observers:
            rt.observe(CommitEvent("ingest", lead.stream, group.batch_id, lead.table.num_rows,
                                   now, lead.table.num_rows, lead.seconds,
                                   len(group.members) + 1, group.commit_seconds))
    for member in group.members:
        member.tx._mark_committed()
        rt.te_seq += 1
        rt.since_gc += 1
        executor.note_te(rt, member.decl.name, group.batch_id, member.tx)
        rt.finish(member.pending, recorded=True, consumed=consumed)
        if rt.observers:
            rt.observe(CommitEvent("te", member.decl.name, group.batch_id, member.rows_out, now,
                                   member.rows_in, member.seconds, len(group.members),
                                   group.commit_seconds))
