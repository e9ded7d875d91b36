"""The warehouse half of the model's rules: the PostgreSQL target that the sinks
(``migrators.StreamToPostgres``: one-shot ``run_once``, or attached across steps on its own or
as a ``SinkGroup``) and ``sstore migrate`` fill from ``enriched``, with and without
``accept_gap``, and the user's hands on it (truncate, delete a row, drop, create it with a time
of lower precision). What a delivery must do is docs/migrators.md's promise: a target that
holds rows continues from its watermark; a missing or emptied one starts over from the first
batch the engine still has; if garbage collection removed batches it lacks, ``GapError``
unless the gap is accepted. A mixin of ``benchmarks.model.machine.ModelMachine``, whose state
(``sys``, ``model``, ``program``, ``lowprec``) these rules read and change; the outcomes follow
that module's docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from benchmarks.model.context import Violation, on
from sstore.base.errors import GapError, SStoreError

if TYPE_CHECKING:
    from benchmarks.model.context import Context
    from benchmarks.model.expected import Model
    from benchmarks.model.system import Program, System


class WarehouseRules(RuleBasedStateMachine):
    """The target's rules (module docstring)."""

    ctx: Context
    model: Model
    program: Program
    lowprec: bool
    system: System | None
    #: PostgreSQL restarts a rule asked the attached sink's hooks for: where -> stop mode
    pending_pg_fault: dict[str, str]
    #: the attached sink's ``accept_gap``; the target was truncated or dropped by hand while
    #: it ran, and it has not delivered since (``settle``)
    attached_accept_gap: bool = True
    hand_pending: bool = False

    @property
    def sys(self) -> System:
        assert self.system is not None
        return self.system

    def step(self, rule: str) -> None:
        self.ctx.count(rule)

    #: reopens the system with ``program``: ``machine.ModelMachine.open`` (this class is
    #: its mixin of the warehouse rules, never used alone)
    open: Callable[[Program], None]

    # ------------------------------------------------------------------ the warehouse target
    def expected_delivery(self, reset: bool) -> dict[int, tuple[Any, ...]]:
        """What the target must hold after a successful delivery: a target that is missing or
        empty (made again, truncated by hand) gets every processed batch the engine still has;
        one that holds rows gets the batches after its watermark, and with ``--reset`` the
        batches the engine still has merged in (never twice)."""
        stored = set(self.sys.observe().enriched)
        model = self.model
        target = model.target or {}
        if not target or reset:
            merged = dict(target)
            for b in model.processed_ids():
                if b in stored:
                    merged.update(model.delivered_rows(b, b - 1))
            return merged
        return self.continued()

    def continued(self) -> dict[int, tuple[Any, ...]]:
        """The target after a delivery that continues from its watermark (``delivered``):
        what it holds plus every processed batch after that."""
        model = self.model
        return {**(model.target or {}),
                **model.delivered_rows(max(model.processed, default=0), model.delivered)}

    def gap_expected(self, reset: bool) -> bool:
        """Whether a delivery must meet a gap (docs/migrators.md, "Gaps are loud"): the target
        starts over from batch 0 (missing, emptied by hand, or ``--reset``) while garbage
        collection has removed batches it lacks. The watermark of a target that holds rows
        never passes the sink's acknowledgement, so nothing above it can be gone."""
        if self.model.target and not reset:
            return False
        stored = set(self.sys.observe().enriched)
        return any(b not in stored for b in self.model.processed)

    def accept_gap(self, accept: bool) -> bool:
        return accept or not self.ctx.switches.on("gap_refused")

    def delivered(self, expected: dict[int, tuple[Any, ...]]) -> None:
        self.model.target = expected
        self.model.delivered = max(self.model.processed, default=0)

    def refused(self, what: str, exc: BaseException, gap: bool, accept_gap: bool) -> None:
        """A delivery raised: loud, and right when the target would round (lower precision)
        or a gap it was not told to accept is there (``GapError``); else a violation."""
        if self.lowprec or (gap and not accept_gap and isinstance(exc, GapError)):
            return
        raise Violation(f"{what} refused a valid delivery (gap {gap}, accept_gap "
                        f"{accept_gap}): {type(exc).__name__}: {exc}") from exc

    @on("sink")
    @rule(accept_gap=st.booleans())
    def sink(self, accept_gap: bool = True) -> None:
        """``StreamToPostgres.run_once`` moves what ``enriched`` committed since its
        watermark; without ``accept_gap`` a gap (``gap_expected``) must be refused."""
        from migrators import StreamToPostgres
        accept_gap = self.accept_gap(accept_gap)
        self.step("sink" if accept_gap else "sink_no_gap")
        expected, gap = self.expected_delivery(reset=False), self.gap_expected(reset=False)
        sink = StreamToPostgres(self.sys.e, "enriched", self.sys.url, self.sys.table,
                                accept_gap=accept_gap, retry=quick_retry())
        try:
            sink.run_once()
        except SStoreError as exc:
            self.refused("the sink", exc, gap, accept_gap)
            return
        finally:
            self.sys.e.unregister_sink(sink)
        if gap and not accept_gap:
            raise Violation("the sink delivered over a gap it was not told to accept")
        self.delivered(expected)

    # ------------------------------------------------------------------ the continuous sink
    @on("attached_sink")
    @precondition(lambda self: self.system is not None and self.system.attached is None)
    @rule(group=st.booleans(), accept_gap=st.booleans())
    def attach_sink(self, group: bool, accept_gap: bool) -> None:
        """A continuous sink (``StreamToPostgres.attach``, or a ``SinkGroup`` of it) that
        stays attached across steps: every batch that commits reaches the target through the
        sink thread; after each step the check waits for it (``settle``). It ends when the
        engine closes (a restart, a crash, ``sstore migrate``) or halts; the target changed
        by hand meanwhile is ``settle``'s."""
        from migrators import StreamToPostgres
        from migrators.sink_runner import SinkGroup
        group = group and self.ctx.switches.on("sink_group")
        accept_gap = self.accept_gap(accept_gap)
        self.step("attach_group" if group else "attach_sink")
        expected, gap = self.expected_delivery(reset=False), self.gap_expected(reset=False)
        sink = StreamToPostgres(self.sys.e, "enriched", self.sys.url, self.sys.table,
                                accept_gap=accept_gap, retry=sink_retry(),
                                before_commit=self.pg_fault_hook("before_commit"),
                                on_delivered=self.pg_fault_hook("after_commit"))
        runner = SinkGroup([sink]) if group else sink
        try:
            runner.attach()
        except SStoreError as exc:
            self.sys.e.unregister_sink(sink)
            self.refused("attaching the sink", exc, gap, accept_gap)
            return
        self.sys.attached, self.attached_accept_gap, self.hand_pending = runner, accept_gap, False
        if gap and not accept_gap:
            raise Violation("the sink attached over a gap it was not told to accept")
        self.settle(expected)

    def settle(self, expected: dict[int, tuple[Any, ...]] | None = None) -> None:
        """Wait until the attached sink delivered every committed batch, then take its
        effect: ``expected`` (an attach), else the target continued from its watermark.

        A target truncated or dropped by hand while the sink runs (``hand_pending``) is
        noticed at the next batch that commits: the sink starts over from the first batch
        the engine still has (docs/migrators.md, "What a user must do"), or, if garbage
        collection removed batches the target lacks and the sink was not told to accept
        that, halts with ``GapError``: loud, the user then resumes it. A halt because the
        target would round (lower precision) is loud too. Either way the sink is detached."""
        from migrators.errors import MigrationError
        runner = self.sys.attached if self.system is not None else None
        if runner is None or self.sys.engine is None:
            return
        gap = self.hand_pending and self.gap_expected(reset=False)
        try:
            done = runner.flush(timeout=60.0)
        except MigrationError as exc:
            self.sys.detach()
            if self.lowprec:
                return
            if not (gap and not self.attached_accept_gap and "GapError" in str(exc)):
                raise Violation(f"the attached sink halted: {exc}") from exc
            self.sys.e.resume(self.sys.consumer)  # the user saw the gap, and goes on
            self.hand_pending = False
            if self.model.target is None and self.sys.target_exists():
                self.model.target = {}  # the sink made the table again before the check
            return
        if not done:
            raise Violation("the attached sink did not deliver what committed in 60 s "
                            f"(last error: {getattr(runner, 'last_error', None)})")
        if self.hand_pending:
            if max(self.model.processed, default=0) <= self.model.delivered:
                return  # nothing committed since: the sink has not looked at the target
            self.hand_pending = False
            if gap and not self.attached_accept_gap:
                raise Violation("the attached sink refilled a target emptied by hand over a "
                                "gap it was not told to accept")
            expected = self.expected_delivery(reset=False)
        self.delivered(expected if expected is not None else self.continued())

    def pg_fault_hook(self, where: str) -> Callable[[Any], None]:
        """A sink hook that restarts PostgreSQL once when a rule asked for it at ``where``
        (``before_commit``: COPY sent, COMMIT not yet; ``after_commit``: a chunk committed,
        the next one not begun); a no-op otherwise (``benchmarks.model.outages``)."""
        def hook(_arg: Any) -> None:
            mode = self.pending_pg_fault.pop(where, None)
            if mode is not None and self.ctx.server is not None:
                self.ctx.server.restart(mode)
                self.ctx.fault(f"pg_{mode}_{where}")
        return hook

    @on("migrate")
    @precondition(lambda self: self.system is not None and self.system.mode == "full")
    @rule(reset=st.booleans(), accept_gap=st.booleans())
    def migrate(self, reset: bool, accept_gap: bool = True) -> None:
        """``sstore migrate STATE --stream enriched --table T [--reset] [--accept-gap]`` (the
        engine closed, as the command requires). ``--reset`` onto a target that holds rows
        must refuse or merge, never append every batch again (item 5)."""
        reset = reset and self.ctx.switches.on("migrate_reset")
        accept_gap = self.accept_gap(accept_gap)
        self.step(("migrate_reset" if reset else "migrate") + ("" if accept_gap else "_no_gap"))
        expected, gap = self.expected_delivery(reset=reset), self.gap_expected(reset=reset)
        had_rows = bool(self.model.target)
        result = self.run_migrate(reset, accept_gap)
        if result.exit_code != 0:
            if isinstance(result.exception, SystemExit) and (
                    self.lowprec or (reset and had_rows) or (gap and not accept_gap)):
                return  # refused loudly: the comparison checks that nothing changed
            raise Violation(f"sstore migrate{' --reset' if reset else ''} failed (exit "
                            f"{result.exit_code}): {result.output[-800:]} "
                            f"{result.exception!r}")
        if gap and not accept_gap:
            raise Violation("sstore migrate delivered over a gap without --accept-gap")
        self.delivered(expected)

    def run_migrate(self, reset: bool, accept_gap: bool) -> Any:
        """``sstore migrate`` in this process (click's runner), the engine closed meanwhile."""
        from click.testing import CliRunner

        from sstore.cli.app import main
        self.sys.close()
        try:
            args = ["migrate", self.sys.path, "--stream", "enriched", "--postgres", self.sys.url,
                    "--table", self.sys.table, "--attempts", "2"]
            args += (["--reset"] if reset else []) + (["--accept-gap"] if accept_gap else [])
            return CliRunner().invoke(main, args)
        finally:
            self.sys.open(self.program)

    @on("target_by_hand")
    @precondition(lambda self: self.model.target is not None)
    @rule(what=st.sampled_from(["truncate", "delete_one", "drop"]))
    def target_by_hand(self, what: str) -> None:
        """The user's hands on the target: TRUNCATE, DELETE one row, DROP TABLE."""
        target = self.model.target
        assert target is not None
        if what == "delete_one" and not target:
            return
        self.step(f"target_{what}")
        # an attached sink goes on: it notices a truncate or a drop at the next commit
        self.hand_pending = self.sys.attached is not None and what != "delete_one"
        if what == "truncate":
            self.sys.by_hand("TRUNCATE {t}")
            self.model.target = {}
        elif what == "delete_one":
            rec = min(target)
            self.sys.by_hand("DELETE FROM {t} WHERE rec = %s", rec)
            del target[rec]
        else:
            self.sys.drop_target()
            self.model.target = None
            if self.lowprec and self.sys.e.consumer_halt(self.sys.consumer) is not None:
                self.sys.e.resume(self.sys.consumer)  # the cause is gone: the user resumes
            self.lowprec = False

    @on("lowprec_target")
    @precondition(lambda self: self.model.target is None)
    @rule(column=st.sampled_from(["timestamp(0)", "timestamp(3)"]))
    def target_of_lower_precision(self, column: str) -> None:
        """The user makes the target by hand with a time of lower precision: a sink must refuse
        it or keep every value exactly, never round (item 4)."""
        self.step("target_lowprec")
        self.sys.by_hand("CREATE TABLE {t} (rec bigint, k integer, amt numeric(10,2), "
                         f"ts {column}, seen bigint)")
        self.model.target = {}
        self.lowprec = True



def quick_retry() -> Any:
    """Few, short retries for a one-shot delivery: while the model's PostgreSQL is away it
    must fail loudly and soon; a restart within a delivery is over before the second try."""
    from sstore.base.retry import RetryPolicy
    return RetryPolicy(attempts=3, first_delay=0.05, max_delay=0.5)


def sink_retry() -> Any:
    """The continuous sink's delays (its thread retries without limit): short, so that it
    finds PostgreSQL back soon after a restart."""
    from sstore.base.retry import RetryPolicy
    return RetryPolicy(attempts=3, first_delay=0.05, max_delay=0.5)
