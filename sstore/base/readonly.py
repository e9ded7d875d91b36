"""Is this SQL only a query? The one check every read path runs before it touches an engine.

``sstore query``, ``statefile.query_file``, ``Engine.query`` and the polystore's fetches
(streaming engine, PostgreSQL, Spark, the island) all promise to read and never write. The
engines back that promise where they can (a read-only DuckDB connection with external access
off, READ ONLY transactions in DuckDB and PostgreSQL), but some paths have no such switch: the
live engine's connection must keep external access (weak durability ATTACHes its snapshots),
a PostgreSQL superuser may ``COPY ... TO`` a server file or call ``pg_read_file`` even in a
READ ONLY transaction, and Spark has no read-only mode at all. So the SQL itself is checked,
on its parse tree, before it is sent. Accepted: one SELECT (with or without WITH), a set
operation (UNION, INTERSECT, EXCEPT) or VALUES; for DuckDB also DESCRIBE and SUMMARIZE, which
DuckDB itself parses as SELECTs over the catalog. Refused: everything else, anywhere in the
tree, and calls that reach outside the database.

Which parser: **DuckDB SQL is checked on DuckDB's own parse tree**, PostgreSQL and Spark SQL on
sqlglot's. sqlglot cannot parse all DuckDB SQL the engine's own code and users write
(``?::INTEGER`` is one), and any difference between the checking parser and the executing one
is a way around the check. DuckDB's parser has neither problem: ``duckdb.extract_statements``
splits the text exactly as DuckDB will run it, and ``json_serialize_sql`` (DuckDB's json
extension) gives the tree DuckDB will bind, on a private in-memory database with external
access off (it only parses). For the other engines sqlglot is the parser at hand. Either way,
SQL the parser cannot handle is refused (``UncheckableQueryError``): a query that cannot be
checked does not run.

The steps:

1. One statement, of a query kind (for DuckDB: ``extract_statements``, type SELECT).
2. No statement that writes anywhere in the tree: a data-modifying CTE
   (``WITH d AS (DELETE ... RETURNING *) SELECT ...``, which DuckDB 2.0 runs),
   ``SELECT ... INTO``, ``FOR UPDATE``, and every DML/DDL/COPY/ATTACH/SET/PRAGMA/... node.
3. No function that reaches outside the database. In DuckDB only the table functions of
   ``DUCKDB_TABLE_FUNCTIONS`` may stand where a table stands: every reader (``read_text``,
   ``read_csv``, ``glob``, ``query``, ...) and any table function an extension adds later is
   refused. In every dialect the functions of ``OUTSIDE_FUNCTIONS`` / ``OUTSIDE_PREFIXES``
   (server files, large objects, settings, sequences, other databases, Java reflection) are
   refused wherever they appear.
4. No table name that looks like a file or URL (``FROM '/etc/passwd'``, ``FROM "data.csv"``,
   Spark's ``csv.`/path```): DuckDB and Spark read such names as files.

Verdicts are cached by (SQL, dialect): the engine's own queries repeat the same text, and a
check costs about a millisecond.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
from typing import TYPE_CHECKING, Any

import duckdb

from sstore.base.errors import TerminalError
from sstore.base.sql import one_value

if TYPE_CHECKING:
    from sqlglot import exp

ACCEPTED = "SELECT, WITH ... SELECT, UNION/INTERSECT/EXCEPT, VALUES"


class ReadOnlyQueryError(TerminalError):
    """SQL given to a read path is not a plain query (or cannot be checked to be one)."""


class UncheckableQueryError(ReadOnlyQueryError):
    """The SQL does not parse, so it cannot be checked (and is refused)."""


# Table functions DuckDB may run in a read-only query: they generate rows or read the catalog.
# Everything else DuckDB offers in FROM (read_*, glob, query, arrow_scan, checkpoint, ...)
# reaches outside the database or changes it.
DUCKDB_TABLE_FUNCTIONS = frozenset({
    "range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree",
    "duckdb_columns", "duckdb_constraints", "duckdb_databases", "duckdb_dependencies",
    "duckdb_functions", "duckdb_indexes", "duckdb_keywords", "duckdb_schemas",
    "duckdb_sequences", "duckdb_settings", "duckdb_tables", "duckdb_types", "duckdb_views",
    "pragma_table_info", "pragma_storage_info", "pragma_database_size", "pragma_version",
    "pragma_show", "pragma_collations", "pragma_metadata_info", "pragma_platform",
    "pg_timezone_names", "icu_calendar_names",
})

# Functions that read or write outside the database, change settings or sequences, or run
# other SQL: refused in every dialect and position (PostgreSQL runs several of them in a READ
# ONLY transaction too; DuckDB and Spark have some under these names).
OUTSIDE_FUNCTIONS = frozenset({
    "pg_read_file", "pg_read_binary_file", "pg_stat_file", "pg_file_write", "pg_file_rename",
    "pg_file_unlink", "pg_logdir_ls", "set_config", "pg_terminate_backend",
    "pg_cancel_backend", "pg_reload_conf", "pg_rotate_logfile", "pg_promote", "pg_switch_wal",
    "pg_create_restore_point", "pg_backup_start", "pg_backup_stop", "pg_notify",
    "pg_logical_emit_message", "query_to_xml", "query_to_xmlschema",
    "query_to_xml_and_xmlschema", "cursor_to_xml", "cursor_to_xmlschema", "nextval", "setval",
    "getenv", "query", "query_table", "json_execute_serialized_sql",
    "reflect", "java_method", "try_reflect",
})
OUTSIDE_PREFIXES = ("pg_ls_", "lo_", "dblink", "pg_advisory", "read_")

_FILE_LIKE = re.compile(r"[/\\:*?~.]")

# DuckDB query nodes that only read; anything else (DELETE_QUERY_NODE, ...) writes.
_DUCKDB_QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE",
                                  "CTE_NODE"})


def check_query(sql: str, dialect: str = "duckdb") -> None:
    """Raise ``ReadOnlyQueryError`` unless ``sql`` is exactly one query that only reads the
    database (the steps in the module docstring). ``dialect`` is the engine's SQL, in sqlglot's
    names: ``duckdb``, ``postgres`` or ``spark``."""
    verdict = _verdict(sql, dialect)
    if verdict is not None:
        problem, parses = verdict
        raise ReadOnlyQueryError(problem) if parses else UncheckableQueryError(problem)


@functools.lru_cache(maxsize=4096)
def _verdict(sql: str, dialect: str) -> tuple[str, bool] | None:
    """What is wrong with ``sql`` as a read-only query and whether it parsed, or None."""
    if dialect == "duckdb":
        return _duckdb_verdict(sql)
    return _sqlglot_verdict(sql, dialect)


def _problem(text: str) -> tuple[str, bool]:
    return text, True


def _uncheckable(parser: str, error: str) -> tuple[str, bool]:
    first = error.splitlines()[0] if error else "no reason given"
    return (f"cannot check the query: {parser} cannot parse it ({first}); a query that cannot "
            f"be checked is refused"), False


def _not_a_query(kind: str) -> str:
    return f"{kind} is not a query: only {ACCEPTED} may run here (read-only)"


def _contains(kind: str) -> str:
    return (f"the query contains {kind}: only a plain query ({ACCEPTED}) may run here, and it "
            f"may not write")


def _outside(name: str) -> str | None:
    if name in OUTSIDE_FUNCTIONS or name.startswith(OUTSIDE_PREFIXES):
        return (f"{name}(...) reaches outside the database (files, settings or other "
                f"queries): read-only queries may not call it")
    return None


def _file_like(name: str) -> str | None:
    if _FILE_LIKE.search(name):
        return (f"{name!r} looks like a file, not a table: read-only queries read the "
                f"database's tables only")
    return None


def _word(text: str) -> str:
    """The first keyword of a statement's text (COPY, ATTACH, INSTALL, CHECKPOINT, ...)."""
    match = re.match(r"\s*(?:--[^\n]*\n\s*|/\*.*?\*/\s*)*([A-Za-z]+)", text, re.DOTALL)
    return match.group(1).upper() if match else ""


