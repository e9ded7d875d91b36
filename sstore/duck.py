"""DuckDB helpers: Arrow tables visible to SQL for the length of a block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import duckdb
import pyarrow as pa


@contextlib.contextmanager
def registered(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> Iterator[None]:
    """Make ``table`` the relation ``name`` inside the block.

    Unregistering fails inside an aborted transaction; the name is then left registered until
    the next ``registered`` call replaces it, so the original error is the one that surfaces.
    """
    con.register(name, table)
    try:
        yield
    finally:
        try:
            con.unregister(name)
        except duckdb.Error:
            pass
