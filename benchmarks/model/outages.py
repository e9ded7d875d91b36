"""PostgreSQL going away and coming back, as a rule of the model (issue 34: "PostgreSQL
restarts"). Only with a private server (``Context.server``: ``migrators.embedded_postgres``),
never the machine's shared one; ``python -m benchmarks.chaos --model`` and
``tests/benchmarks/test_model.py`` start one of their own.

One step stops the server (``fast``: clients disconnected, a checkpoint; ``immediate``: a
crash, recovered from the WAL at the next start), does something while it is away, and starts
it again, so that between steps the server always runs and the comparison can read the target:

- ``sink``: a one-shot ``StreamToPostgres.run_once`` while it is away must fail loudly (its
  few retries spent) with a ``TransientError`` (a caller may retry it later) and leave
  everything as it was;
- ``migrate``: ``sstore migrate`` likewise (exit status not 0, nothing changed);
- ``ingest``: the engine goes on without the warehouse (a new batch, run); an attached sink
  retries in its thread and delivers once the server is back;
- ``before_commit`` / ``after_commit``: the restart lands inside a delivery instead: after the
  COPY, before its COMMIT (the transaction is lost: retried on a new connection), or after a
  chunk's COMMIT, before the next chunk. A one-shot sink (one batch a chunk) must still deliver
  everything once; an attached sink gets the fault on the next batch that commits.

After the step the comparison checks the target against the model (an attached sink is waited
for first): every row once, none lost.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from benchmarks.model.context import Violation, ctx, on
from benchmarks.model.warehouse import WarehouseRules, quick_retry
from sstore.base.errors import SStoreError, TransientError

DURING = ("sink", "migrate", "ingest", "before_commit", "after_commit")


class OutageRules(WarehouseRules):
    """The PostgreSQL restart rule (module docstring); a mixin of ``ModelMachine``."""

    #: a new batch made from its numbers (``machine.ModelMachine.append_batch``)
    append_batch: Any

    @on("pg_restart")
    @precondition(lambda self: self.system is not None and ctx().server is not None)
    @rule(mode=st.sampled_from(["fast", "immediate"]), during=st.sampled_from(DURING))
    def postgres_restart(self, mode: str, during: str) -> None:
        server = self.ctx.server
        assert server is not None
        if during == "migrate" and self.sys.mode != "full":
            during = "sink"  # sstore migrate reads a state file (full durability)
        self.step(f"pg_{mode}_{during}")
        if during in ("before_commit", "after_commit"):
            self.restart_in_delivery(mode, during)
            return
        server.stop(mode)
        self.ctx.fault(f"pg_{mode}")
        try:
            if during == "ingest":
                self.append_batch()
                self.sys.e.run_until_idle()
                self.model.run_all()
            elif during == "sink":
                self.sink_while_away()
            else:
                self.migrate_while_away()
        finally:
            server.start()
            self.sys.close_pg()

    def sink_while_away(self) -> None:
        """A one-shot delivery with PostgreSQL away: it must raise, after its retries."""
        from migrators import StreamToPostgres
        sink = StreamToPostgres(self.sys.e, "enriched", self.sys.url, self.sys.table,
                                accept_gap=True, retry=quick_retry())
        try:
            sink.run_once()
        except TransientError:
            return  # loud, and retryable: the comparison checks that nothing changed
        except Exception as exc:
            raise Violation(f"a sink with PostgreSQL stopped raised {type(exc).__name__}, not a "
                            f"transient error (a caller would not retry): {exc}") from exc
        finally:
            self.sys.e.unregister_sink(sink)
        raise Violation("a sink delivered while PostgreSQL was stopped")

    def migrate_while_away(self) -> None:
        """``sstore migrate`` with PostgreSQL away: exit status not 0, nothing changed."""
        result = self.run_migrate(reset=False, accept_gap=True)
        if result.exit_code == 0:
            raise Violation(f"sstore migrate exited 0 while PostgreSQL was stopped: "
                            f"{result.output[-400:]}")
        if not isinstance(result.exception, SystemExit):
            raise Violation(f"sstore migrate with PostgreSQL stopped failed with a traceback, "
                            f"not a message: {result.exception!r}")

    def restart_in_delivery(self, mode: str, where: str) -> None:
        """PostgreSQL restarted inside a delivery (module docstring): the attached sink's
        hooks on the next batch, else a one-shot sink of one batch a chunk."""
        if self.sys.attached is not None:
            self.pending_pg_fault[where] = mode
            try:
                self.append_batch()
                self.sys.e.run_until_idle()
                self.model.run_all()
                self.settle()
            finally:
                self.pending_pg_fault.pop(where, None)  # nothing was delivered: no fault
            return
        from migrators import StreamToPostgres
        expected, gap = self.expected_delivery(reset=False), self.gap_expected(reset=False)
        hook = self.pg_fault_hook(where)
        sink = StreamToPostgres(self.sys.e, "enriched", self.sys.url, self.sys.table,
                                accept_gap=True, retry=quick_retry(), chunk_rows=1,
                                before_commit=hook if where == "before_commit" else None,
                                on_delivered=hook if where == "after_commit" else None)
        self.pending_pg_fault[where] = mode
        try:
            sink.run_once()
        except Exception as exc:  # noqa: BLE001 - judged below
            if isinstance(exc, SStoreError):
                self.refused(f"a sink with PostgreSQL restarted {where}", exc, gap, True)
                return
            raise Violation(f"a sink with PostgreSQL restarted {where} failed: "
                            f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.pending_pg_fault.pop(where, None)
            self.sys.e.unregister_sink(sink)
            self.sys.close_pg()
        self.delivered(expected)
