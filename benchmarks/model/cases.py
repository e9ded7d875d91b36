"""Issue 34's "What was seen", each as a short fixed program of the model's own rules: proof that
the model can reach every case (it has the operations and the checks that notice it), and a
regression test of each (``tests/benchmarks/test_model.py``). The random programs reach the same
cases; these are their shrunk form, written down.

A case is (durability mode, steps); a step is (rule method of ``ModelMachine``, arguments).
Running one compares the system with the model after every step, as the random run does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from benchmarks.model import context as shared
from benchmarks.model.context import Context, Switches
from benchmarks.model.machine import ModelMachine

if TYPE_CHECKING:
    from migrators.embedded_postgres import PrivatePostgres

Step = tuple[str, dict[str, Any]]

#: a batch of two records near midnight, a fraction of a second that a timestamp(0) rounds
NEAR_MIDNIGHT = [(0, 1250, 600_000), (1, 4999, 999_999)]

CASES: dict[str, tuple[str, list[Step]]] = {
    # 1. ingest_and_run hides the border batch from a procedure reading the stream's table
    "1_ingest_and_run_reads_back": ("full", [
        ("ingest", {"spec": [(0, 100, 0), (1, 200, 0)], "fused": True, "shape": "tuples"}),
    ]),
    # 2. a polling source resuming with an offer that overlaps what the engine took
    "2_coalescer_resume_overlap": ("full", [
        ("ingest", {"spec": [(0, 100, 0)] * 3, "fused": False, "shape": "tuples"}),
        ("run", {}),
        ("coalesce", {"offers": [[(1, 300, 0)] * 4], "overlap": 2}),
    ]),
    # 3. a stream redeclared with other column types on an existing state
    "3_redeclared_types": ("full", [
        ("ingest", {"spec": [(0, 100, 0)], "fused": False, "shape": "tuples"}),
        ("redeclare", {"variant": "k_varchar"}),
        ("redeclare", {"variant": "amt_double"}),
    ]),
    # 4. a PostgreSQL target of lower time precision rounds silently
    "4_lower_precision_target": ("full", [
        ("target_of_lower_precision", {"column": "timestamp(0)"}),
        ("ingest", {"spec": NEAR_MIDNIGHT, "fused": False, "shape": "tuples"}),
        ("run", {}),
        ("sink", {}),
    ]),
    # 5. sstore migrate --reset after deleting a row re-appends every batch
    "5_migrate_reset_duplicates": ("full", [
        ("ingest", {"spec": [(0, 100, 0)] * 3, "fused": False, "shape": "tuples"}),
        ("ingest", {"spec": [(1, 200, 0)] * 3, "fused": False, "shape": "tuples"}),
        ("run", {}),
        ("migrate", {"reset": False}),
        ("target_by_hand", {"what": "delete_one"}),
        ("migrate", {"reset": True}),
    ]),
    # 6. Engine.execute writes into a stream, and deletes batches a consumer has not read
    "6_execute_writes_streams": ("full", [
        ("ingest", {"spec": [(0, 100, 0)], "fused": False, "shape": "tuples"}),
        ("run", {}),
        ("write_a_stream", {"what": "insert_orders", "via_execute": True}),
        ("write_a_stream", {"what": "delete_enriched", "via_execute": True}),
    ]),
    # 7. weak durability replays an ad hoc copy to a different state (replay runs no GC)
    "7_weak_replay_differs": ("weak", [
        ("ingest", {"spec": [(0, 100, 0)] * 3, "fused": False, "shape": "tuples"}),
        ("run", {}),
        ("ingest", {"spec": [(1, 200, 0)] * 2, "fused": False, "shape": "tuples"}),
        ("run", {}),
        ("collect_garbage", {}),
        ("archive_copy", {"tag": 7}),
        ("restart", {}),
    ]),
    # 8. ad hoc transactions and execute never checkpoint: the WAL grows past its bound
    "8_adhoc_never_checkpoints": ("full", [
        ("note", {"via_execute": i % 2 == 0}) for i in range(8)
    ]),
    # 9. retire, then a procedure writing the same output
    "9_retire_then_same_output": ("full", [
        ("ingest", {"spec": [(0, 100, 0)], "fused": False, "shape": "tuples"}),
        ("run", {}),
        ("ingest", {"spec": [(1, 200, 0)], "fused": False, "shape": "tuples"}),
        ("run", {}),
        ("rename", {}),
        ("ingest", {"spec": [(2, 300, 0)], "fused": False, "shape": "tuples"}),
        ("run", {}),
    ]),
    # 10. Python floats a user typed (19.99, 130.42) into DECIMAL(10,2), on every input shape
    "10_typed_floats": ("full", [
        ("ingest", {"spec": [(0, 1999, 0), (1, 13042, 0)], "fused": False, "shape": shape})
        for shape in ("tuples", "dicts", "arrow", "pandas")
    ]),
}


#: what the model found beyond the issue's list (docs/chaos.md, "What the model found")
FOUND: dict[str, tuple[str, list[Step]]] = {
    # weak durability: a batch ingested after a checkpoint and a restart is lost at the next
    # restart (the emptied log numbers its records from 1 again, at or below the snapshot's
    # last log position, and replay skips them)
    "weak_checkpoint_restart_loses_batch": ("weak", [
        ("ingest", {"spec": [(0, 100, 0)], "fused": False, "shape": "tuples"}),
        ("checkpoint", {}),
        ("restart", {}),
        ("ingest", {"spec": [(1, 200, 0)], "fused": False, "shape": "tuples"}),
        ("restart", {}),
    ]),
    # weak durability: a rename with the old name retired (the documented way) makes the
    # next restart refuse the input log: replay runs the new procedure where the log recorded
    # the old one, and blames non-determinism
    "weak_rename_refused_at_restart": ("weak", [
        ("ingest", {"spec": [(0, 100, 0)], "fused": False, "shape": "tuples"}),
        ("run", {}),
        ("rename", {}),
    ]),
    # weak durability: a stream redeclared with other column types is accepted when the state
    # is an input log without a snapshot (replay converts the logged batches to the new types)
    "weak_redeclared_types_accepted": ("weak", [
        ("ingest", {"spec": [(0, 1999, 0)], "fused": False, "shape": "tuples"}),
        ("redeclare", {"variant": "amt_double"}),
        ("redeclare", {"variant": "k_varchar"}),
    ]),
    # the consumer port takes an acknowledgement of a batch the stream never committed
    "acknowledge_ahead_accepted": ("full", [
        ("ingest", {"spec": [(0, 100, 0)], "fused": False, "shape": "tuples"}),
        ("run", {}),
        ("acknowledge_ahead", {"ahead": 5}),
    ]),
}
#: the step kinds added for PostgreSQL restarts, hand-emptied targets, continuous sinks and
#: stops by signal, each in a short fixed program (the random programs reach them too)
KINDS: dict[str, tuple[str, list[Step]]] = {
    # PostgreSQL stopped while the engine goes on; an attached sink retries and delivers
    "pg_restart_attached_sink": ("full", [
        ("attach_sink", {"group": False, "accept_gap": False}),
        ("postgres_restart", {"mode": "immediate", "during": "ingest"}),
        ("postgres_restart", {"mode": "fast", "during": "before_commit"}),
        ("postgres_restart", {"mode": "immediate", "during": "after_commit"}),
    ]),
    # a sink group; PostgreSQL away while a one-shot sink and sstore migrate try to deliver
    "pg_restart_one_shot": ("full", [
        ("append_batch", {}), ("run", {}),
        ("postgres_restart", {"mode": "fast", "during": "sink"}),
        ("postgres_restart", {"mode": "immediate", "during": "migrate"}),
        ("append_batch", {}), ("append_batch", {}), ("run", {}),
        ("postgres_restart", {"mode": "immediate", "during": "before_commit"}),
        ("append_batch", {}), ("append_batch", {}), ("run", {}),
        ("postgres_restart", {"mode": "fast", "during": "after_commit"}),
        ("attach_sink", {"group": True, "accept_gap": True}),
        ("postgres_restart", {"mode": "fast", "during": "ingest"}),
    ]),
    # a target emptied by hand after GC removed delivered batches: refilled from what the
    # engine still has only with accept_gap; without it GapError, loud, nothing changed
    "truncated_target_gap": ("full", [
        ("append_batch", {}), ("run", {}), ("sink", {"accept_gap": False}),
        ("read_and_acknowledge", {}), ("collect_garbage", {"run_first": False}),
        ("append_batch", {}), ("run", {}),
        ("target_by_hand", {"what": "truncate"}),
        ("sink", {"accept_gap": False}),
        ("migrate", {"reset": False, "accept_gap": False}),
        ("attach_sink", {"group": False, "accept_gap": False}),
        ("attach_sink", {"group": True, "accept_gap": True}),
        ("target_by_hand", {"what": "drop"}),
        ("migrate", {"reset": False, "accept_gap": True}),
    ]),
    # the same while a continuous sink runs: it notices at the next commit, and halts (the
    # user resumes it) or refills
    "truncated_while_attached": ("full", [
        ("attach_sink", {"group": False, "accept_gap": False}),
        ("append_batch", {}), ("run", {}), ("read_and_acknowledge", {}),
        ("collect_garbage", {"run_first": False}),
        ("target_by_hand", {"what": "truncate"}),
        ("append_batch", {}), ("run", {}),
        ("attach_sink", {"group": True, "accept_gap": True}),
        ("target_by_hand", {"what": "drop"}),
        ("collect_garbage", {"run_first": True}),
        ("append_batch", {}), ("collect_garbage", {"run_first": True}),
        ("target_by_hand", {"what": "truncate"}),
        ("append_batch", {}), ("run", {}),
    ]),
    # SIGTERM stops a child cleanly, with an attached sink in it (SIGINT: the random programs)
    "signal_stops": ("weak", [
        ("append_batch", {}), ("run", {}), ("sink", {}),
        ("do_stop", {"spec": [(0, 100, 0)], "fused": False, "point": "te.before_commit",
                            "hit": 1, "sig": "TERM", "sink": True}),
    ]),
    # weak durability: GC is logged and replayed, acknowledgements are not: after a restart
    # the consumers' acknowledgements are back at 0 while the batches they had taken are gone
    # (the model's first --model run with attached sinks flagged this: its own mistake)
    "weak_restart_after_gc": ("weak", [
        ("append_batch", {}), ("run", {}), ("sink", {}), ("read_and_acknowledge", {}),
        ("collect_garbage", {"run_first": False}), ("restart", {}),
        ("sink", {"accept_gap": False}),
    ]),
    # the same for the reader: after the restart its acknowledgement is back at 0 and the
    # batches it had taken are gone; it reads on from the first batch still there (the
    # one-hour --model run, seed 43, flagged it after a rename: the model's mistake again)
    "weak_restart_then_read": ("weak", [
        ("append_batch", {}), ("run", {}), ("sink", {}), ("read_and_acknowledge", {}),
        ("collect_garbage", {"run_first": False}), ("append_batch", {}), ("run", {}),
        ("restart", {}), ("read_and_acknowledge", {}),
    ]),
}
#: issue 38's steps (``benchmarks.model.changes``) in fixed programs
CHANGES: dict[str, tuple[str, list[Step]]] = {
    # the streams evolve between deliveries: the target follows with the next rows
    "38_evolve_then_deliver": ("full", [
        ("append_batch", {}), ("run", {}), ("sink", {}),
        ("evolve", {}), ("append_batch", {}), ("run", {}), ("sink", {}),
        ("restart", {}), ("append_batch", {}), ("run", {}), ("migrate", {"reset": False}),
        ("redeclare", {"variant": "k_varchar"}),
    ]),
    # weak durability: the evolution after a checkpoint, batches on both sides, a restart
    "38_evolve_weak": ("weak", [
        ("append_batch", {}), ("run", {}), ("sink", {}),
        ("evolve", {}), ("append_batch", {}), ("run", {}), ("sink", {}), ("restart", {}),
        ("append_batch", {}), ("run", {}), ("sink", {}),
    ]),
    # columns appended (NULL, a declared default) between deliveries, an old batch re-sent
    # without them, the target following; then k widened too
    "38_append_columns": ("full", [
        ("append_batch", {}), ("run", {}), ("sink", {}), ("append_batch", {}),
        ("append_columns", {}), ("append_batch", {}), ("run", {}), ("sink", {}),
        ("do_resend", {"batch_id": 2, "fused": False, "same": True}),
        ("do_resend", {"batch_id": 2, "fused": False, "same": False}),
        ("do_resend", {"batch_id": 6, "fused": True, "same": True}),
        ("restart", {}), ("append_batch", {}), ("run", {}), ("migrate", {"reset": False}),
        ("evolve", {}), ("append_batch", {}), ("run", {}), ("target_by_hand", {"what": "drop"}),
        ("sink", {}), ("redeclare", {"variant": "k_varchar"}),
    ]),
    # weak durability: columns appended after a checkpoint, the target following, a restart
    "38_append_weak": ("weak", [
        ("append_batch", {}), ("run", {}), ("sink", {}), ("append_columns", {}),
        ("append_batch", {}), ("run", {}), ("restart", {}), ("sink", {}),
        ("do_resend", {"batch_id": 2, "fused": False, "same": True}),
        ("append_batch", {}), ("run", {}), ("sink", {}),
    ]),
    # the enrich procedure upgraded with batches pending, renamed, upgraded again
    "38_upgrade": ("full", [
        ("append_batch", {}), ("run", {}), ("append_batch", {}),
        ("upgrade", {}), ("run", {}), ("rename", {}), ("append_batch", {}), ("upgrade", {}),
        ("run", {}), ("sink", {}), ("rename", {}), ("append_batch", {}), ("run", {}),
        ("sink", {}),
    ]),
    # a second writer on a copy of the state file fences this program's sink
    "38_second_writer": ("full", [
        ("append_batch", {}), ("run", {}), ("sink", {}), ("append_batch", {}), ("run", {}),
        ("second_writer", {}), ("append_batch", {}), ("run", {}), ("sink", {}),
        ("evolve", {}), ("append_batch", {}), ("run", {}), ("second_writer", {}),
        ("sink", {}),
    ]),
}
CASES_AND_FOUND = {**CASES, **FOUND, **KINDS, **CHANGES}


def run_case(url: str, name: str, server: PrivatePostgres | None = None) -> ModelMachine:
    """Run case ``name`` against the system at ``url`` (on ``server``, which the restart
    steps need) with every switch on; raises ``machine.Violation`` where the system breaks a
    guarantee."""
    mode, steps = CASES_AND_FOUND[name]
    shared.CONTEXT = Context(url, Switches(), server)
    m = ModelMachine()
    try:
        m.start(mode)
        m.matches_the_model()
        for rule, kwargs in steps:
            getattr(m, rule)(**kwargs)
            m.matches_the_model()
    finally:
        m.teardown()
    return m
