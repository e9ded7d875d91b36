"""Rule 4: move every fragment into Spark and run the query there.

Plan (iii), for inputs too large for one process: PostgreSQL fragments are read by Spark
itself (JDBC, partitioned), engine fragments arrive as Arrow, and Spark SQL combines them. Only
proposed when the catalog has a Spark engine; its start-up and per-job costs make it lose on
small inputs, which the cost model knows. The views are named in the polystore's scratch
namespace (``sstore_scratch__orders__0``), so they never replace a view of the user's; they
are dropped after the query.
"""

from __future__ import annotations

from sstore.polystore.catalog import EngineKind
from sstore.polystore.plan import Move, Plan
from sstore.polystore.planning import PlanningInput
from sstore.polystore.rules.common import final_run, gather_fragments
from sstore.polystore.scratch import SPARK_SCRATCH_PREFIX


def run_in_spark(inp: PlanningInput) -> list[Plan]:
    if len(inp.engines_used()) < 2:
        return []
    sparks = [name for name, e in inp.engines.items() if e.kind is EngineKind.SPARK]
    if not sparks or any(inp.kind(e) is EngineKind.SPARK for e in inp.engines_used()):
        return []  # no Spark; or Spark already holds a part and rule 2 covers moving into it
    spark = sparks[0]

    def to_spark(engine: str, sql: str, view: str, rows: int, columns: int) -> Move:
        return Move(engine, sql, spark, view, rows, columns)

    moves, replacements = gather_fragments(inp, to_spark, SPARK_SCRATCH_PREFIX)
    final = final_run(inp, spark, inp.dialect(spark), replacements)
    return [Plan(f"in {spark}", "run_in_spark", tuple(moves), final)]
