"""PostgreSQL's meaning, kept whatever engine runs a query: the declared translations.

Users write PostgreSQL SQL; a plan may run it in the engine's DuckDB, in the island (DuckDB)
or in Spark. sqlglot prints a tree in each dialect, but printing is not translating: ``7 / 2``
is 3 in PostgreSQL and 3.5 in DuckDB, ``LIKE 'a\\_b'`` escapes ``_`` in PostgreSQL and not in
DuckDB, ``to_hex`` prints lower case in PostgreSQL and DuckDB's ``hex`` upper case. A wrong
answer with exit 0 is the worst outcome, so this module is the one place that says, for each
construct a plan moves out of PostgreSQL, what happens to it (the differential test,
``benchmarks.polystore_fuzz``, checks every entry against PostgreSQL):

- ``PORTABLE``: functions every other engine runs with PostgreSQL's meaning, as sqlglot
  prints them;
- ``TRANSLATIONS``: constructs rewritten for one dialect (a pure function of the node);
- everything else is *kept in PostgreSQL*: ``kept_in_postgres`` names it, and plans that
  would run it elsewhere are not proposed (``keep_meaning``). The query still runs, in
  PostgreSQL; where no plan is left (the objects live only in other engines) it is refused
  with the reason, never answered differently.

Pure functions of the tree; the planner's rules call them (``sqltext.to_sql`` translates,
``rules.keep_meaning`` drops plans).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sqlglot import exp

POSTGRES = "postgres"

#: functions whose meaning DuckDB and Spark keep as sqlglot prints them (checked by the fuzz)
PORTABLE: frozenset[type[exp.Expr]] = frozenset({
    exp.Count, exp.Sum, exp.Min, exp.Max, exp.Avg, exp.LogicalAnd, exp.LogicalOr,
    exp.Abs, exp.Ceil, exp.Floor, exp.Sign, exp.Greatest, exp.Least, exp.Round,
    exp.Length, exp.Upper, exp.Lower, exp.Substring, exp.Replace, exp.Trim, exp.Left,
    exp.Right, exp.StrPosition, exp.Reverse, exp.Pad, exp.Extract,
    exp.Coalesce, exp.Nullif, exp.Case, exp.If, exp.Cast, exp.GroupConcat, exp.Trunc,
    exp.Exists, exp.RowNumber,
})
#: functions sqlglot leaves as names (``exp.Anonymous``) that an engine runs as PostgreSQL does
PORTABLE_NAMES: Mapping[str, frozenset[str]] = {
    "duckdb": frozenset({"make_date", "every", "octet_length"}),
    "spark": frozenset({"make_date", "every", "octet_length"}),
}
# not concat(): PostgreSQL prints a boolean argument as t/f there, DuckDB and Spark as
# true/false (the types of columns are not known here); || prints true/false everywhere
#: Spark changes these where DuckDB does not (so they are kept in PostgreSQL for Spark only)
SPARK_KEPT: Mapping[type[exp.Expr], str] = {
    exp.Round: "round (Spark rounds a double half up, PostgreSQL half to even)",
    exp.Trunc: "trunc (Spark's is a cast to bigint)",
    exp.GroupConcat: "string_agg (Spark has no ordered string_agg)",
    exp.Pad: "lpad/rpad",
}
INTEGER_TYPES = {exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT,
                 exp.DataType.Type.BIGINT}


def _every(node: exp.Expression) -> exp.Expression:
    return exp.LogicalAnd(this=node.expressions[0].copy())


def _octet_length(node: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this="strlen", expressions=[e.copy() for e in node.expressions])


def _like_escape(node: exp.Expression) -> exp.Expression:
    """PostgreSQL's LIKE escapes with a backslash unless told otherwise; DuckDB's does not."""
    if isinstance(node.parent, exp.Escape):
        return node
    return exp.Escape(this=node.copy(), expression=exp.Literal.string("\\"))


#: dialect -> (node class, anonymous function name or None) -> rewrite of that node
TRANSLATIONS: Mapping[str, Mapping[tuple[type[exp.Expr], str | None],
                                   Callable[[exp.Expression], exp.Expression]]] = {
    "duckdb": {(exp.Anonymous, "every"): _every, (exp.Anonymous, "octet_length"): _octet_length,
               (exp.Like, None): _like_escape, (exp.ILike, None): _like_escape},
    "spark": {},
    # sqlglot reads PostgreSQL's to_hex as its Hex and prints that back as hex(), which
    # PostgreSQL does not have
    POSTGRES: {(exp.Hex, None): lambda node: exp.Anonymous(
        this="to_hex", expressions=[node.this.copy()])},
}


def translate(tree: exp.Expr, dialect: str) -> exp.Expr:
    """``tree`` (parsed as PostgreSQL) with each construct ``dialect`` needs rewritten
    (``TRANSLATIONS``); the tree itself is not changed. Every tree printed for an engine
    goes through it (``sqltext.to_sql``); plans that would need more than it offers are not
    proposed (``kept_in_postgres``)."""
    table = TRANSLATIONS.get(dialect)
    if not table:
        return tree

    def step_of(node: exp.Expr) -> Callable[[exp.Expression], exp.Expression] | None:
        name = node.name.lower() if isinstance(node, exp.Anonymous) else None
        return table.get((type(node), name))

    if not any(step_of(node) is not None for node in tree.walk()):
        return tree  # most trees: nothing to rewrite, and a copy costs more than the walk

    def rewrite(node: exp.Expression) -> exp.Expression:
        step = step_of(node)
        return step(node) if step is not None else node

    return tree.copy().transform(rewrite)


def kept_in_postgres(tree: exp.Expr, dialect: str) -> list[str]:
    """What in ``tree`` would change meaning if ``dialect`` ran it (empty: nothing): each
    reason once, in the order found."""
    if dialect == POSTGRES:
        return []
    reasons: list[str] = []
    names = PORTABLE_NAMES.get(dialect, frozenset())
    for node in tree.walk():
        reason = _reason(node, dialect, names)
        if reason and reason not in reasons:
            reasons.append(reason)
    return reasons


def kept_types(types: Mapping[tuple[str, str], Mapping[str, str]]) -> dict[str, str]:
    """Column -> why its values mean something else outside PostgreSQL, from the types the
    planning probes read ((engine, table) -> {column: PostgreSQL type}): a ``char(n)`` is
    padded with blanks that PostgreSQL ignores when it compares, measures or casts it, and
    every other engine keeps."""
    kept: dict[str, str] = {}
    for (_engine, table), columns in types.items():
        for column, kind in columns.items():
            if kind.startswith(("character(", "bpchar")) or kind == "character":
                kept.setdefault(column, f"{kind} column {table}.{column} (blank-padded)")
    return kept


def naming_kept_columns(tree: exp.Expression, kept: Mapping[str, str]) -> list[str]:
    """The reasons of ``kept`` columns the query names (any identifier of that name: a
    superset is safe) or reads with ``*``."""
    if not kept:
        return []
    if any(not isinstance(star.parent, exp.Count) for star in tree.find_all(exp.Star)):
        return list(dict.fromkeys(kept.values()))
    names = {i.name.lower() for i in tree.find_all(exp.Identifier)}
    return list(dict.fromkeys(why for column, why in kept.items() if column.lower() in names))


def _reason(node: exp.Expr, dialect: str, names: frozenset[str]) -> str | None:
    if isinstance(node, exp.Div) and not _non_integer_division(node):
        return "integer division (/ of operands whose types are not known to be numeric)"
    if isinstance(node, exp.Join) and (node.args.get("method") or "").upper() == "NATURAL":
        return "NATURAL JOIN (its columns and their order)"
    if isinstance(node, exp.Join) and node.args.get("using") and _has_star(node):
        return "SELECT * over JOIN ... USING (the order of its columns)"
    if dialect == "spark" and _spark_interval(node):
        return _spark_interval(node)
    if dialect == "spark" and isinstance(node, exp.TableAlias) and node.args.get("columns"):
        return "an alias list (Spark wants every column named; PostgreSQL renames the first)"
    if isinstance(node, exp.Anonymous):
        if node.name.lower() not in names:
            return f"function {node.name.lower()}"
        return None
    if isinstance(node, exp.Func) and not isinstance(node, (exp.Connector, exp.Binary)):
        if type(node) not in PORTABLE:  # named as the user wrote it (to_hex, not hex)
            printed = translate(node, POSTGRES).sql(POSTGRES).split("(")[0].lower()
            return f"function {printed or type(node).__name__}"
        if dialect == "spark":
            return _spark_reason(node)
    return None


def _spark_interval(node: exp.Expr) -> str | None:
    if isinstance(node, exp.Interval):
        return "interval arithmetic (Spark's date + interval is a date, PostgreSQL's a timestamp)"
    if isinstance(node, exp.Sub) and not (node.left.is_number or node.right.is_number):
        return "a difference of two values (Spark subtracts dates as intervals)"
    return None


def _spark_reason(node: exp.Func) -> str | None:
    if type(node) in SPARK_KEPT:
        return SPARK_KEPT[type(node)]
    if isinstance(node, exp.Cast) and node.to.this in INTEGER_TYPES:
        return "a cast to an integer type (Spark truncates, PostgreSQL rounds)"
    if isinstance(node, exp.Cast) and node.to.is_type(*exp.DataType.TEXT_TYPES):
        return "a cast to text (Spark prints a timestamptz without its offset)"
    return None


def _non_integer_division(node: exp.Div) -> bool:
    """True when one operand is surely not an integer, so no engine divides as integers."""
    def fractional(side: exp.Expr) -> bool:
        while isinstance(side, exp.Paren):
            side = side.this
        if isinstance(side, exp.Literal) and side.is_number:
            return any(ch in side.this for ch in ".eE")
        if isinstance(side, exp.Cast):
            return side.to.this not in INTEGER_TYPES and side.to.is_type(
                *exp.DataType.REAL_TYPES)
        return isinstance(side, exp.Avg)
    return fractional(node.left) or fractional(node.right)


def _has_star(join: exp.Join) -> bool:
    select = join.find_ancestor(exp.Select)
    return select is not None and any(isinstance(e, exp.Star) or
                                      (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
                                      for e in select.expressions)
