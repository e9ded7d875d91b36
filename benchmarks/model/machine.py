"""The rules: every operation, misuse and fault the model drives the real system through, each
with what the model expects of it; after every step the whole system is compared with the model
(``expected.compare``). A rule's outcome is one of:

- it succeeds, and the model takes its effect;
- it is refused loudly (an error) and the system holds what it held before (the model does
  not change; the comparison after the step checks that nothing changed);
- anything else is a violation (``Violation``): a row lost, duplicated or changed, a valid
  input refused, a misuse accepted, an internal error. Hypothesis then shrinks the program
  to a minimal one and prints it.

The warehouse's rules (sinks one-shot and attached, ``sstore migrate``, the target by hand)
are the mixin ``benchmarks.model.warehouse``, PostgreSQL restarts ``benchmarks.model.outages``,
SIGKILLs and stops by signal ``benchmarks.model.processes``; the switches, counters and
``Violation`` are ``benchmarks.model.context``. Switches leave operations out, for development on a
branch where a known bug would hide the rest; the CI test and ``benchmarks.chaos --model`` run with
everything on unless told otherwise (``SSTORE_MODEL_SKIP=name,name``; ``SWITCHES`` lists the names).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pyarrow.compute as pc
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from benchmarks.model.changes import ChangeRules
from benchmarks.model.context import Violation, ctx, on
from benchmarks.model.dataflow import ENRICH_NAMES, OTHER_TYPES, READER, Record, make_record
from benchmarks.model.expected import Model, compare, enriched_rows
from benchmarks.model.inputs import SHAPES, shaped
from benchmarks.model.outages import OutageRules
from benchmarks.model.processes import RECORDS, ProcessRules
from benchmarks.model.system import NOTE_BYTES, WAL_LIMIT, WAL_SLACK, Program, System
from sstore.base.errors import (
    InputLogError,
    OutOfOrderBatchError,
    ResendMismatchError,
    SStoreError,
)


def pick(data: st.DataObject, among: list[int]) -> int:
    """One of ``among`` (0 if empty), drawn as an index: the batch-ids depend on how a
    Coalescer cut its offers (timing), and hypothesis needs the same draws on every replay."""
    i = data.draw(st.integers(0, 1 << 16), label="index")
    return among[i % len(among)] if among else 0


class ModelMachine(ProcessRules, OutageRules, ChangeRules):
    """The real system and the model, side by side (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.ctx = ctx()
        self.ctx.programs += 1
        self.dir = Path(tempfile.mkdtemp(prefix="sstore-model-"))
        self.model = Model()
        self.program = Program()
        self.system: System | None = None
        self.lowprec = False  # the target was made by hand with timestamp(0)
        self.pending_pg_fault: dict[str, str] = {}
        #: how far every consumer of enriched had acknowledged at the last comparison
        self.last_released = 0
        self.note_id = 0
        #: the program ended at a loud refusal it cannot go past (a replay that refuses a
        #: log it cannot reproduce): no rule runs after it
        self.stopped: str | None = None
        #: an ad hoc copy read a stream table in weak durability since the last checkpoint
        self.weak_copy = False

    # ------------------------------------------------------------------ helpers
    def teardown(self) -> None:
        server = self.ctx.server
        if server is not None and not server.is_running:
            server.start()  # a rule that failed while PostgreSQL was away
        if self.system is not None:
            try:
                self.system.close()
            finally:
                try:
                    self.system.drop_target()
                    self.system.close_pg()
                except Exception:  # noqa: BLE001 - cleanup only
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def records(self, spec: list[tuple[int, int, int]], first: int | None = None
                ) -> list[Record]:
        rec = self.model.next_rec if first is None else first
        return [make_record(rec + i, k, cents, micros, self.program.appended)
                for i, (k, cents, micros) in enumerate(spec)]

    def floats(self) -> bool:
        return self.ctx.switches.on("float_amounts")

    def shaped(self, records: list[Record], shape: str) -> object:
        """``records`` as the program sends them (``inputs.shaped``)."""
        return shaped(records, shape, self.floats(), self.program.appended)

    def reopen(self, program: Program | None = None) -> None:
        self.sys.close()
        self.open(program or self.program)

    def open(self, program: Program) -> None:
        """Open the system. Weak durability replays the input log up to its last record: the
        transaction executions that ran after it run again with the next ``run_until_idle``
        (until then a query sees the state as of that record), so the program runs first.
        Acknowledgements are not logged there: what GC could remove before stays removable."""
        if self.sys.mode == "weak":
            self.model.released = max(self.model.released, self.last_released)
        try:
            self.sys.open(program)
        except InputLogError as exc:
            if not self.weak_copy:
                raise
            # item 7's other outcome: replay detects that it would not reproduce what an ad
            # hoc copy saw live, and refuses loudly; the program cannot go past it
            self.stopped = f"replay refused: {exc}"
            self.ctx.stops.append(self.stopped)
            return
        if self.sys.mode == "weak":
            self.sys.e.run_until_idle()
            self.model.run_all()

    # ------------------------------------------------------------------ start
    @initialize(mode=st.sampled_from(["full", "weak"]))
    def start(self, mode: str) -> None:
        self.ctx.by_rule[f"program_{mode}"] = self.ctx.by_rule.get(f"program_{mode}", 0) + 1
        self.system = System(mode, self.dir, self.ctx.url)
        self.system.open(self.program)

    @invariant()
    def matches_the_model(self) -> None:
        if self.system is None or self.system.engine is None or self.stopped is not None:
            return
        self.settle()  # an attached sink delivers what committed first
        wal = (WAL_LIMIT + WAL_SLACK if self.sys.mode == "full" and self.ctx.switches.on("wal")
               else None)
        seen = self.sys.observe()
        problems = compare(self.model, seen, wal_limit=wal)
        self.last_released = min(seen.sink_acked, seen.reader_acked)
        if problems:
            raise Violation("the system differs from the model:\n  " + "\n  ".join(problems))

    # ------------------------------------------------------------------ ingest paths
    @on("ingest")
    @rule(spec=RECORDS, fused=st.booleans(), shape=st.sampled_from(SHAPES))
    def ingest(self, spec: list[tuple[int, int, int]], fused: bool, shape: str) -> None:
        """A new batch, on ``ingest`` or ``ingest_and_run``: it must be taken."""
        fused = fused and self.ctx.switches.on("ingest_and_run")
        self.step("ingest_and_run" if fused else "ingest")
        records = self.records(spec)
        batch_id = records[-1].rec
        call = self.sys.e.ingest_and_run if fused else self.sys.e.ingest
        try:
            got = call("orders", self.shaped(records, shape), batch_id=batch_id)
        except SStoreError as exc:
            raise Violation(f"a valid new batch {batch_id} ({shape}) was refused: "
                            f"{type(exc).__name__}: {exc}") from exc
        if got.duplicate or int(got) != batch_id:
            raise Violation(f"new batch {batch_id} taken as {int(got)} (duplicate "
                            f"{got.duplicate})")
        self.model.commit(batch_id, records)
        if fused:
            self.model.run_all()

    @on("ingest")
    @rule()
    def append_batch(self) -> None:
        """A new batch of two records made from their numbers, on ``ingest`` or (every other
        one) ``ingest_and_run``. The same as ``ingest``; it takes no argument so that it is the
        rule hypothesis's simplest programs repeat (it tries rules with fewer arguments first,
        and a program of ingests finds more than one of garbage collections)."""
        rec = self.model.next_rec
        spec = [(r % 4, (r * 3_709) % 100_000, (0, 600_000, 999_999)[r % 3])
                for r in (rec, rec + 1)]
        self.ingest(spec, rec % 2 == 0, SHAPES[rec % len(SHAPES)])

    @on("resend")
    @precondition(lambda self: self.model.batches)
    @rule(data=st.data(), fused=st.booleans(), same=st.booleans())
    def resend(self, data: st.DataObject, fused: bool, same: bool) -> None:
        self.do_resend(pick(data, sorted(self.model.batches)), fused, same)

    def do_resend(self, batch_id: int, fused: bool, same: bool) -> None:
        """A batch-id sent again: with the same rows a no-op, with other rows refused."""
        self.step("resend_same" if same else "resend_other")
        fused = fused and self.ctx.switches.on("ingest_and_run")
        records = self.model.batches[batch_id]
        if not same:
            first = records[0]
            records = [first._replace(amt=first.amt + 1), *records[1:]]
        call = self.sys.e.ingest_and_run if fused else self.sys.e.ingest
        try:
            got = call("orders", self.shaped(records, "tuples"), batch_id=batch_id)
        except ResendMismatchError:
            if same:
                raise Violation(f"re-send of batch {batch_id} with the same rows refused as a "
                                f"mismatch") from None
            return
        except SStoreError as exc:
            raise Violation(f"re-send of batch {batch_id} (same rows: {same}) raised "
                            f"{type(exc).__name__}: {exc}") from exc
        if not same:
            raise Violation(f"re-send of batch {batch_id} with other rows accepted "
                            f"(duplicate {got.duplicate})")
        if not got.duplicate:
            raise Violation(f"re-send of batch {batch_id} with the same rows taken as new")
        if fused:
            self.model.run_all()  # ingest_and_run runs what is pending, re-send or not

    @on("resend")
    @precondition(lambda self: len(self.model.batches) >= 1 and self.model.last_id > 1)
    @rule(data=st.data(), spec=RECORDS)
    def out_of_order(self, data: st.DataObject, spec: list[tuple[int, int, int]]) -> None:
        free = [i for i in range(1, self.model.last_id) if i not in self.model.batches]
        batch_id = pick(data, free)
        if free:
            self.do_out_of_order(batch_id, spec)

    def do_out_of_order(self, batch_id: int, spec: list[tuple[int, int, int]]) -> None:
        """A new batch whose id is below the last one: refused."""
        self.step("out_of_order")
        records = self.records(spec)
        try:
            self.sys.e.ingest("orders", self.shaped(records, "tuples"), batch_id=batch_id)
        except OutOfOrderBatchError:
            return
        except SStoreError as exc:
            raise Violation(f"out-of-order batch {batch_id} refused with "
                            f"{type(exc).__name__} instead of OutOfOrderBatchError: {exc}"
                            ) from exc
        raise Violation(f"out-of-order batch {batch_id} (last {self.model.last_id}) accepted")

    @on("coalescer")
    @rule(offers=st.lists(RECORDS, min_size=1, max_size=3), overlap=st.integers(0, 3))
    def coalesce(self, offers: list[list[tuple[int, int, int]]], overlap: int) -> None:
        """Offers through a Coalescer (``batch_id_of``: the last record's number), the first
        one possibly starting ``overlap`` records early, as a polling source resuming from an
        offset it committed before the engine's last batch would (issue 34 item 2): what
        commits must hold every record once (overlap trimmed) or the coalescer must refuse."""
        from sstore.coalesce import Coalesced, Coalescer, CoalescerFailed
        if not self.ctx.switches.on("coalesce_overlap"):
            overlap = 0
        overlap = min(overlap, self.model.next_rec - 1)
        self.step("coalesce_overlap" if overlap else "coalesce")
        before = self.model.next_rec
        first = before - overlap
        known = {r.rec: r for rs in self.model.batches.values() for r in rs}
        chunks: list[list[Record]] = []
        for spec in offers:
            chunk = self.records(spec, first)
            # records the source produced before are the same records, not new ones
            chunk = [known.get(r.rec, r) for r in chunk]
            chunks.append(chunk)
            first += len(chunk)
        done: list[Coalesced] = []
        coalescer = Coalescer(self.sys.e, "orders",
                              lambda t: int(pc.max(t["rec"]).as_py()), on_batch=done.append)
        failed: BaseException | None = None
        try:
            for i, chunk in enumerate(chunks):
                coalescer.offer(self.shaped(chunk, "arrow"), token=i)
            coalescer.drain()
        except CoalescerFailed as exc:
            failed = exc
        finally:
            try:
                coalescer.close()
            except CoalescerFailed as exc:
                failed = failed or exc
        for c in done:
            records = [r for i in c.tokens for r in chunks[i] if r.rec >= before]
            if c.batch_id in self.model.batches:  # taken as a re-send: a no-op
                if records:
                    raise Violation(f"coalesced new records {[r.rec for r in records]} "
                                    f"reported as batch {c.batch_id}, which committed before")
                continue
            self.model.commit(c.batch_id, records)
        if failed is not None and not overlap:
            raise Violation(f"the coalescer refused valid offers: {failed}")
        try:
            self.sys.e.run_until_idle()
        except SStoreError as exc:
            raise Violation(f"run_until_idle after the coalescer: {exc}") from exc
        self.model.run_all()

    @on("run")
    @rule()
    def run(self) -> None:
        self.step("run_until_idle")
        self.sys.e.run_until_idle()
        self.model.run_all()

    @on("gc")
    @rule(run_first=st.booleans())
    def collect_garbage(self, run_first: bool = False) -> None:
        """``collect_garbage``, after ``run_until_idle`` or with batches pending. (An argument
        also keeps it out of the first place among the rules hypothesis tries most.)"""
        if run_first:
            self.run()
            self.settle()  # an attached sink delivers first, as after any other step
        self.step("collect_garbage")
        self.sys.e.collect_garbage()

    @on("checkpoint")
    @rule()
    def checkpoint(self) -> None:
        """``Engine.checkpoint``: a snapshot and an empty input log (weak), CHECKPOINT (full)."""
        self.step(f"checkpoint_{self.sys.mode}")
        self.sys.e.checkpoint()

    # ------------------------------------------------------------------ ad hoc
    @on("adhoc")
    @rule(tag=st.integers(0, 9))
    def archive_copy(self, tag: int) -> None:
        """``INSERT INTO archive SELECT ... FROM orders`` in an ad hoc transaction: archive
        holds what the transaction saw, for ever (a replay must see the same: item 7)."""
        if self.sys.mode == "weak" and not self.ctx.switches.on("weak_copy"):
            return
        self.step("adhoc_archive")
        try:
            with self.sys.e.transaction() as tx:
                seen = [r[0] for r in tx.fetchall("SELECT rec FROM orders")]
                tx.execute("INSERT INTO archive SELECT rec, ? FROM orders", tag)
        except SStoreError:
            if self.sys.mode != "weak":
                raise
            return  # weak durability may refuse what replay could not reproduce (item 7)
        if self.sys.mode == "weak":
            self.weak_copy = True
        for rec in seen:
            self.model.archive[(rec, tag)] += 1

    @on("adhoc")
    @rule(via_execute=st.booleans())
    def note(self, via_execute: bool) -> None:
        """A padded row into ``notes`` by ``execute`` or ``transaction`` (the WAL bound:
        item 8)."""
        # weak durability does not log execute (documented: DDL and seed data that the
        # program runs at every start), so there the note goes through a transaction
        via_execute = via_execute and self.sys.mode == "full"
        self.step("execute_note" if via_execute else "adhoc_note")
        self.note_id += 1
        payload = "x" * NOTE_BYTES
        if via_execute:
            self.sys.e.execute("INSERT INTO notes VALUES (?, ?)", self.note_id, payload)
        else:
            with self.sys.e.transaction() as tx:
                tx.execute("INSERT INTO notes VALUES (?, ?)", self.note_id, payload)
        self.model.notes[(self.note_id, NOTE_BYTES)] += 1

    @on("execute_misuse")
    @rule(what=st.sampled_from(["insert_orders", "delete_enriched", "insert_enriched"]),
          via_execute=st.booleans())
    def write_a_stream(self, what: str, via_execute: bool) -> None:
        """A statement that writes a stream outside the engine's own transactions: refused on
        both paths (item 6); the comparison after the step sees any row it changed."""
        last = self.model.last_id
        unacked = [b for b in self.model.processed
                   if b > min(self.model.delivered, self.model.reader_acked)]
        if what == "delete_enriched" and not unacked:
            return  # deleting acknowledged batches only is not a misuse
        self.step(f"{'execute' if via_execute else 'transaction'}_{what}")
        sql = {
            "insert_orders": f"INSERT INTO orders (_batch_id, rec, k, amt, ts) VALUES "
                             f"({last + 1000}, -1, 0, 1.5, TIMESTAMP '2024-01-01')",
            "delete_enriched": f"DELETE FROM enriched WHERE _batch_id > "
                               f"{min(self.model.delivered, self.model.reader_acked)}",
            "insert_enriched": "INSERT INTO enriched (_batch_id, rec, k, amt, ts, seen) VALUES "
                               f"({last + 1000}, -1, 0, 1.5, TIMESTAMP '2024-01-01', 1)",
        }[what]
        try:
            if via_execute:
                self.sys.e.execute(sql)
            else:
                with self.sys.e.transaction() as tx:
                    tx.execute(sql)
        except Exception:  # noqa: BLE001 - refused loudly: the comparison checks the rest
            return
        raise Violation(f"{'Engine.execute' if via_execute else 'transaction()'} accepted "
                        f"a write into a stream: {sql}")

    # ------------------------------------------------------------------ consumers
    @on("reader")
    @rule()
    def read_and_acknowledge(self) -> None:
        """The external consumer reads ``enriched`` after its acknowledgement: every processed
        batch, exactly as committed, then acknowledges the last."""
        self.step("reader")
        e = self.sys.e
        after = self.model.reader_acked
        listed = e.batches("enriched", after)
        processed = self.model.processed_ids()
        # batches every consumer had acknowledged before a weak restart may be gone although
        # the reader's acknowledgement fell back below them (``open``): the reader then reads
        # on from the first one still there; the ones above ``released`` must all be there
        floor = max(after, self.model.released)
        must = [b for b in processed if b > floor]
        may = [b for b in processed if after < b <= floor]
        ids = [b for b, _ in listed]
        early = ids[:len(ids) - len(must)] if len(ids) >= len(must) else ids
        if ids[len(early):] != must or (early and early != may[len(may) - len(early):]):
            raise Violation(f"reader: batches after {after} listed {listed}, want {must} "
                            f"(and any last ones of {may}, released before a weak restart)")
        want = ids
        if not want:
            return
        table = e.read_batches("enriched", want[0], want[-1])
        got = sorted((r["_batch_id"], r["rec"], r["k"], r["amt"], r["ts"], r.get("note"),
                      r.get("channel"), r["seen"]) for r in table.to_pylist())
        expect = sorted((b, *row) for b in want
                        for row in enriched_rows(self.model.stored(b)))
        if got != expect:
            raise Violation(f"reader: read {len(got)} rows of batches {want}, want "
                            f"{len(expect)}: {sorted(set(got) ^ set(expect))[:4]}")
        e.acknowledge(READER, want[-1])
        self.model.reader_acked = want[-1]

    @on("ack_ahead")
    @rule(ahead=st.integers(1, 50))
    def acknowledge_ahead(self, ahead: int) -> None:
        """Acknowledging a batch no stream committed (above the newest border batch): refused
        (the consumer port checks calls against what committed), else GC would drop batches
        the consumer never read as they commit."""
        self.step("ack_ahead")
        batch_id = self.model.last_id + ahead
        try:
            self.sys.e.acknowledge(READER, batch_id)
        except SStoreError:
            return
        raise Violation(f"acknowledge({READER!r}, {batch_id}) accepted; the newest batch "
                        f"committed is {self.model.last_id}")

    # ------------------------------------------------------------------ restarts
    @on("restart")
    @rule()
    def restart(self) -> None:
        """Close and open again (weak durability: from the input log)."""
        self.step(f"restart_{self.sys.mode}")
        self.reopen()
        self.acks_after_restart()

    def acks_after_restart(self) -> None:
        """Weak durability does not log acknowledgements (documented): after a restart a
        consumer may find its acknowledgement back where the last checkpoint had it, and reads
        those batches again; never further than the model's."""
        if self.sys.mode != "weak" or self.stopped is not None:
            return
        acked = self.sys.e.acknowledged(READER)
        if acked > self.model.reader_acked:
            raise Violation(f"reader: acknowledged {acked} after a restart, more than the "
                            f"{self.model.reader_acked} it acknowledged")
        self.model.reader_acked = acked

    @on("rename")
    @rule()
    def rename(self) -> None:
        """Open again with enrich under its other name, the old one retired (item 9): the
        new one runs every kept batch again; nothing may wedge or double an output batch."""
        if self.sys.mode == "weak" and not self.ctx.switches.on("weak_rename"):
            return
        self.step("rename_retire")
        kept = set(self.sys.observe().orders) & self.model.processed
        old = self.program.enrich_name
        new = ENRICH_NAMES[1 - ENRICH_NAMES.index(old)]
        program = replace(self.program, enrich_name=new, retire=(old,), orders_types=None)
        self.sys.close()
        try:
            self.open(program)
        except SStoreError as exc:
            if isinstance(exc, InputLogError):
                raise Violation(f"replay refused the log after a rename: {exc}") from exc
            self.open(self.program)  # refused loudly at start: the old program goes on
            self.acks_after_restart()  # a restart all the same (weak: acks not logged)
            return
        if self.stopped is not None:
            return
        self.program = program
        self.model.reprocessed += sorted(kept)
        self.acks_after_restart()

    @on("redeclare")
    @rule(variant=st.sampled_from(sorted(OTHER_TYPES)))
    def redeclare(self, variant: str) -> None:
        """Open again with ``orders`` declared with other column types: refused (item 3)."""
        self.step("redeclare_types")
        self.sys.close()
        try:
            self.open(replace(self.program, orders_types=OTHER_TYPES[variant]))
        except SStoreError:
            self.open(self.program)
            self.acks_after_restart()
            return
        if self.stopped is not None:
            return
        self.sys.close()
        self.open(self.program)
        if self.sys.mode == "weak" and not self.model.batches:
            return  # an input log with no batch and no snapshot holds no types to keep
        raise Violation(f"orders redeclared with other column types ({variant}) was accepted "
                        f"on an existing state")
