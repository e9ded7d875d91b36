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


def connect(path: str, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection configured the way sstore needs it."""
    return duckdb.connect(path, read_only=read_only, config=dict(CONFIG))


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
