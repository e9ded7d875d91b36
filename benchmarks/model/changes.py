"""Changing the running pipeline, as rules of the model (issue 38): the streams evolve, the
enrich procedure is upgraded, a second writer fences the sink.

- ``evolve``: the program opens again with ``orders`` and ``enriched`` evolved (``k`` widened
  to BIGINT, ``dataflow.EVOLVED_ORDERS``). It must be accepted and recorded as the next
  version of both streams; every value stays the same value, so the model does not change;
  the next delivery makes the target follow (``migrators.follow``: ``k`` becomes bigint) and
  the comparison after every step checks that nothing was lost, doubled or changed on the way.
- ``append_columns``: the program opens again with ``note VARCHAR`` and ``channel VARCHAR
  DEFAULT 'web'`` appended to both streams (``dataflow.APPENDED``). Accepted and recorded
  (``add note VARCHAR; add channel VARCHAR``, from the batch after the last one); in the
  model every batch stored before reads ``note`` NULL and ``channel`` 'web' from then on
  (``Model.stored``), later batches carry the values they were sent with (NULL among them),
  a re-send of an old batch sends it as it was sent (without them: a no-op). The target
  follows at its next delivery with rows: it gains both columns (nullable, no default: the
  rows it held read NULL in them, the rows delivered with and after them their values, old
  batches' 'web' included), which the comparison checks row by row.
- ``upgrade``: the program opens again with the enrich procedure at its next version (the
  same rows: the model does not change); the switch must be recorded at the batch after the
  procedure's last, and no batch may run twice or not at all.
- ``second_writer``: a second engine, on a copy of the state file taken now (the same
  identity: a restored copy still running), delivers ``enriched`` into the target after this
  program's sink started. Its delivery is a normal one (the model takes it); this program's
  sink, started before it, must then fail with ``FencedError`` and write nothing if it had
  anything to write, and a sink started afterwards carries on (it fences the copy).

Weak durability changes a stream or a procedure only with an input log empty after its
snapshot: these rules checkpoint first, as docs/engine.md says a user must. A mixin of
``benchmarks.model.machine.ModelMachine``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace

from hypothesis.stateful import precondition, rule

from benchmarks.model.context import Violation, ctx, on
from benchmarks.model.dataflow import declare
from benchmarks.model.system import Program
from benchmarks.model.warehouse import WarehouseRules, quick_retry
from sstore import Engine
from sstore.base.errors import SStoreError


class ChangeRules(WarehouseRules):
    """The rules of a changing pipeline (module docstring)."""

    stopped: str | None
    acks_after_restart: Callable[[], None]

    def change(self, program: Program, what: str) -> None:
        """Open again with ``program``, which must be accepted (a checkpoint first in weak
        durability, as a user must)."""
        if self.sys.mode == "weak":
            self.sys.e.checkpoint()
        self.sys.close()
        try:
            self.open(program)
        except SStoreError as exc:
            raise Violation(f"{what} was refused: {type(exc).__name__}: {exc}") from exc
        if self.stopped is None:
            self.program = program
            self.acks_after_restart()

    @on("evolve")
    @precondition(lambda self: self.system is not None and not self.program.evolved)
    @rule()
    def evolve(self) -> None:
        self.step("evolve")
        self.change(replace(self.program, evolved=True), "an evolution (k widened)")
        if self.stopped is not None:
            return
        self.check_versions("widen k INTEGER -> BIGINT")

    def check_versions(self, change: str) -> None:
        """Both streams' versions are 1..n (one per evolution the program made), the last
        one recorded as ``change``."""
        count = 1 + self.program.evolved + self.program.appended
        for stream in ("orders", "enriched"):
            versions = self.sys.e.stream_versions(stream)
            if [v["version"] for v in versions] != list(range(1, count + 1)) or \
                    versions[-1]["change"] != change:
                raise Violation(f"{stream}: the evolution ({change}) is recorded as "
                                f"{versions}")

    @on("append_columns")
    @precondition(lambda self: self.system is not None and not self.program.appended)
    @rule()
    def append_columns(self) -> None:
        self.step("append_columns")
        last = self.model.last_id
        self.change(replace(self.program, appended=True), "an evolution (columns appended)")
        if self.stopped is not None:
            return
        self.model.appended_from = last + 1
        self.check_versions("add note VARCHAR; add channel VARCHAR")
        first = self.sys.e.stream_versions("orders")[-1]["first_batch"]
        if first != last + 1:
            raise Violation(f"orders: the appended columns are recorded from batch {first}; "
                            f"the last batch before them was {last}")

    @on("upgrade")
    @precondition(lambda self: self.system is not None)
    @rule()
    def upgrade(self) -> None:
        self.step("upgrade")
        name, version = self.program.enrich_name, self.program.enrich_version + 1
        done = self.sys.e.runtime.ledger.progress.get(name, 0) if self.sys.e.started else 0
        self.change(replace(self.program, enrich_version=version), f"enrich version {version}")
        if self.stopped is not None:
            return
        found = self.sys.e.procedure_versions(name)
        if not found or found[-1]["version"] != version or found[-1]["from_batch"] <= done:
            raise Violation(f"{name}: version {version} recorded as {found} (it had committed "
                            f"batches through {done})")

    @on("second_writer")
    @precondition(lambda self: self.system is not None and self.system.mode == "full"
                  and self.system.attached is None)
    @rule()
    def second_writer(self) -> None:
        from migrators import StreamToPostgres
        from migrators.errors import FencedError
        if self.lowprec or self.gap_expected(reset=False) or self.hand_pending:
            return  # a delivery that must refuse for its own reason: not this rule's case
        self.step("second_writer")
        self.sys.close()
        copy = str(self.dir / f"copy-{ctx().steps}.duckdb")
        shutil.copy(self.sys.path, copy)
        self.open(self.program)
        if self.stopped is not None:
            return
        expected = self.expected_delivery(reset=False)
        ours = StreamToPostgres(self.sys.e, "enriched", self.sys.url, self.sys.table,
                                retry=quick_retry())
        try:
            ours.start()
            pending = bool(ours.plan())  # what it would deliver (all again after a drop)
            with self.second_engine(copy) as other:
                theirs = StreamToPostgres(other, "enriched", self.sys.url, self.sys.table,
                                          retry=quick_retry())
                theirs.run_once()
                theirs.close()
            self.delivered(expected)
            try:
                ours.run_pending()
            except FencedError:
                if not pending:
                    raise Violation("a sink with nothing to write was fenced") from None
                return
            if pending:
                raise Violation("the first writer's delivery was not fenced by the second")
        finally:
            ours.close()
            self.sys.e.unregister_sink(ours)

    def second_engine(self, path: str) -> Engine:
        engine = Engine(path, gc_min_seconds=0)
        declare(engine, sink_consumer=self.sys.consumer, enrich_name=self.program.enrich_name,
                retire=self.program.retire, evolved=self.program.evolved,
                enrich_version=self.program.enrich_version, appended=self.program.appended)
        return engine
