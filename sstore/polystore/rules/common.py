"""Pieces several rules share: reading a fragment, and the final query over replaced names."""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from sstore.polystore.catalog import CatalogObject, Fragment
from sstore.polystore.meaning import kept_in_postgres
from sstore.polystore.plan import Run, Step
from sstore.polystore.planning import PlanningInput
from sstore.polystore.sqltext import (
    fragment_select,
    needed_columns,
    output_columns,
    output_rows,
    physical_table,
    pushable_filter,
    substitute,
    to_sql,
    union_all,
)
from sstore.storage.streams import BATCH_COLUMN

GROWING_COLUMN = BATCH_COLUMN  # an engine stream's batch-id, which a sink's watermark counts

# (engine, SQL in its dialect, name it gets, rows, columns) -> the step that brings it over
MakeStep = Callable[[str, str, str, int, int], Step]


def gather_fragments(inp: PlanningInput, make_step: MakeStep, prefix: str = ""
                     ) -> tuple[list[Step], dict[str, exp.Expression]]:
    """Bring every fragment to one place under its own name (``orders__0``, ``orders__1``,
    after ``prefix``: an engine's scratch namespace): the steps, and what each object becomes
    there (its parts' UNION ALL)."""
    steps: list[Step] = []
    replacements: dict[str, exp.Expression] = {}
    for obj in inp.objects:
        parts = []
        for i, fragment in enumerate(obj.fragments):
            name = fragment_name(obj, i, prefix)
            select = read_fragment(inp, obj, fragment)
            steps.append(make_step(fragment.engine, to_sql(select, inp.dialect(fragment.engine)),
                                   name, inp.stats[fragment].rows, width(inp, obj)))
            parts.append(exp.select(exp.Star()).from_(physical_table(name)))
        replacements[obj.name] = (physical_table(parts[0].args["from_"].this.name)
                                  if len(parts) == 1 else combined(parts))
    return steps, replacements


def fragment_name(obj: CatalogObject, i: int, prefix: str = "") -> str:
    """The name fragment ``i`` of ``obj`` is fetched or moved under (``orders__0``)."""
    return f"{prefix}{obj.name.replace('.', '_')}__{i}"


def read_fragment(inp: PlanningInput, obj: CatalogObject, fragment: Fragment,
                  physical: str | None = None, project: bool = True, guard: bool = True
                  ) -> exp.Select:
    """The SELECT that reads one fragment: only the columns the query can use, and the query's
    filter when it can run at the fragment. ``physical`` overrides where it is read from (a
    cached copy). A split object always names its common columns, so the parts line up.

    A stream a sink delivers into another fragment (``inp.delivered``) is read past the sink's
    watermark only, so a batch in both fragments counts once; ``guard=False`` reads it whole
    (the source of a cached copy, which must hold the stream as it is)."""
    columns = inp.columns_of(obj)
    wanted = needed_columns(inp.tree, columns) if project else None
    if wanted is None and obj.split:
        wanted = columns
    where: exp.Expr | None = pushable_filter(inp.tree, obj.name) if project else None
    if where is not None and kept_in_postgres(where, inp.dialect(fragment.engine)):
        where = None  # the fragment's engine would change its meaning: the final query filters
    link = inp.delivered.get(fragment) if guard else None
    if link is not None:
        past = exp.GT(this=exp.column(GROWING_COLUMN, quoted=True),
                      expression=exp.Placeholder(this=link.placeholder))
        where = past if where is None else exp.and_(exp.paren(where.copy()), past)
    return fragment_select(physical or fragment.physical, wanted, where)


def combined(parts: list[exp.Select]) -> exp.Expression:
    """One object's parts as one relation (a UNION ALL when there are several)."""
    return parts[0] if len(parts) == 1 else union_all(parts)


def replace_object(parts: list[exp.Select]) -> exp.Expression:
    """What a table reference becomes: a bare table for a single ``SELECT * FROM t``,
    otherwise the parts as a subquery."""
    if len(parts) == 1:
        only = parts[0]
        source = only.args["from_"].this
        if (not only.args.get("where") and len(only.expressions) == 1
                and isinstance(only.expressions[0], exp.Star)
                and isinstance(source, exp.Expression)):
            return source.copy()
    return combined(parts)


def final_run(inp: PlanningInput, engine: str, dialect: str,
              replacements: dict[str, exp.Expression]) -> Run:
    tree = substitute(inp.tree, replacements)
    rows = inp.input_rows()
    star_columns = sum(len(inp.columns_of(o)) for o in inp.objects)
    return Run(engine, to_sql(tree, dialect), rows, star_columns, output_rows(inp.tree, rows),
               output_columns(inp.tree, star_columns))


def width(inp: PlanningInput, obj: CatalogObject) -> int:
    columns = inp.columns_of(obj)
    return len(needed_columns(inp.tree, columns) or columns) or 1
