"""Rule 2: move the other engines' fragments into one engine, then run the query there.

For a UNION over a split object this is the paper's plan (i): migrate the streaming engine's
rows into PostgreSQL and let PostgreSQL do the UNION. For a join across engines it is "cast the
smaller side": one plan per engine that can take the moves, and the cost model picks the one
that moves fewest bytes (an engine opened read-only, such as a state file named on the
command line, is never a target). Moved fragments are kept as caches (``cache_key``): when the
source has
not changed, a later query pays nothing for the move; an append-only stream pays only for its
new batches (``incremental_by``).
"""

from __future__ import annotations

from sqlglot import exp

from sstore.polystore.catalog import CatalogObject
from sstore.polystore.plan import Move, Plan, Step
from sstore.polystore.planning import TRAITS, PlanningInput, cache_key, cache_table
from sstore.polystore.rules.common import combined, final_run, read_fragment
from sstore.polystore.sqltext import physical_table, to_sql


def migrate_then_run(inp: PlanningInput) -> list[Plan]:
    engines = inp.engines_used()
    if len(engines) < 2:
        return []
    plans = []
    for target in engines:
        kind = inp.kind(target)
        if not (TRAITS[kind].accepts_moves and TRAITS[kind].executes_plans) \
                or target in inp.read_only:
            continue
        steps: list[Step] = []
        replacements: dict[str, exp.Expression] = {}
        for obj in inp.objects:
            parts = []
            for fragment in obj.fragments:
                if fragment.engine == target:
                    parts.append(read_fragment(inp, obj, fragment, project=False))
                    continue
                key = cache_key(obj, fragment, target)
                table = cache_table(kind, key)
                stats = inp.stats[fragment]
                columns = inp.columns_of(obj)
                if stats.growing_column and stats.growing_column not in columns:
                    columns = [*columns, stats.growing_column]  # the cache needs it to grow
                source = read_fragment(inp, obj, fragment, project=False, guard=False)
                source = source.select(*[exp.column(c, quoted=True) for c in columns],
                                       append=False)
                steps.append(Move(fragment.engine, to_sql(source, inp.dialect(fragment.engine)),
                                  target, table, stats.rows, len(columns), cache_key=key,
                                  cached_rows=inp.cached.get(key, 0),
                                  incremental_by=stats.growing_column))
                parts.append(read_fragment(inp, obj, fragment, physical=table, project=False))
            if len(obj.fragments) == 1 and obj.fragments[0].engine == target:
                replacements[obj.name] = physical_table(obj.fragments[0].physical)
            else:
                replacements[obj.name] = combined(_user_columns(inp, obj, parts))
        final = final_run(inp, target, inp.dialect(target), replacements)
        plans.append(Plan(f"migrate into {target}", "migrate_then_run", tuple(steps), final))
    return plans


def _user_columns(inp: PlanningInput, obj: CatalogObject,
                  parts: list[exp.Select]) -> list[exp.Select]:
    """Read every part with the object's columns (a cache also holds ``_batch_id``)."""
    columns = inp.columns_of(obj)
    return [p.select(*[exp.column(c, quoted=True) for c in columns], append=False)
            for p in parts]
