"""No SQL writes a stream's table: not a procedure's, not an ad hoc transaction's, not
``Engine.execute``'s nor ``Engine.load_table``'s.

A stream's batch is what its producer returns (``return tx.sql(...)``) or what an ingest sends:
the engine appends it under the batch-id and hands the same Arrow rows to the downstream
procedures and subscribers. A procedure that wrote ``INSERT INTO alerts ...`` instead (a
plausible guess at how to emit) committed, its downstream procedures and subscribers saw the
batch it returned (empty), and a sink reading the table delivered the inserted rows: one batch,
two contents, no error. So a procedure's SQL that writes (INSERT, UPDATE, DELETE, COPY ...
FROM, DROP, ALTER, TRUNCATE, MERGE, CREATE OR REPLACE TABLE) into a table named like a stream
of the dataflow is refused before it runs (``StreamWriteError``; the procedure fails like any
other failure).

The check reads the statement's target with sqlglot (DuckDB dialect), falling back to the
leading keywords when sqlglot cannot parse DuckDB-only syntax; verdicts are cached per
statement text, so a procedure's repeated SQL costs a dictionary lookup. A statement of a
query kind (SELECT, WITH ... SELECT) is never parsed here.

Ad hoc SQL is held to the same rule (issue 34): ``Engine.execute`` took ``INSERT INTO
<stream>`` (a row that no procedure ever processed, that a sink delivered) and ``DELETE`` of
batches a consumer had not acknowledged, which ``transaction()`` refused. Every path that runs
SQL for a user calls ``check`` with ``stream_tables``: ``Transaction`` (procedures and ad hoc
transactions), ``adhoc.execute_statements`` and ``adhoc.load_rows``. Before the engine starts,
the tables of the streams the last program declared count too (``saved_stream_tables``): they
are in the state file already. Removing batches is garbage collection's job (after every
reader has them), never SQL's.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

from sstore.base.errors import DeclarationError
from sstore.dataflow.graph import Graph

_WRITES = re.compile(r"^\s*(with|insert|update|delete|copy|drop|alter|truncate|merge|"
                     r"create\s+or\s+replace)\b", re.I)
_TARGET = re.compile(r"^\s*(?:insert\s+(?:or\s+\w+\s+)?into|update|delete\s+from|copy|"
                     r"truncate(?:\s+table)?|drop\s+table(?:\s+if\s+exists)?|alter\s+table|"
                     r"merge\s+into|create\s+or\s+replace\s+table)\s+"
                     r"((?:\"[^\"]+\"|[\w$]+)(?:\.(?:\"[^\"]+\"|[\w$]+))?)",
                     re.I)


class StreamWriteError(DeclarationError):
    """A procedure's SQL writes a stream's table instead of returning the stream's rows."""


def stream_tables(graph: Graph) -> frozenset[str]:
    """The tables (lower case) no SQL may write: every stream's, window's and procedure
    output's of ``graph``."""
    return frozenset(name.lower() for name in [
        *graph.streams, *graph.windows,
        *(out for decl in graph.procedures.values() for out in decl.outputs)])


def saved_stream_tables(saved: Iterable[tuple[str, str, dict[str, Any]]]) -> frozenset[str]:
    """``stream_tables`` of a saved graph (``systables.load_graph``'s rows)."""
    names: list[str] = []
    for name, kind, spec in saved:
        if kind in ("stream", "window"):
            names.append(name)
        elif kind == "procedure":
            names += spec.get("outputs", [])
    return frozenset(name.lower() for name in names)


def may_write(statement: str) -> bool:
    """Whether ``statement`` starts like a statement that writes (cheap, no parse)."""
    return _WRITES.match(statement) is not None


def check(statement: str, streams: frozenset[str], who: str) -> None:
    """Raise ``StreamWriteError`` if ``statement`` writes a table in ``streams`` (lower case);
    ``who`` runs it, for the message ("procedure 'p'", "Engine.execute")."""
    if not streams or not _WRITES.match(statement):
        return
    hit = written_tables(statement) & streams
    if hit:
        name = sorted(hit)[0]
        raise StreamWriteError(
            f"{who} writes stream {name!r} with SQL ({statement.strip()[:60]!r}): a stream's "
            f"rows are what its procedure returns (return tx.sql('SELECT ...')) or what an "
            f"ingest sends, and garbage collection removes a batch once every reader has it; "
            f"rows written into its table (or deleted from it) would reach a sink but not the "
            f"procedures and subscribers downstream")


@functools.lru_cache(maxsize=4096)
def written_tables(statement: str) -> frozenset[str]:
    """Lower-case names of the tables in schema ``main`` (or unqualified) that ``statement``
    writes."""
    import sqlglot  # here: importing sqlglot costs ~0.3 s, and most programs never get here
    from sqlglot import exp

    try:
        trees = sqlglot.parse(statement, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return _by_keywords(statement)
    names: set[str] = set()
    for tree in trees:
        if tree is None:
            continue
        if isinstance(tree, exp.Command):  # sqlglot's "kept as text": read the keywords
            names |= _by_keywords(tree.sql())
            continue
        target = tree.this if isinstance(tree, (exp.Insert, exp.Update, exp.Delete, exp.Copy,
                                                exp.Drop, exp.Alter, exp.Merge,
                                                exp.TruncateTable)) else None
        if isinstance(tree, exp.Copy) and not tree.args.get("kind"):
            continue  # COPY ... TO reads the table
        if isinstance(tree, exp.Create):  # CREATE OR REPLACE TABLE drops the table's rows
            if tree.args.get("replace") and str(tree.args.get("kind")).upper() == "TABLE":
                table = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
                if isinstance(table, exp.Table) and table.db in ("", "main"):
                    names.add(table.name.lower())
            continue
        if isinstance(tree, exp.TruncateTable):
            tables = tree.expressions
        elif isinstance(tree, exp.Drop):
            tables = tree.args.get("tables") or [tree.this]
        else:
            tables = [target.find(exp.Table) if target is not None and
                      not isinstance(target, exp.Table) else target]
        for table in tables:
            if isinstance(table, exp.Table) and table.db in ("", "main"):
                names.add(table.name.lower())
    return frozenset(names)


def _by_keywords(statement: str) -> frozenset[str]:
    match = _TARGET.match(statement)
    if match is None:
        return frozenset()
    parts = [p.strip('"') for p in re.findall(r"\"[^\"]+\"|[\w$]+", match.group(1))]
    if len(parts) == 2 and parts[0].lower() != "main":
        return frozenset()
    return frozenset({parts[-1].lower()})
