"""What every program of a model run shares: the switches that leave operations out, the
counters a run reports, the ``Violation`` a broken guarantee raises, and ``on``, the
precondition every rule carries (``benchmarks.model.machine`` has the rules)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hypothesis.stateful import precondition

if TYPE_CHECKING:
    from migrators.embedded_postgres import PrivatePostgres

#: operations (and checks) a run may leave out (``SSTORE_MODEL_SKIP``)
SWITCHES = (
    "ingest",           # new batches on ingest (and ingest_and_run unless off)
    "evolve",           # orders and enriched evolve (a widened column; the target follows)
    "append_columns",   # orders and enriched gain columns (NULL, a declared default)
    "upgrade",          # the enrich procedure declared with its next version
    "second_writer",    # a second engine on a copy of the state file fences the sink
    "run",              # run_until_idle
    "float_amounts",    # amounts typed as Python floats (else Decimals)
    "ingest_and_run",   # the fused ingest path
    "coalescer",        # the Coalescer, and its resume with overlapping offers
    "coalesce_overlap",  # only the overlapping resume
    "resend",           # re-sends of a batch-id (same rows, other rows) and out-of-order ids
    "adhoc",            # transaction() and execute() writes, the archive copy
    "weak_copy",        # only the archive copy in weak durability (replay must see the same)
    "execute_misuse",   # execute() / transaction() writing a stream
    "reader",           # the external consumer that reads and acknowledges
    "ack_ahead",        # acknowledging a batch never committed
    "gc",               # collect_garbage
    "checkpoint",       # Engine.checkpoint (weak durability: a snapshot, the log emptied)
    "sink",             # StreamToPostgres into the target
    "migrate",          # sstore migrate (full durability), with and without --reset
    "migrate_reset",    # only sstore migrate --reset
    "target_by_hand",   # truncate, drop, delete a row, create with timestamp(0)
    "lowprec_target",   # only the target created with lower-precision columns
    "restart",          # close and open again
    "rename",           # a restart that renames enrich and retires the old name
    "weak_rename",      # only the rename in weak durability
    "redeclare",        # a restart declaring orders with other column types
    "crash",            # SIGKILL of a child at a named crash point
    "signal_stop",      # SIGTERM / SIGINT of a child at a named point: a clean stop
    "attached_sink",    # a continuous sink (StreamToPostgres.attach) across steps
    "sink_group",       # only the continuous sink run as a SinkGroup
    "gap_refused",      # sinks and migrate without accept_gap (a gap must be refused)
    "pg_restart",       # the private PostgreSQL stopped and started (needs a private server)
    "wal",              # the WAL bound check
)


@dataclass
class Switches:
    skip: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls) -> Switches:
        names = {s.strip() for s in os.environ.get("SSTORE_MODEL_SKIP", "").split(",")
                 if s.strip()}
        unknown = names - set(SWITCHES)
        if unknown:
            raise ValueError(f"SSTORE_MODEL_SKIP names {sorted(unknown)}; known: {SWITCHES}")
        return cls(frozenset(names))

    def on(self, name: str) -> bool:
        return name not in self.skip


@dataclass
class Context:
    """What every program of a run shares: the PostgreSQL database, the switches, counters.
    ``server``: the private PostgreSQL the database is on, which the model may stop and start
    (None: a shared server, never restarted; the restart rules are then left out)."""

    url: str
    switches: Switches = field(default_factory=Switches)
    server: PrivatePostgres | None = None
    programs: int = 0
    steps: int = 0
    faults: int = 0
    #: faults that landed, by kind (SIGKILL, SIGTERM, a PostgreSQL restart ...)
    fault_kinds: dict[str, int] = field(default_factory=dict)
    by_rule: dict[str, int] = field(default_factory=dict)
    #: programs that ended at a loud refusal they cannot go past (why)
    stops: list[str] = field(default_factory=list)

    def count(self, rule: str) -> None:
        self.steps += 1
        self.by_rule[rule] = self.by_rule.get(rule, 0) + 1

    def fault(self, kind: str) -> None:
        """A fault landed (a process killed or stopped by signal, PostgreSQL restarted)."""
        self.faults += 1
        self.fault_kinds[kind] = self.fault_kinds.get(kind, 0) + 1


#: set by the test or the runner before the machine runs
CONTEXT: Context | None = None


class Violation(AssertionError):
    """The real system broke a guarantee the model checks."""


def ctx() -> Context:
    assert CONTEXT is not None, "set benchmarks.model.context.CONTEXT first"
    return CONTEXT


def on(name: str) -> Any:
    """The rule runs unless switched off, or the program stopped at a loud refusal."""
    return precondition(lambda self: self.stopped is None and ctx().switches.on(name))


