"""Rewrite 1 (before any plan is proposed): leave out fragments that hold no rows.

A split object whose streaming part is empty (everything already migrated) or whose
PostgreSQL part is empty (everything still fresh) then lives in one engine, and rule 1 runs the
query there whole instead of moving nothing between engines. The row counts come from the
engines just before planning; a row that arrives in an empty fragment after that is not part
of this answer (there is no snapshot across engines to hold it to).

An empty PostgreSQL fragment that a kept stream of the same object is delivered into
(``inp.delivered``) is kept: the sink may deliver a batch and garbage collection drop it from
the stream before the plan runs, and a plan that read the stream alone would miss it; read
together, the stream past the sink's watermark, the batch is counted once.

Every fragment empty: one is read, so that the answer has the columns; a sink's target
rather than its stream. The run checks that a target read without its stream still holds
what the sink's watermark counts, and that the engine did not collect batches the target
lacks (``Plan.checks``); the stream read alone has no such check, and a target dropped and
created again empty after everything was delivered and collected answered no row, exit 0.
"""

from __future__ import annotations

from dataclasses import replace

from sstore.polystore.catalog import Fragment
from sstore.polystore.planning import PlanningInput


def prune_empty_fragments(inp: PlanningInput) -> PlanningInput:
    objects = []
    delivered_into = {Fragment(d.engine, d.target) for d in inp.delivered.values()}
    for obj in inp.objects:
        kept = [f for f in obj.fragments if f not in inp.stats or inp.stats[f].rows != 0]
        targets = {Fragment(d.engine, d.target) for f, d in inp.delivered.items() if f in kept}
        kept = [f for f in obj.fragments if f in kept or f in targets]
        if not kept:
            kept = [f for f in obj.fragments if f in delivered_into][:1] or obj.fragments[:1]
        objects.append(obj if kept == obj.fragments else replace(obj, fragments=kept))
    return replace(inp, objects=tuple(objects))