# ------------------------------------------------------------------ DuckDB: its own parser

_serializer: duckdb.DuckDBPyConnection | None = None
_serializer_lock = threading.Lock()


def _duckdb_verdict(sql: str) -> tuple[str, bool] | None:
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        return _uncheckable("DuckDB", str(exc))
    if not statements:
        return _problem("no query given")
    kinds = [_statement_kind(s.query, s.type.name) for s in statements]
    if len(statements) > 1:
        return _problem(f"one query at a time: got {len(statements)} statements "
                        f"({', '.join(kinds)})")
    if statements[0].type is not duckdb.StatementType.SELECT:
        return _problem(_not_a_query(kinds[0]))
    tree = _duckdb_tree(sql)
    if tree.get("error"):
        return _uncheckable("DuckDB's serializer", str(tree.get("error_message")))
    problem = _duckdb_tree_problem(tree.get("statements", []))
    return None if problem is None else _problem(problem)


def _statement_kind(text: str, type_name: str) -> str:
    """INSTALL rather than DuckDB's LOAD, CHECKPOINT rather than CALL; WITH says nothing."""
    word = _word(text)
    return word if word and word != "WITH" else type_name


def _duckdb_tree(sql: str) -> dict[str, Any]:
    """DuckDB's parse tree of ``sql`` as JSON, from a private in-memory database that has
    external access off (the function only parses; nothing is bound or run)."""
    global _serializer
    with _serializer_lock:
        if _serializer is None:
            _serializer = duckdb.connect(":memory:", config={"enable_external_access": False})
        try:
            text = one_value(_serializer.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]
                                                 ).fetchone())
        except duckdb.Error as exc:
            return {"error": True, "error_message": str(exc)}
    tree: dict[str, Any] = json.loads(text)  # json_serialize_sql answers one JSON object
    return tree


