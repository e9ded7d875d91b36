"""A program that opens a state file again must declare its procedures and windows so that
their recorded progress still means what it meant.

Progress is recorded per node name: "procedure ``p`` has committed batches 1..n of its
inputs", "window ``w`` has taken batches 1..n of its source". Three edits between two runs
break that meaning without any other sign, and each was found losing or doubling rows silently:

1. **A procedure renamed** (its name defaults to the Python function's): the new name has no
   progress, so it runs again on every batch still kept, doubling every write the old name
   made. Refused when a procedure with no progress reads exactly the inputs of a procedure
   that the last run declared, that this run does not, and that has progress. Declare it under
   the old name (``name=``), or, if the old one is retired on purpose and the new one must
   process every kept batch, say so: ``Engine.retire("old")``.
2. **A procedure or window pointed at other inputs** (a stream renamed, a source changed): its
   progress (batch n of the old input) would skip batches 1..n of the new one, and a window's
   second record of a batch-id made the state file unopenable. Refused; give the node a new
   name to start it on its new input from the first kept batch.
3. **A tuple or batch window resized** (``rows=``, ``slide=``, ``batches=``): its first slide
   would mix tuples counted under both sizes. Refused, as event windows already refuse a
   changed declaration.
4. **A procedure writing a stream that already has later batches** (a retired procedure's
   output taken over by a new one, a border stream turned into an output): its first batch
   would be written below the stream's last, which a stream cannot take (its batch-ids are
   written once, in order); it halted on an internal assertion that ``resume`` could not get
   past. Refused unless its first batch comes after the stream's last (its inputs' older
   batches were collected): declare it under the old producer's name to carry on its
   progress, or give it an output stream of its own.

The last run's declarations are ``sstore_sys.graph`` (saved at every start); a state file
that has none (new, or from before the graph was saved) has nothing to check.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import duckdb

from sstore.base.errors import DeclarationError
from sstore.dataflow.graph import Graph
from sstore.storage import systables


def check(con: duckdb.DuckDBPyConnection, graph: Graph, retired: Collection[str]) -> None:
    """Raise ``DeclarationError`` for the first of the four edits above in ``graph``."""
    saved = systables.load_graph(con)
    if not saved:
        return
    progress = dict(con.execute("SELECT node, max(batch_id) FROM sstore_sys.commits "
                                "GROUP BY node").fetchall())
    procedures = {name: spec for name, kind, spec in saved if kind == "procedure"}
    windows = {name: spec for name, kind, spec in saved if kind == "window"}
    for name, decl in graph.procedures.items():
        before = procedures.get(name)
        if before is not None and progress.get(name):
            _same_inputs(f"procedure {name!r}", before["inputs"], list(decl.inputs),
                         progress[name])
        if before is None and not progress.get(name):
            _not_a_rename(name, list(decl.inputs), procedures, graph, progress, retired)
    collected = systables.load_collected(con)
    for name, decl in graph.procedures.items():
        start = progress.get(name) or max((collected.get(i, 0) for i in decl.inputs), default=0)
        for out in decl.outputs:
            last = max(progress.get(out) or 0, collected.get(out, 0))
            if last > start:
                _taken_output(name, out, start, last, saved)
    for name, window in graph.windows.items():
        before = windows.get(name)
        if before is None or not progress.get(name):
            continue
        _same_inputs(f"window {name!r}", [before["source"]], [window.source], progress[name])
        now = {"size": window.size, "slide": window.slide, "unit": window.unit}
        was = {key: before[key] for key in now}
        if was != now:
            raise DeclarationError(
                f"window {name!r} was declared with {_shape(was)} and has taken batches "
                f"through {progress[name]}; this program declares {_shape(now)}: its next "
                f"windows would mix tuples counted under both. Declare it as before, or give "
                f"the new shape a new name")


def _same_inputs(what: str, before: list[str], now: list[str], through: int) -> None:
    if sorted(before) != sorted(now):
        raise DeclarationError(
            f"{what} read {', '.join(before)} through batch {through} in this state file; this "
            f"program declares it on {', '.join(now)}: that progress would skip batches 1 to "
            f"{through} of the new input. Declare it on its old input, or give it a new name "
            f"to start it on the new one from its first kept batch")


def _not_a_rename(name: str, inputs: list[str], procedures: dict[str, dict[str, Any]],
                  graph: Graph, progress: dict[str, int], retired: Collection[str]) -> None:
    for old, spec in procedures.items():
        if old in graph.procedures or old in retired or not progress.get(old):
            continue
        if sorted(spec["inputs"]) == sorted(inputs):
            raise DeclarationError(
                f"procedure {name!r} is new and reads {', '.join(inputs)}, like procedure "
                f"{old!r}, which the last program declared, this one does not, and which "
                f"committed batches through {progress[old]}: if {old!r} was renamed, declare "
                f"it as name={old!r} (its progress then carries on); if {old!r} is retired and "
                f"{name!r} must process every kept batch again, call engine.retire({old!r}) "
                f"before the first ingest or run")


def _taken_output(name: str, out: str, start: int, last: int,
                  saved: list[tuple[str, str, dict[str, Any]]]) -> None:
    """Refuse procedure ``name``, which would write ``out`` from batch ``start + 1`` while
    ``out`` has batches through ``last`` (rule 4), naming who wrote them and what to do."""
    writers = [old for old, kind, spec in saved
               if kind == "procedure" and old != name and out in spec["outputs"]]
    border = any(kind == "stream" and old == out and spec.get("border")
                 for old, kind, spec in saved)
    who = (f"written by procedure {writers[0]!r}" if writers else
           "ingested as a border stream" if border else "written by an earlier program")
    carry = (f"To carry on where {writers[0]!r} stopped, declare this procedure as "
             f"name={writers[0]!r} (retire() does not hand a stream's batch-ids over); to "
             if writers else "To ")
    raise DeclarationError(
        f"procedure {name!r} writes stream {out!r}, which already has batches through batch "
        f"{last} ({who}); {name!r} would write it from batch {start + 1} on, but a stream's "
        f"batch-ids are written once, in order, so it could not commit. {carry}process the "
        f"kept batches again, give it an output stream of its own")


def _shape(spec: dict[str, Any]) -> str:
    return f"{spec['unit']}={spec['size']}, slide={spec['slide']}"
