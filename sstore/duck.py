"""DuckDB helpers: Arrow tables visible to SQL for the length of a block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import duckdb
import pyarrow as pa

# DuckDB's Python client resolves unknown table names to Python variables of the calling frame
# (a "replacement scan"). Inside an engine that would let a procedure's local variable shadow a
# state table, so every connection sstore opens turns it off; Arrow data is registered by name.
CONFIG = {"python_enable_replacements": False}


def connect(path: str, read_only: bool = False, external_access: bool = True
            ) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection configured the way sstore needs it.

    ``external_access=False`` is for connections that only answer queries (a state file read
    from outside, the polystore's island): DuckDB then refuses every file, extension and
    network access (COPY TO, read_text, ATTACH, INSTALL), whatever the SQL says, and the
    setting cannot be switched back on while the database is open. The engine's own
    connection keeps it: weak durability ATTACHes its snapshot files."""
    config: dict[str, object] = dict(CONFIG)
    if not external_access:
        config["enable_external_access"] = False
    return duckdb.connect(path, read_only=read_only, config=config)


@contextlib.contextmanager
def registered(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table,
               keep: bool = False) -> Iterator[None]:
    """Make ``table`` the relation ``name`` inside the block.

    ``keep=True`` leaves it registered afterwards: on the hot path of a transaction execution
    an unregister costs half a millisecond, and the next ``register`` of the name replaces it.
    Unregistering fails inside an aborted transaction; the name is then left registered until
    the next ``registered`` call replaces it, so the original error is the one that surfaces.
    """
    con.register(name, table)
    try:
        yield
    finally:
        if not keep:
            try:
                con.unregister(name)
            except duckdb.Error:
                pass