def _duckdb_tree_problem(tree: object) -> str | None:
    """Walk every node of DuckDB's tree (expressions, subqueries, CTEs, table refs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        kind = node.get("type")
        if isinstance(kind, str):
            problem = _duckdb_node_problem(kind, node)
            if problem is not None:
                return problem
        if node.get("class") == "FUNCTION":
            problem = _outside(str(node.get("function_name", "")).lower())
            if problem is not None:
                return problem
        stack.extend(node.values())
    return None


def _duckdb_node_problem(kind: str, node: dict[str, Any]) -> str | None:
    if kind.endswith("_NODE") and kind not in _DUCKDB_QUERY_NODES:
        return _contains(kind.split("_")[0])
    if kind == "TABLE_FUNCTION":
        function = node.get("function") or {}
        name = str(function.get("function_name", "")).lower()
        if name not in DUCKDB_TABLE_FUNCTIONS:
            return _outside(name) or (
                f"table function {name}(...) is not allowed in a read-only query (only range, "
                f"generate_series, unnest, json_each and the duckdb_*/pragma_* catalog "
                f"functions are)")
    if kind == "BASE_TABLE":
        return _file_like(str(node.get("table_name", "")))
    return None


# ------------------------------------------------------------------ PostgreSQL, Spark: sqlglot

class _QuietFallback(logging.Filter):
    """sqlglot logs a warning when it parses a statement it does not know as a raw Command;
    such a statement is refused here with a message of its own, so the warning is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Falling back to parsing as a 'Command'" not in record.getMessage()


logging.getLogger("sqlglot").addFilter(_QuietFallback())


@functools.cache
def _statement_nodes() -> tuple[tuple[type[exp.Expression], str], ...]:
    """sqlglot's statement nodes that may not appear anywhere in a query, with their keyword
    (looked up by name: a sqlglot without one of them simply has nothing to find)."""
    from sqlglot import exp
    names = (("Insert", "INSERT"), ("Update", "UPDATE"), ("Delete", "DELETE"),
             ("Merge", "MERGE"), ("Copy", "COPY"), ("Create", "CREATE"), ("Drop", "DROP"),
             ("Alter", "ALTER"), ("TruncateTable", "TRUNCATE"), ("Attach", "ATTACH"),
             ("Detach", "DETACH"), ("Install", "INSTALL"), ("Export", "EXPORT"),
             ("LoadData", "LOAD DATA"), ("Pragma", "PRAGMA"), ("Set", "SET"), ("Use", "USE"),
             ("Transaction", "BEGIN"), ("Commit", "COMMIT"), ("Rollback", "ROLLBACK"),
             ("Grant", "GRANT"), ("Revoke", "REVOKE"), ("Comment", "COMMENT"),
             ("Analyze", "ANALYZE"), ("Cache", "CACHE"), ("Uncache", "UNCACHE"),
             ("Refresh", "REFRESH"), ("Kill", "KILL"), ("Declare", "DECLARE"),
             ("Execute", "EXECUTE"), ("Describe", "DESCRIBE"), ("Summarize", "SUMMARIZE"),
             ("Into", "SELECT ... INTO"), ("Lock", "FOR UPDATE/SHARE"), ("Command", ""))
    return tuple((getattr(exp, name), word) for name, word in names if hasattr(exp, name))


def _sqlglot_verdict(sql: str, dialect: str) -> tuple[str, bool] | None:
    import sqlglot
    from sqlglot.errors import SqlglotError
    try:
        trees = [t for t in sqlglot.parse(sql, read=dialect) if t is not None]
    except SqlglotError as exc:
        return _uncheckable(f"sqlglot ({dialect})", str(exc) or type(exc).__name__)
    if not trees:
        return _problem("no query given")
    if len(trees) > 1:
        kinds = ", ".join(_kind(t) for t in trees)
        return _problem(f"one query at a time: got {len(trees)} statements ({kinds})")
    problem = _sqlglot_tree_problem(trees[0])
    return None if problem is None else _problem(problem)


def _sqlglot_tree_problem(tree: exp.Expr) -> str | None:
    from sqlglot import exp
    if not _is_query(tree):
        return _not_a_query(_kind(tree))
    for node in tree.walk():
        for cls, word in _statement_nodes():
            if isinstance(node, cls):
                return _contains(word or _kind(node))
        if isinstance(node, exp.Func):
            name = node.name.lower() if isinstance(node, exp.Anonymous) \
                else node.sql_name().lower()
            problem = _outside(name)
            if problem is not None:
                return problem
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            problem = _file_like(node.name)
            if problem is not None:
                return problem
    return None


def _is_query(tree: exp.Expr) -> bool:
    from sqlglot import exp
    if isinstance(tree, exp.Subquery):
        return _is_query(tree.this)
    return isinstance(tree, (exp.Select, exp.SetOperation, exp.Values))


def _kind(node: exp.Expr) -> str:
    """The statement's keyword, for messages: DELETE, CREATE TABLE, COPY, CALL, ..."""
    from sqlglot import exp
    if isinstance(node, exp.Command):
        return str(node.this).upper()
    for cls, word in _statement_nodes():
        if isinstance(node, cls) and word:
            kind = node.args.get("kind") if isinstance(node, (exp.Create, exp.Drop)) else None
            return f"{word} {str(kind).upper()}" if kind else word
    if _is_query(node):
        return "SELECT"
    return _word(node.sql()) or type(node).__name__.upper()
