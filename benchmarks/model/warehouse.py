"""The warehouse half of the model's rules: the PostgreSQL target that the sink
(``migrators.StreamToPostgres``) and ``sstore migrate`` fill from ``enriched``, and the user's
hands on it (truncate, delete a row, drop, create it with a time of lower precision). A mixin
of ``benchmarks.model.machine.ModelMachine``, whose state (``sys``, ``model``, ``program``,
``lowprec``) these rules read and change; the outcomes follow that module's docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from benchmarks.model.context import Violation, on
from sstore.errors import SStoreError

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
        return {**target, **model.delivered_rows(max(model.processed, default=0),
                                                 model.delivered)}

    def delivered(self, expected: dict[int, tuple[Any, ...]]) -> None:
        self.model.target = expected
        self.model.delivered = max(self.model.processed, default=0)

    @on("sink")
    @rule()
    def sink(self) -> None:
        """``StreamToPostgres`` moves what ``enriched`` committed since its watermark."""
        from migrators import StreamToPostgres
        self.step("sink")
        expected = self.expected_delivery(reset=False)
        sink = StreamToPostgres(self.sys.e, "enriched", self.sys.url, self.sys.table,
                                accept_gap=True, retry=quick_retry())
        try:
            sink.run_once()
        except SStoreError as exc:
            if not self.lowprec:
                raise Violation(f"the sink refused a valid delivery: {type(exc).__name__}: "
                                f"{exc}") from exc
            return  # refused a target that would round: loud, nothing written
        finally:
            self.sys.e.unregister_sink(sink)
        self.delivered(expected)

    @on("migrate")
    @precondition(lambda self: self.system is not None and self.system.mode == "full")
    @rule(reset=st.booleans())
    def migrate(self, reset: bool) -> None:
        """``sstore migrate STATE --stream enriched --table T [--reset]`` (the engine closed,
        as the command requires). ``--reset`` onto a target that holds rows must refuse or
        merge, never append every batch again (item 5)."""
        from click.testing import CliRunner

        from sstore.cli.app import main
        reset = reset and self.ctx.switches.on("migrate_reset")
        self.step("migrate_reset" if reset else "migrate")
        expected = self.expected_delivery(reset=reset)
        had_rows = bool(self.model.target)
        self.sys.close()
        try:
            args = ["migrate", self.sys.path, "--stream", "enriched", "--postgres", self.sys.url,
                    "--table", self.sys.table, "--accept-gap", "--attempts", "2"]
            result = CliRunner().invoke(main, args + (["--reset"] if reset else []))
        finally:
            self.sys.open(self.program)
        if result.exit_code != 0:
            if isinstance(result.exception, SystemExit) and (self.lowprec or
                                                             (reset and had_rows)):
                return  # refused loudly: the comparison checks that nothing changed
            raise Violation(f"sstore migrate{' --reset' if reset else ''} failed (exit "
                            f"{result.exit_code}): {result.output[-800:]} "
                            f"{result.exception!r}")
        self.delivered(expected)

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
    """Few, short retries: the model's PostgreSQL does not go away."""
    from sstore.retry import RetryPolicy
    return RetryPolicy(attempts=2)
