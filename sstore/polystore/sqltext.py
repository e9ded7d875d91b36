"""SQL as trees (sqlglot): parse once, rewrite names, print in each engine's dialect.

Nothing here edits SQL text: queries are parsed into sqlglot expressions, object names are
replaced by physical names or by a UNION ALL of fragments as tree rewrites, and each engine gets
the tree printed in its own dialect (``DIALECTS``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from sstore.base.errors import TerminalError
from sstore.polystore.catalog import EngineKind
from sstore.polystore.meaning import translate

ISLAND_DIALECT = "duckdb"

# Engine kind -> sqlglot dialect. One table instead of ifs: a new engine kind is one line.
DIALECTS: Mapping[EngineKind | str, str] = {
    EngineKind.STREAMING: "duckdb",
    EngineKind.POSTGRES: "postgres",
    EngineKind.SPARK: "spark",
    "island": ISLAND_DIALECT,
}


class QueryError(TerminalError):
    """The query cannot be parsed or planned as written."""


def parse(sql: str, dialect: str = "postgres") -> exp.Expression:
    """One statement, parsed; a syntax error becomes a ``QueryError`` that shows where."""
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except ParseError as exc:
        raise QueryError(syntax_error(exc)) from None
    except TokenError:
        raise QueryError("cannot parse the query: a quote or comment is not closed, or a "
                         "character is not SQL") from None
    if len(statements) != 1:
        raise QueryError(f"expected one SQL statement, got {len(statements)}")
    statement = statements[0]
    if not isinstance(statement, exp.Expression):  # every statement sqlglot parses is one
        raise QueryError(f"cannot parse the query: {type(statement).__name__} is not a statement")
    return statement


@functools.lru_cache(maxsize=512)
def parse_shared(sql: str, dialect: str = "postgres") -> exp.Expression:
    """``parse``, kept by text: planning a repeated query parses it once. The tree is shared
    between callers, who must only read it (the planner's rules are pure: they copy before they
    rewrite, and tests/polystore/test_planner_golden.py checks they leave their input as it was)."""
    return parse(sql, dialect)


#: sqlglot's names of incomplete parts, in SQL's words
_PARTS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "eq": "=", "neq": "<>", "gt": ">",
          "gte": ">=", "lt": "<", "lte": "<=", "and": "AND", "or": "OR", "not": "NOT"}


def syntax_error(exc: ParseError) -> str:
    """sqlglot's parse error as one line in SQL's words: where, near what, what is wrong
    (its own text names Python classes: "Required keyword: 'this' missing for <class
    'sqlglot.expressions.query.Where'>" reads "WHERE is incomplete")."""
    first = exc.errors[0] if exc.errors else {}
    what = str(first.get("description") or exc).splitlines()[0]
    missing = re.match(r"Required keyword: '\w+' missing for <class '(?:[\w.]*\.)?(\w+)'>",
                       what)
    if missing:
        part = missing.group(1)
        what = f"{_PARTS.get(part.lower(), part.upper())} is incomplete"
    elif what.startswith("Invalid expression / Unexpected token"):
        what = "unexpected token"
    elif what.startswith("Expecting "):
        what = "expected " + what[len("Expecting "):]
    what = re.sub(r"<class '(?:[\w.]*\.)?(\w+)'>", r"\1", what)
    where = f" at line {first['line']}, column {first['col']}" if first.get("line") else ""
    near = " ".join(str(first.get("highlight") or "").split())
    return f"cannot parse the query{where}{f' (near {near!r})' if near else ''}: {what}"


def to_sql(tree: exp.Expression, dialect: str) -> str:
    """``tree`` (PostgreSQL's SQL) printed for ``dialect``, with PostgreSQL's meaning kept
    where the dialect needs a rewrite for it (``meaning.translate``)."""
    return translate(tree, dialect).sql(dialect=dialect)


def cte_names(tree: exp.Expression) -> set[str]:
    return {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}


def table_names(tree: exp.Expression) -> list[str]:
    """Names of the tables a query reads (lower-case, first-seen order), CTEs excluded.
    A schema-qualified name keeps its schema (``tpcdi.dimtrade``)."""
    ctes = cte_names(tree)
    seen: list[str] = []
    for table in tree.find_all(exp.Table):
        name = _full_name(table)
        if name and name not in ctes and name not in seen:
            seen.append(name)
    return seen


def _full_name(table: exp.Table) -> str:
    parts = [p for p in (table.catalog, table.db, table.name) if p]
    return ".".join(parts).lower()


def physical_table(physical: str) -> exp.Table:
    """``schema.table`` as a quoted table node."""
    parts = physical.split(".")
    if len(parts) == 1:
        return exp.Table(this=exp.to_identifier(parts[0], quoted=True))
    return exp.Table(this=exp.to_identifier(parts[-1], quoted=True),
                     db=exp.to_identifier(parts[-2], quoted=True))


def fragment_select(physical: str, columns: Sequence[str] | None,
                    where: exp.Expr | None = None) -> exp.Select:
    """``SELECT cols FROM physical [WHERE ...]``: how one fragment is read."""
    projection: list[exp.Expression] = (
        [exp.column(c, quoted=True) for c in columns] if columns else [exp.Star()])
    select = exp.select(*projection).from_(physical_table(physical))
    if where is not None:
        select = select.where(where.copy())
    return select


def union_all(parts: Sequence[exp.Select]) -> exp.Expression:
    tree: exp.Expression = parts[0]
    for part in parts[1:]:
        tree = exp.union(tree, part, distinct=False)
    return tree


def substitute(tree: exp.Expression, replacements: Mapping[str, exp.Expression]) -> exp.Expression:
    """Replace each table named in ``replacements`` (a physical table, or a query such as a
    UNION ALL of fragments). The reference keeps its alias, or gets the object's name as alias,
    so ``orders.o_id`` still resolves."""
    ctes = cte_names(tree)

    def swap(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Table):
            return node
        name = _full_name(node)
        if name in ctes or name not in replacements:
            return node
        target = replacements[name].copy()
        alias = _kept_alias(node, name)
        if isinstance(target, exp.Table):
            target.set("alias", alias)
            return target
        return exp.Subquery(this=target, alias=alias)

    return tree.copy().transform(swap)


def _kept_alias(node: exp.Table, name: str) -> exp.TableAlias:
    """The reference's alias with its column list (``dim AS q(k, cat, name)`` renames the
    columns by position), or the object's name as alias."""
    given = node.args.get("alias")
    if isinstance(given, exp.TableAlias) and given.this is not None:
        return given.copy()
    alias = exp.TableAlias(this=exp.to_identifier(name.split(".")[-1]))
    if isinstance(given, exp.TableAlias) and given.args.get("columns"):
        alias.set("columns", [c.copy() for c in given.args["columns"]])
    return alias


def references(tree: exp.Expression, name: str) -> int:
    """How many times the query names table ``name`` (CTEs of that name excluded)."""
    if name in cte_names(tree):
        return 0
    return sum(1 for table in tree.find_all(exp.Table) if _full_name(table) == name)


def has_alias_columns(tree: exp.Expression) -> bool:
    """Does a table reference rename columns by position (``AS q(a, b)``)?"""
    return any(alias.args.get("columns") for alias in tree.find_all(exp.TableAlias))


def needed_columns(tree: exp.Expression, available: Sequence[str]) -> list[str] | None:
    """The columns of an object the query can use: every available column whose name appears
    in the query. ``None`` (all) when the query has ``*`` or the columns are unknown. A superset
    is safe: projecting is only an optimisation."""
    if not available or has_alias_columns(tree) or any(
            not isinstance(star.parent, exp.Count) for star in tree.find_all(exp.Star)):
        return None  # an alias list renames by position: every column, in order
    # every identifier, not only columns: JOIN ... USING (c_id) names c_id as a bare identifier
    names = {i.name.lower() for i in tree.find_all(exp.Identifier)}
    wanted = [c for c in available if c.lower() in names]
    return wanted or None


def pushable_filter(tree: exp.Expression, name: str) -> exp.Expr | None:
    """The WHERE of ``SELECT ... FROM name WHERE ...`` (one table, no joins, no subqueries in
    the condition, and the query names the table nowhere else: a scalar subquery, a CTE or a
    HAVING that reads it too must see every row, and the fetch stands for every reference):
    it can run at every fragment. Otherwise None."""
    if not isinstance(tree, exp.Select) or references(tree, name) != 1:
        return None
    from_ = tree.args.get("from_") or tree.args.get("from")
    if from_ is None or tree.args.get("joins"):
        return None
    source = from_.this
    if not isinstance(source, exp.Table) or _full_name(source) != name:
        return None
    where = tree.args.get("where")
    if where is None or any(True for _ in where.find_all(exp.Subquery, exp.Select)):
        return None
    condition = where.this.copy()
    alias = source.alias
    if has_alias_columns(tree):
        return None  # the condition names the alias list's columns, not the fragment's
    if alias:  # columns qualified by the alias are plain columns of the fragment
        for col in condition.find_all(exp.Column):
            if col.table.lower() == alias.lower():
                col.set("table", None)
    if not isinstance(condition, exp.Expr) or any(
            col.table for col in condition.find_all(exp.Column)):
        return None
    return condition


def output_rows(tree: exp.Expression, input_rows: int) -> int:
    """A rough size of the answer: aggregates without GROUP BY give one row, GROUP BY about a
    tenth, LIMIT caps it; otherwise every input row comes out."""
    estimate = input_rows
    if isinstance(tree, exp.Select):
        if tree.args.get("group"):
            estimate = max(1, input_rows // 10)
        elif any(True for _ in tree.find_all(exp.AggFunc)):
            estimate = 1
        limit = tree.args.get("limit")
        if limit is not None and isinstance(limit.expression, exp.Literal):
            try:
                estimate = min(estimate, int(limit.expression.this))
            except ValueError:
                pass
    return estimate


def output_columns(tree: exp.Expression, star_columns: int) -> int:
    if isinstance(tree, (exp.Select, exp.Union)):
        select = tree if isinstance(tree, exp.Select) else tree.find(exp.Select)
        if select is not None:
            if any(isinstance(e, exp.Star) for e in select.expressions):
                return max(1, star_columns)
            return max(1, len(select.expressions))
    return max(1, star_columns)
