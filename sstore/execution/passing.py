"""Which batches a group commit may pass in memory instead of storing them: decided here only.

A group commit (``sstore.execution.group``, and ``Engine.ingest_and_run``, whose ingest leads one)
saves work by not writing a batch into its stream's table: the rows of a stream that only
the group's procedures read are *held back* and handed to them as Arrow tables, and a batch
between two chained SQL procedures (``sstore.dataflow.fusion``) is *chained away*, never computed on
its own. That is an optimisation, and it must never be visible: ``ingest`` +
``run_until_idle``, ``ingest_and_run`` and ``group_commit=False`` give every procedure the
same rows. A procedure's SQL may read any table, a stream's too (``JOIN orders o ON
o._batch_id = ?``), so a batch may be passed in memory only where the engine can show that
nothing reads it from its table; when in doubt, it is stored.

Two checks, both here:

1. From the declared dataflow (``eligible``): only procedures read the stream (no consumer
   holds it, no subscriber, no trigger on it, no window, not ``retain="all"``), its table
   checks nothing (a row must be inserted to be checked), and no trigger's SQL may read its
   table (triggers run inside the group, outside any procedure).
2. At run time, statement by statement (``reads``): a procedure's SQL is known only when it
   runs (a function procedure may run any SQL), so every statement a member of a group runs
   goes through its ``Transaction``, which asks first. A held-back batch whose table the
   statement may read is stored right then, in the group's transaction, before the
   statement runs; a chained-away batch cannot be (it was never computed), so the group runs
   again unchained and that stream is never chained again (``fusion.Chaining.stored``).

"May read" is decided from the statement's tokens (DuckDB's tokenizer, cached per text):
the stream's name as an identifier or as a word of a string literal
(``query_table('orders')``, ``query('...')``), or a view whose definition may read it (views
are read from the catalog, again after a statement that may change one), or a call of a
function that is not one of DuckDB's own (a macro may read anything). A statement the
tokenizer refuses may read anything.
What the engine cannot see: SQL run outside the procedure's ``Transaction`` (a procedure
that calls ``Engine.query`` reads committed state only, never its own batch on any path).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:
    from sstore.execution.runtime import Runtime

#: bumped whenever the engine runs a statement that may change views or how names resolve
#: (``note``): the views read from the catalog are then stale
_generation = 0
#: keywords of such statements: CREATE/ALTER/DROP ... VIEW, and what attaches or switches
#: databases (a CREATE TABLE changes no view: procedures that make tables per batch must not
#: cost a catalog read each)
_VIEWS_CHANGE = frozenset({"VIEW", "SCHEMA", "ATTACH", "DETACH", "IMPORT", "USE"})
_WORD = re.compile(r"[\w$]+")
#: DuckDB's own function names (the same for every connection of this process), read once
_builtins: frozenset[str] | None = None


@dataclass(frozen=True)
class Mentions:
    """What a statement's text names: identifiers and words of string literals (lower case),
    the functions it calls, and whether it may change a view (``_VIEWS_CHANGE``)."""

    names: frozenset[str]
    #: (qualifier, name) of ``x.name``: a column of table or alias ``x``, or a table of schema
    #: or database ``x`` (``Passing.reads`` tells them apart by the catalog's schema names)
    qualified: frozenset[tuple[str, str]]
    calls: frozenset[str]
    changes_views: bool


@functools.lru_cache(maxsize=4096)
def mentions(sql: str) -> Mentions | None:
    """The names in ``sql``, from DuckDB's tokenizer (no catalog, no binding: a statement that
    would fail to bind is still read, and nothing touches the open transaction); None when
    it cannot be tokenized."""
    try:
        tokens = duckdb.tokenize(sql)
    except Exception:  # noqa: BLE001 (any failure: cannot tell, so it may read anything)
        return None
    names: set[str] = set()
    qualified: set[tuple[str, str]] = set()
    calls: set[str] = set()
    changes_views = False
    kinds = duckdb.token_type
    for i, (start, kind) in enumerate(tokens):
        end = tokens[i + 1][0] if i + 1 < len(tokens) else len(sql)
        text = sql[start:end].strip()
        if kind == kinds.identifier:
            name = text[1:-1].replace('""', '"') if text.startswith('"') else text
            if i >= 2 and tokens[i - 1][1] == kinds.operator \
                    and sql[tokens[i - 1][0]:start].strip() == ".":
                qualifier = sql[tokens[i - 2][0]:tokens[i - 1][0]].strip().strip('"').lower()
                qualified.add((qualifier, name.lower()))  # a column, or schema.table
                continue
            names.add(name.lower())
            if i + 1 < len(tokens) and tokens[i + 1][1] == kinds.operator \
                    and sql[tokens[i + 1][0]:].startswith("("):
                calls.add(name.lower())
        elif kind == kinds.string_const:
            names.update(w.lower() for w in _WORD.findall(text))
        elif kind == kinds.keyword and text.upper() in _VIEWS_CHANGE:
            changes_views = True
    return Mentions(frozenset(names), frozenset(qualified), frozenset(calls), changes_views)


def note(sql: str) -> None:
    """Called for every statement the engine runs for a procedure, an ad hoc transaction or
    ``Engine.execute``: after one that may change a view, the views are read from the catalog
    again before the next decision."""
    global _generation
    found = mentions(sql)
    if found is None or found.changes_views:
        _generation += 1


class Passing:
    """One engine's view of the catalog for ``reads``: its views (name -> what their
    definitions name), read when first needed and again after a statement that may change
    one (``note``)."""

    def __init__(self) -> None:
        self._views: dict[str, Mentions | None] = {}
        #: names of databases and schemas: ``x.name`` with such an ``x`` names a table
        self._schemas: frozenset[str] = frozenset()
        self._generation = -1
        #: (statement, streams asked about) -> the answer, until the catalog changes
        self._answers: dict[tuple[str, frozenset[str]], frozenset[str]] = {}

    def reads(self, con: duckdb.DuckDBPyConnection, sql: str, streams: Iterable[str]
              ) -> set[str]:
        """Which of ``streams`` (lower-case names) the statement ``sql`` may read from their
        tables (all of them when that cannot be told)."""
        wanted = set(streams)
        if not wanted:
            return wanted
        self._refresh(con)
        key = (sql, frozenset(wanted))
        known = self._answers.get(key)
        if known is None:  # a procedure's statements repeat batch after batch: asked once
            known = self._answers[key] = frozenset(self._reads(con, sql, wanted))
            if len(self._answers) > 4096:
                self._answers.clear()
        return set(known)

    def _reads(self, con: duckdb.DuckDBPyConnection, sql: str, wanted: set[str]) -> set[str]:
        found = mentions(sql)
        if found is None:
            return wanted
        builtins = _builtin_functions(con)
        seen: set[str] = set()
        todo = [found]
        hit: set[str] = set()
        while todo:
            current = todo.pop()
            if current.calls - builtins:
                return wanted  # a macro (or a function unknown here): may read anything
            names = current.names | {name for qualifier, name in current.qualified
                                     if qualifier in self._schemas}
            hit |= names & wanted
            for name in names & self._views.keys() - seen:
                seen.add(name)
                view = self._views[name]
                if view is None:
                    return wanted
                todo.append(view)
        return hit

    def _refresh(self, con: duckdb.DuckDBPyConnection) -> None:
        if self._generation != _generation:
            generation = _generation
            self._views = {str(name).lower(): mentions(str(sql)) for name, sql in con.execute(
                "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal").fetchall()}
            self._schemas = frozenset(str(name).lower() for row in con.execute(
                "SELECT database_name, schema_name FROM duckdb_schemas()").fetchall()
                for name in row)
            self._answers.clear()
            self._generation = generation


def _builtin_functions(con: duckdb.DuckDBPyConnection) -> frozenset[str]:
    global _builtins
    if _builtins is None:
        _builtins = frozenset(str(name).lower() for (name,) in con.execute(
            "SELECT DISTINCT function_name FROM duckdb_functions() WHERE internal").fetchall())
    return _builtins


def eligible(rt: Runtime, stream: str) -> bool:
    """Check 1 of the module docstring: whether the rows of ``stream`` may be passed in memory
    for the length of a group, as far as the declared dataflow tells (each statement of the
    group is checked again at run time: ``reads``)."""
    graph = rt.graph
    decl = graph.streams.get(stream)
    if not (stream in rt.store.schemas and stream not in rt.store.constrained
            and bool(graph.consumers_of(stream))
            and not graph.triggers_on(stream) and not graph.windows_on(stream)
            and not rt.ledger.holders.get(stream) and not rt.subscribers.wants(stream)
            and (decl is None or decl.retain != "all")):
        return False
    name = stream.lower()
    return not any(rt.passing.reads(rt.con, trigger.sql, (name,))
                   for trigger in graph.triggers)
