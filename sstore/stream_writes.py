"""Procedures do not write stream tables with SQL.

A stream's batch is what its producer returns (``return tx.sql(...)``) or what an ingest sends:
the engine appends it under the batch-id and hands the same Arrow rows to the downstream
procedures and subscribers. A procedure that wrote ``INSERT INTO alerts ...`` instead (a
plausible guess at how to emit) committed, its downstream procedures and subscribers saw the
batch it returned (empty), and a sink reading the table delivered the inserted rows: one batch,
two contents, no error. So a procedure's SQL that writes (INSERT, UPDATE, DELETE, COPY ...
FROM, DROP, ALTER, TRUNCATE) into a table named like a stream of the dataflow is refused before
it runs (``StreamWriteError``; the procedure fails like any other failure).

The check reads the statement's target with sqlglot (DuckDB dialect), falling back to the
leading keywords when sqlglot cannot parse DuckDB-only syntax; verdicts are cached per
statement text, so a procedure's repeated SQL costs a dictionary lookup. A statement of a
query kind (SELECT, WITH ... SELECT) is never parsed here.
"""

from __future__ import annotations

import functools
import re

from sstore.errors import DeclarationError

_WRITES = re.compile(r"^\s*(with|insert|update|delete|copy|drop|alter|truncate|merge)\b", re.I)
_TARGET = re.compile(r"^\s*(?:insert\s+(?:or\s+\w+\s+)?into|update|delete\s+from|copy|"
                     r"truncate(?:\s+table)?|drop\s+table(?:\s+if\s+exists)?|alter\s+table|"
                     r"merge\s+into)\s+((?:\"[^\"]+\"|[\w$]+)(?:\.(?:\"[^\"]+\"|[\w$]+))?)",
                     re.I)


class StreamWriteError(DeclarationError):
    """A procedure's SQL writes a stream's table instead of returning the stream's rows."""


def check(statement: str, streams: frozenset[str], procedure: str | None) -> None:
    """Raise ``StreamWriteError`` if ``statement`` writes a table in ``streams`` (lower case)."""
    if not streams or not _WRITES.match(statement):
        return
    hit = written_tables(statement) & streams
    if hit:
        name = sorted(hit)[0]
        who = f"procedure {procedure!r}" if procedure else "this transaction"
        raise StreamWriteError(
            f"{who} writes stream {name!r} with SQL ({statement.strip()[:60]!r}): a stream's "
            f"rows are what its procedure returns (return tx.sql('SELECT ...')) or what an "
            f"ingest sends; rows written into its table would reach a sink but not the "
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
