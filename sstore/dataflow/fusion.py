"""Operator chaining: consecutive SQL procedures of one batch run as ONE DuckDB statement.

Each statement a procedure runs costs DuckDB's planning (binding, optimizing) and a pass of
its input through Arrow, whatever the batch size: at 100-row batches that fixed cost is most
of a procedure's time. A chain of procedures declared as one SELECT each
(``Engine.sql_procedure``) in which every intermediate stream is read only by the next
procedure of the chain is, inside a group commit (``sstore.execution.group``), composed into one
query with common table expressions, as Flink chains operators::

    WITH batch AS (WITH batch AS (<SP1's SELECT>) <SP2's SELECT>) <SP3's SELECT>

(a query over ``batch`` inside the definition of ``batch`` reads the enclosing ``batch``: the
registered input of the chain's first procedure). The last procedure of the chain runs that
query; the ones before it run nothing.

What stays exactly as without chaining:

- every procedure of the chain commits its TE (its commit record, its place in the order) in
  the group's one transaction, all or nothing;
- the rows of the chain's last output, and so everything downstream;
- errors and their policies: if the composed statement fails, or the group cannot end the
  way chaining assumed (the next TE is not the chain's next procedure), the group rolls back
  and runs again without chaining, so that the procedure that fails is the one blamed.

What differs, by design:

- an intermediate stream's batch is never materialized: it is recorded as collected (like any
  batch every reader of which ran in the same group), with **0 rows** in its commit records,
  and ``Engine.latest`` does not return it; the chained procedures before the last report 0
  rows out and their time is counted in the last one's;
- so a procedure is chained only once one unchained run has shown that its SELECT returns its
  output stream's schema exactly (names, order, types that survive Arrow unchanged), because
  the next procedure then reads DuckDB's values where it would read the Arrow batch.

A chained SELECT must not depend on the order of its input rows (SQL's own rule: a common
table expression has no order).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from sstore.base.errors import DeclarationError

#: Arrow types whose values DuckDB reads back exactly as it wrote them
_EXACT = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_string,
          pa.types.is_decimal, pa.types.is_date32, pa.types.is_binary)
_LEADING_NOISE = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*", re.DOTALL)
_WITH = re.compile(r"WITH\b", re.IGNORECASE)
_RECURSIVE = re.compile(r"WITH\s+RECURSIVE\b", re.IGNORECASE)


def check_select(name: str, sql: str) -> str:
    """The procedure's SQL if it can be chained: one SELECT (a plain or WITH query, not WITH
    RECURSIVE, which would make ``batch`` inside it recursive); else ``DeclarationError``.
    Returned without what trails the query (``;``, comments): nested in the next procedure's
    query, a ``;`` or an unterminated ``-- comment`` would break the composed statement."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise DeclarationError(f"procedure {name!r}: its SQL does not parse: {exc}") from None
    if len(statements) != 1 or statements[0].type is not duckdb.StatementType.SELECT:
        raise DeclarationError(f"procedure {name!r}: sql= must be exactly one SELECT (write a "
                               f"function procedure for anything else)")
    body = _LEADING_NOISE.sub("", sql, count=1)
    if _RECURSIVE.match(body):
        raise DeclarationError(f"procedure {name!r}: a WITH RECURSIVE query cannot be a SQL "
                               f"procedure (write a function procedure)")
    return _without_trailing_noise(sql)


def _without_trailing_noise(sql: str) -> str:
    """``sql`` cut after its last token that is neither a comment nor a ``;`` (DuckDB's own
    tokenizer: a ``--`` or ``;`` inside a string literal is part of that literal)."""
    tokens = duckdb.tokenize(sql)
    cut = len(sql)
    for i in range(len(tokens) - 1, -1, -1):
        start, kind = tokens[i]
        end = tokens[i + 1][0] if i + 1 < len(tokens) else len(sql)
        if kind == duckdb.token_type.comment or sql[start:end].strip() == ";":
            cut = start
        else:
            break
    return sql[:cut].rstrip()


def over(inner: str, body: str) -> str:
    """``body`` (a SELECT over ``batch``) reading the rows of the query ``inner`` as
    ``batch``."""
    stripped = _LEADING_NOISE.sub("", body, count=1)
    with_clause = _WITH.match(stripped)
    # the newline ends a line comment inside ``inner`` before the parenthesis that closes it
    if with_clause:
        return f"WITH batch AS ({inner}\n), {stripped[with_clause.end():]}"
    return f"WITH batch AS ({inner}\n)\n{stripped}"


def exact_schema(result: pa.Table, conformed: pa.Table) -> bool:
    """Whether a procedure's raw SELECT result already was its output stream's batch: the same
    names, order and types, each of a type DuckDB reads back unchanged."""
    if result.schema.names != conformed.schema.names:
        return False
    return all(raw == kept and _survives(raw)
               for raw, kept in zip(result.schema.types, conformed.schema.types))


def _survives(arrow_type: pa.DataType) -> bool:
    return any(is_type(arrow_type) for is_type in _EXACT) or (
        pa.types.is_timestamp(arrow_type) and arrow_type.tz is None)


@dataclass
class Chaining:
    """The engine's chaining state: on or off, and the procedures an unchained run has shown
    to return their output stream's schema exactly (``exact_schema``)."""

    enabled: bool = True
    exact: set[str] = field(default_factory=set)
    #: stream -> (batch-id, reader) of its newest batch when that one was chained away
    unmaterialized: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: streams whose table a statement of a group read (``sstore.execution.passing``): their batches
    #: must be stored, so they are never chained away again
    stored: set[str] = field(default_factory=set)

    def learn(self, procedure: str, result: object, conformed: pa.Table) -> None:
        if isinstance(result, pa.Table) and exact_schema(result, conformed):
            self.exact.add(procedure)
        else:
            self.exact.discard(procedure)
