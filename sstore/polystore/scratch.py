"""Where the polystore may write: its own schemas, never a user's object or a system table.

The polystore writes in two cases: ``bdcast`` stores a query's rows as a new table, and the
planner's migrations keep cached copies. Both go only to namespaces sstore owns in each engine:

| what | streaming engine (DuckDB) and PostgreSQL | Spark (temporary views, no schemas) |
| --- | --- | --- |
| bdcast results | schema ``sstore_scratch`` | views named ``sstore_scratch__*`` |
| cached moves | schema ``sstore_cache`` | views named ``sstore_cache__*`` |

Every connector's ``store`` and ``drop`` call ``check_owned`` first, so a name outside these
(``sstore_sys.commits``, ``public.customer``) is refused whatever asked for it. Inside them,
a cast never replaces an existing table unless the user said replace (``CastExistsError``).
Users must not keep their own tables in these schemas: sstore replaces and drops them.
"""

from __future__ import annotations

import re

from sstore.base.errors import TerminalError
from sstore.polystore.catalog import EngineKind

SCRATCH_SCHEMA = "sstore_scratch"
CACHE_SCHEMA = "sstore_cache"
SPARK_SCRATCH_PREFIX = SCRATCH_SCHEMA + "__"
SPARK_CACHE_PREFIX = CACHE_SCHEMA + "__"
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ProtectedObjectError(TerminalError):
    """The polystore was asked to write an object that it does not own."""


class CastExistsError(ProtectedObjectError):
    """A bdcast would replace a table that exists, and the user did not say replace."""


def owned(kind: EngineKind, table: str) -> bool:
    """Is ``table`` (as the connector of ``kind`` names it) in sstore's own namespace?"""
    if kind is EngineKind.SPARK:
        return "." not in table and table.startswith((SPARK_SCRATCH_PREFIX, SPARK_CACHE_PREFIX))
    schema, dot, name = table.partition(".")
    return bool(dot) and schema in (SCRATCH_SCHEMA, CACHE_SCHEMA) and "." not in name \
        and bool(name)


def check_owned(kind: EngineKind, engine: str, table: str) -> None:
    """Refuse a write to ``table`` unless it is in sstore's own namespace of the engine."""
    if not owned(kind, table):
        where = (f"views named {SPARK_SCRATCH_PREFIX}* or {SPARK_CACHE_PREFIX}*"
                 if kind is EngineKind.SPARK else f"the schemas {SCRATCH_SCHEMA} and "
                                                   f"{CACHE_SCHEMA}")
        raise ProtectedObjectError(f"the polystore writes only {where}; it will not create, "
                                   f"replace or drop {table!r} in engine {engine!r}")


def cast_table(kind: EngineKind, name: str) -> str:
    """The physical table a ``bdcast`` named ``name`` creates in an engine of ``kind``."""
    if not _PLAIN_NAME.fullmatch(name):
        raise ProtectedObjectError(
            f"bdcast: {name!r} is not a plain name; a cast creates a new table in the scratch "
            f"schema {SCRATCH_SCHEMA}, so give it a name without a schema (letters, digits, _)")
    if kind is EngineKind.SPARK:
        return SPARK_SCRATCH_PREFIX + name
    return f"{SCRATCH_SCHEMA}.{name}"


def is_cast(kind: EngineKind, table: str) -> bool:
    """Was ``table`` made by a bdcast (so a later bdcast with replace may replace it)?"""
    if kind is EngineKind.SPARK:
        return table.startswith(SPARK_SCRATCH_PREFIX)
    return table.startswith(SCRATCH_SCHEMA + ".")
