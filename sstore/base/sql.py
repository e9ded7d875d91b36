"""Small SQL helpers shared by every module: identifier quoting and parameter normalisation.

Values are always bound as parameters; only identifiers (which cannot be bound) are ever put into
SQL text, and only through ``ident``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def ident(name: str) -> str:
    """Quote an identifier for DuckDB/PostgreSQL: ``a"b`` becomes ``"a""b"``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"identifier must be a non-empty string, got {name!r}")
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    """A SQL string literal, for the few statements that take no parameters (a view's
    definition, ATTACH's path). Never used for values that a parameter could carry."""
    return "'" + text.replace("'", "''") + "'"


def qualified(name: str) -> str:
    """Quote a possibly schema-qualified name (``schema.table``), each part on its own."""
    return ".".join(ident(part) for part in name.split("."))


def bind(params: tuple[Any, ...], named: Sequence[Any] | Mapping[str, Any] | None
         ) -> list[Any] | dict[str, Any] | None:
    """Merge positional varargs and an explicit ``params=`` into what DuckDB's execute takes."""
    if named is not None:
        if params:
            raise TypeError("pass parameters either positionally or as params=, not both")
        return dict(named) if isinstance(named, Mapping) else list(named)
    return list(params) if params else None


def one_value(row: Sequence[Any] | None) -> Any:
    """The value of a query that answers exactly one row of one column (``count(*)``,
    ``EXISTS``, ``max``, ``to_regclass(..) IS NOT NULL``), given its ``fetchone()``. Drivers
    type ``fetchone`` as optional, as most queries may answer no row; these cannot, so a
    missing row is a broken invariant, reported as such instead of a ``TypeError``."""
    if row is None:
        raise LookupError("a query that always answers one row answered none")
    return row[0]
