"""A ``CREATE TABLE`` run again on a database that has the table: a no-op, or an error.

Programs declare their tables every time they start (``Engine.execute("CREATE TABLE ...")``), so
a declaration of a table that exists is normal and must be skipped. But only when it declares
the same columns: if the program now says ``(k INTEGER, total BIGINT)`` and the state file has
``(k INTEGER, v BIGINT)``, skipping would leave the program writing into a table it does not
know. That is a ``DeclarationError`` naming the table and both column lists, as for streams.

The columns are compared as DuckDB's catalog spells them (names, types, order), so ``INT`` and
``INTEGER`` are the same declaration. To learn what a declaration means without parsing column
definitions ourselves, the table is created for real under a scratch name beside it, inside a
transaction that is rolled back; a ``CREATE TABLE ... AS query`` is described instead (the query
never runs). Constraints, defaults and the like are not compared.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import duckdb

from sstore.base.errors import DeclarationError
from sstore.base.sql import ident

_NAME = r'(?:"(?:[^"]|"")*"|[A-Za-z_][A-Za-z0-9_$]*)'
_CREATE_TABLE = re.compile(
    rf"""\s*CREATE\s+(?P<temp>(?:TEMP|TEMPORARY)\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?
    (?P<name>{_NAME}(?:\s*\.\s*{_NAME}){{0,2}})\s*(?P<definition>.*)""",
    re.IGNORECASE | re.DOTALL | re.VERBOSE)
_SCRATCH = "sstore_declaration_check"  # a table that lives only in a rolled-back transaction

Columns = list[tuple[str, str]]


@dataclass(frozen=True)
class TableDeclaration:
    name: str  # as written in the statement (quoted, possibly qualified): it is SQL text
    definition: str  # "(columns ...)" or "AS query"
    temporary: bool = False

    @property
    def parts(self) -> list[str]:
        """The name's parts without quotes (``wh."Odd Name"`` is ``["wh", "Odd Name"]``)."""
        return [p[1:-1].replace('""', '"') if p.startswith('"') else p
                for p in re.findall(_NAME, self.name)]

    @property
    def display(self) -> str:
        return ".".join(self.parts)

    @property
    def qualifier(self) -> str:
        """The name as written without its last part: ``wh.`` for ``wh."Odd Name"``."""
        match = re.fullmatch(rf"(?P<q>(?:{_NAME}\s*\.\s*)*){_NAME}", self.name)
        return match["q"] if match else ""

    @property
    def relation(self) -> str:
        """Where the table lives: an unqualified TEMP table is in the catalog ``temp``."""
        if self.temporary and re.fullmatch(_NAME, self.name):
            return f"temp.{self.name}"
        return self.name

    @property
    def is_query(self) -> bool:
        return re.match(r"AS\b", self.definition, re.IGNORECASE) is not None


def split_statements(con: duckdb.DuckDBPyConnection, sql: str) -> list[str]:
    """The statements of ``sql``, each to be run (and checked) on its own."""
    return [statement.query for statement in con.extract_statements(sql)]


def parse_create_table(statement: str) -> TableDeclaration | None:
    """The table a ``CREATE [TEMP] TABLE [IF NOT EXISTS]`` statement declares; None for any
    other statement (``CREATE OR REPLACE TABLE`` replaces: there is nothing to compare)."""
    match = _CREATE_TABLE.match(statement)
    if match is None:
        return None
    definition = match["definition"].strip().rstrip(";").rstrip()
    decl = TableDeclaration(match["name"], definition, temporary=bool(match["temp"]))
    if not definition.startswith("(") and not decl.is_query:
        return None
    return decl


def is_same_redeclaration(con: duckdb.DuckDBPyConnection, statement: str) -> bool:
    """True when ``statement`` declares a table that exists with the same columns (skip it);
    False when it declares no table or one that does not exist yet (run it). Raises
    ``DeclarationError`` when the table exists with other columns."""
    decl = parse_create_table(statement)
    if decl is None:
        return False
    existing = _describe(con, decl.relation)
    if existing is None:
        return False
    if _is_view(con, decl):
        raise DeclarationError(f"CREATE TABLE {decl.display}: {decl.display} is not a table but a "
                               f"view "
                               f"that already exists with columns {_show(existing)}")
    declared = _declared_columns(con, decl)
    if declared != existing:
        raise DeclarationError(
            f"table {decl.display!r} is declared with columns {_show(declared)} but the existing "
            f"table has {_show(existing)}; a table is declared once: change an existing one "
            f"with ALTER TABLE (or CREATE OR REPLACE TABLE, which drops its rows)")
    return True


def column_types(con: duckdb.DuckDBPyConnection, name: str, columns: Mapping[str, str]
                 ) -> Columns:
    """The columns ``name (column definition, ...)`` declares, as DuckDB's catalog spells
    their types (``int NOT NULL`` is INTEGER, ``text`` VARCHAR): learned, like a CREATE TABLE's,
    from a scratch table in a rolled-back transaction, so that no alias list is kept here."""
    definition = "(" + ", ".join(f"{ident(c)} {t}" for c, t in columns.items()) + ")"
    return _declared_columns(con, TableDeclaration(ident(name), definition))


def _is_view(con: duckdb.DuckDBPyConnection, decl: TableDeclaration) -> bool:
    """Whether the existing relation of that name is a view (looked up by its last two name
    parts; an unqualified name in the current schema)."""
    parts = decl.parts
    schema = parts[-2] if len(parts) > 1 else None
    return bool(con.execute(
        "SELECT count(*) FROM duckdb_views() WHERE NOT internal AND lower(view_name) = lower(?) "
        "AND lower(schema_name) = lower(coalesce(?, current_schema()))",
        [parts[-1], schema]).fetchall()[0][0])


def _describe(con: duckdb.DuckDBPyConnection, relation: str) -> Columns | None:
    """Columns of an existing table or view; None when there is none of that name."""
    try:
        return _columns(con, relation)
    except duckdb.CatalogException:
        return None


def _columns(con: duckdb.DuckDBPyConnection, relation: str) -> Columns:
    return [(str(row[0]), str(row[1]))
            for row in con.execute(f"DESCRIBE {relation}").fetchall()]


def _declared_columns(con: duckdb.DuckDBPyConnection, decl: TableDeclaration) -> Columns:
    if decl.is_query:
        return _columns(con, decl.definition[2:].strip())  # described, not run
    try:
        con.begin()
    except duckdb.TransactionException:
        raise DeclarationError(f"CREATE TABLE {decl.display} runs inside an open transaction; "
                               f"declare tables with Engine.execute outside transactions"
                               ) from None
    # beside the declared table (same schema), so that the names its definition uses
    # (REFERENCES parent, sequences, types) resolve as they would for the real one
    scratch = decl.qualifier + ident(_SCRATCH)
    try:
        con.execute(f"CREATE {'TEMP ' if decl.temporary else ''}TABLE {scratch} "
                    f"{decl.definition}")
        return _columns(con, scratch)
    finally:
        con.rollback()


def _show(columns: Columns) -> str:
    return "[" + ", ".join(f"{name} {ctype}" for name, ctype in columns) + "]"
