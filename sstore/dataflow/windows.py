"""Tuple and batch windows over a stream, maintained inside the transaction that feeds them.

A window's rows live in ``<name>__rows`` with a sequence number ``_seq``: the row's position for a
tuple window, the source batch's ordinal for a batch window. The window shows the ``size`` rows
(or batches) up to ``promoted``; newer rows are staged, invisible until enough of them have
arrived to slide. Each slide is a batch of the window (same batch-id as the source batch that
caused it), recorded with its ``promoted`` value so that a procedure running later still sees the
window exactly as it was after that slide. Rows older than every consumer still needs are removed
by garbage collection.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import pyarrow as pa

from sstore.base.duck import LARGE_ROWS, arrow, execute, registered
from sstore.base.sql import ident, literal
from sstore.dataflow.graph import WindowDecl


@dataclass
class WindowState:
    decl: WindowDecl
    next_seq: int = 1  # next row number (rows) or batch ordinal (batches)
    promoted: int = 0  # newest sequence number visible in the window
    collected_through: int = -(2**62)  # rows up to this _seq are known to be gone (memory only)

    @property
    def rows_table(self) -> str:
        return self.decl.name + "__rows"

    def advance(self, n_rows: int) -> WindowUpdate:
        """What a source batch of ``n_rows`` does to the window (applied only after commit)."""
        next_seq = self.next_seq + (n_rows if self.decl.unit == "rows" else 1)
        slides = (next_seq - 1 - self.promoted) // self.decl.slide
        return WindowUpdate(self, self.next_seq, next_seq, self.promoted + slides * self.decl.slide,
                            slides > 0)

    def bounds(self, promoted: int) -> tuple[int, int]:
        """(exclusive low, inclusive high) ``_seq`` range of the contents after a slide."""
        return promoted - self.decl.size, promoted


@dataclass(frozen=True)
class WindowUpdate:
    state: WindowState
    first_seq: int
    next_seq: int
    promoted: int
    slid: bool

    def apply(self) -> None:
        self.state.next_seq, self.state.promoted = self.next_seq, self.promoted


def create_window(con: duckdb.DuckDBPyConnection, state: WindowState,
                  columns: dict[str, str]) -> None:
    """Create the rows table and the view that shows the window's current contents."""
    name = state.decl.name
    cols = ", ".join(f"{ident(c)} {t}" for c, t in columns.items())
    con.execute(f"CREATE TABLE IF NOT EXISTS {ident(state.rows_table)} (_seq BIGINT, {cols})")
    select = ", ".join(f"r.{ident(c)}" for c in columns)
    con.execute(
        f"CREATE OR REPLACE VIEW {ident(name)} AS SELECT {select} FROM {ident(state.rows_table)} r,"
        f" sstore_sys.windows w WHERE w.name = {literal(name)} AND r._seq > w.promoted - w.size"
        f" AND r._seq <= w.promoted")
    con.execute("INSERT INTO sstore_sys.windows VALUES (?, ?, ?, ?) ON CONFLICT (name) DO UPDATE "
                "SET size = excluded.size", [name, state.next_seq, state.promoted,
                                             state.decl.size])


def load_window(con: duckdb.DuckDBPyConnection, state: WindowState) -> None:
    rows = con.execute("SELECT next_seq, promoted FROM sstore_sys.windows WHERE name = ?",
                       [state.decl.name]).fetchall()
    if rows:
        state.next_seq, state.promoted = int(rows[0][0]), int(rows[0][1])


def feed_window(con: duckdb.DuckDBPyConnection, state: WindowState, rows: pa.Table
                ) -> WindowUpdate:
    """Append a source batch to the window (inside the caller's transaction).

    Costs one INSERT when there are rows, plus one state update. The returned update is applied to
    ``state`` by the caller once the transaction has committed.
    """
    update = state.advance(rows.num_rows)
    first = update.first_seq
    if rows.num_rows:
        if state.decl.unit == "rows":
            seq = pa.array(range(first, first + rows.num_rows), type=pa.int64())
        else:
            seq = pa.array([first] * rows.num_rows, type=pa.int64())
        staged = rows.add_column(0, "_seq", seq)
        with registered(con, "sstore_window_rows", staged):
            execute(con, f"INSERT INTO {ident(state.rows_table)} SELECT * FROM sstore_window_rows")
    execute(con, "UPDATE sstore_sys.windows SET next_seq = ?, promoted = ? WHERE name = ?",
            [update.next_seq, update.promoted, state.decl.name])
    return update


def read_window(con: duckdb.DuckDBPyConnection, state: WindowState, promoted: int,
                columns: list[str]) -> pa.Table:
    low, high = state.bounds(promoted)
    select = ", ".join(ident(c) for c in columns)
    return arrow(con, f"SELECT {select} FROM {ident(state.rows_table)} WHERE _seq > ? AND _seq <= ?"
                      f" ORDER BY _seq", [low, high],
                 large=state.decl.unit == "rows" and high - low >= LARGE_ROWS)
