"""After the rules: drop the plans whose final query would run where PostgreSQL's meaning is
not kept (``sstore.polystore.meaning``).

A query with an integer division, a NATURAL JOIN, a function no other engine runs the same
way... gets PostgreSQL's answer only from PostgreSQL: plans that run its final query in the
engine's DuckDB, in the island or in Spark are not proposed; the plans that move the other
fragments into PostgreSQL remain. Fetches never carry such a construct: a filter is pushed
into a fragment only when its engine keeps the filter's meaning (``rules.common``).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from sstore.polystore.catalog import EngineEntry, EngineKind
from sstore.polystore.meaning import POSTGRES, kept_in_postgres, naming_kept_columns
from sstore.polystore.plan import ISLAND, Plan, Run
from sstore.polystore.planning import PlanningInput
from sstore.polystore.sqltext import ISLAND_DIALECT, QueryError, to_sql


def final_dialect(inp: PlanningInput, plan: Plan) -> str:
    engine = plan.final.engine
    return ISLAND_DIALECT if engine == ISLAND else inp.dialect(engine)


def keep_meaning(inp: PlanningInput, plans: list[Plan]) -> list[Plan]:
    """The plans whose final query keeps PostgreSQL's meaning; none left is a ``QueryError``
    that says what only PostgreSQL answers."""
    kept: list[Plan] = []
    reasons: list[str] = []
    by_dialect: dict[str, list[str]] = {}  # one walk of the tree per dialect
    for plan in plans:
        dialect = final_dialect(inp, plan)
        if dialect not in by_dialect:
            by_dialect[dialect] = kept_in_postgres(inp.tree, dialect) + (
                naming_kept_columns(inp.tree, inp.kept_columns) if dialect != POSTGRES else [])
        why = by_dialect[dialect]
        if why:
            reasons.extend(r for r in why if r not in reasons)
        else:
            kept.append(plan)
    if plans and not kept:
        raise QueryError("only PostgreSQL answers this query as written ("
                         + "; ".join(reasons) + "), and no plan can run it there: its objects "
                         "live only in other engines")
    return kept


def runs_outside_postgres(plan: Plan, engines: Mapping[str, EngineEntry]) -> bool:
    """Does the plan's final query run in the island or an engine other than PostgreSQL?
    (It then runs in PostgreSQL's session time zone: ``Plan.time_zone``.)"""
    entry = engines.get(plan.final.engine)
    return entry is None or entry.kind is not EngineKind.POSTGRES


def without_tables(tree: exp.Expression, engines: Mapping[str, EngineEntry]) -> Plan:
    """The plan of a query that reads no table: the island runs it, unless it holds something
    only PostgreSQL answers as written (``SELECT 7 / 2`` is 3 there, 3.5 in DuckDB): then the
    catalog's first PostgreSQL engine does; with none it is refused with the reason."""
    reasons = kept_in_postgres(tree, ISLAND_DIALECT)
    if not reasons:
        return Plan("island", "no_tables", (), Run(ISLAND, to_sql(tree, ISLAND_DIALECT),
                                                   0, 0, 1, 1))
    for entry in engines.values():
        if entry.kind is EngineKind.POSTGRES:
            return Plan(f"in {entry.name}", "no_tables", (),
                        Run(entry.name, to_sql(tree, POSTGRES), 0, 0, 1, 1))
    raise QueryError("only PostgreSQL answers this query as written (" + "; ".join(reasons)
                     + "), and the catalog has no PostgreSQL engine")
