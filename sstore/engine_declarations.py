"""What a program declares on an ``Engine`` before it starts: streams, windows, event windows,
triggers, procedures, and the explicit changes of a running pipeline (``retire``, ``evolve``,
``upgrade``).

A part of ``Engine`` (``sstore.engine`` mixes it in), kept apart because declaring is one job:
each method checks its arguments, records a declaration in the engine's ``Graph`` or in the
start's change lists, and touches no state; the start (``sstore.execution.lifecycle``) applies
them all at once. After the start the graph is fixed (``_declaring`` refuses).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from sstore.base.errors import DeclarationError
from sstore.dataflow import event_windows, fusion
from sstore.dataflow.graph import (
    ErrorPolicy,
    Graph,
    ProcedureDecl,
    StreamDecl,
    TriggerDecl,
    WindowDecl,
)
from sstore.execution.runtime import Runtime
from sstore.execution.transaction import Transaction
from sstore.storage.evolution import Explicit
from sstore.storage.upgrades import Upgrade


class Declarations:
    """The declaring half of ``Engine``'s API (the attributes are the engine's own)."""

    _rt: Runtime | None
    _graph: Graph
    _con: duckdb.DuckDBPyConnection
    _retired: set[str]
    _evolutions: dict[str, Explicit]
    _versions: dict[str, int]
    _upgrades: dict[str, Upgrade]

    def _declaring(self) -> None:
        if self._rt is not None:
            raise DeclarationError("the engine has started; declare streams, windows, triggers "
                                   "and procedures before the first ingest, run or query")

    def stream(self, name: str, columns: Mapping[str, str] | None = None, *,
               retain: str = "latest") -> str:
        """Declare a stream. ``columns`` maps column name to DuckDB type; a stream that only a
        procedure writes and none reads may leave it out (its first batch decides).

        ``retain`` decides what garbage collection does with batches that no procedure and no
        declared consumer reads: "latest" keeps only the newest batch; "all" keeps every
        batch until a consumer declared later has acknowledged it (use it for an output that
        a job you do not declare here, such as a periodic ``sstore migrate``, moves later)."""
        self._declaring()
        self._graph.add_stream(StreamDecl(name, dict(columns) if columns is not None else None,
                                          retain))
        return name

    def window(self, name: str, source: str, *, rows: int | None = None,
               batches: int | None = None, slide: int = 1) -> str:
        """Declare a window over ``source``: the last ``rows`` tuples or ``batches`` batches,
        moving ``slide`` at a time. Procedures may take it as input (one execution per slide)."""
        self._declaring()
        if (rows is None) == (batches is None):
            raise DeclarationError(f"window {name!r}: give exactly one of rows= or batches=")
        size, unit = (rows, "rows") if rows is not None else (batches, "batches")
        self._graph.add_window(WindowDecl(name, source, int(size or 0), int(slide), unit))
        return name

    def event_window(self, name: str, source: str, *, time: str,
                     size: event_windows.Duration, slide: event_windows.Duration | None = None,
                     key: str | Sequence[str] = (), delay: event_windows.Duration = 0,
                     allowed_lateness: event_windows.Duration = 0,
                     aggregates: Mapping[str, str] | None = None,
                     retain: str = "latest") -> str:
        """Declare an event-time window over ``source`` (``sstore.dataflow.event_windows`` has the
        semantics): windows of ``size`` every ``slide`` (default: tumbling) over the column
        ``time``, per ``key``, closed when the watermark (max event time seen - ``delay``)
        passes their end, corrected by late rows until it passes end + ``allowed_lateness``.

        Makes two streams: ``name``, a batch per source batch with one row per window that
        closed or was corrected (the key, window_start, window_end, revision and the
        ``aggregates``: output column -> SQL aggregate over the window's rows, default
        ``{"rows": "count(*)"}``), and ``name + "__late"``, the rows too late for any window.
        Durations: ``timedelta`` or an interval string ("5 minutes") for a timestamp column,
        integers in its unit for an integer column. ``retain`` is the output stream's."""
        self._declaring()
        decl = event_windows.declare(self._con, self._graph, name, source, time=time,
                                     size=size, slide=slide, key=key, delay=delay,
                                     allowed_lateness=allowed_lateness,
                                     aggregates=aggregates, retain=retain)
        self._graph.add_event_window(decl)
        return name

    def trigger(self, target: str, sql: str) -> None:
        """Attach SQL to a stream or window (an EE trigger). It runs inside the transaction that
        appends to ``target``; the appended rows are the relation ``new_rows`` (for a window:
        its contents after the slide) and ``$batch_id`` is the batch-id."""
        self._declaring()
        self._graph.add_trigger(TriggerDecl(target, sql))

    def retire(self, name: str) -> None:
        """Say that procedure ``name``, which the program that last ran on this state file
        declared, is gone on purpose. Without it, a new procedure on the same inputs is
        refused at start as a probable rename (``sstore.storage.redeclared``): run under a new name
        it would process every kept batch again. With it, the new one does. It does not hand
        over the old one's output stream: a new procedure writing it from a batch at or below
        its last is refused at start (a stream's batch-ids are written once, in order)."""
        self._declaring()
        if name in self._graph.procedures:
            raise DeclarationError(f"procedure {name!r} is declared by this program; only one "
                                   f"it no longer declares can be retired")
        self._retired.add(name)

    def evolve(self, stream: str, *, rename: Mapping[str, str] | None = None,
               drop: Sequence[str] = (),
               cast: Mapping[str, str | None] | Sequence[str] | None = None) -> None:
        """Change a stored stream on purpose where redeclaring it is refused (a rename, a
        dropped column, a type that is not a widening: ``sstore.storage.evolution``). Declare the
        stream with its new columns, then call this before the first ingest or run: at start
        the stored table is renamed, dropped and cast (``cast``: column -> type, or columns
        whose declared type they take; the stored values are converted, and a value that does
        not convert refuses the whole start, nothing changed), then compared with the
        declaration as usual. All of it, and the new version's record, is one transaction.
        Once the table matches the declaration this is a no-op, so a program may keep it."""
        self._declaring()
        decl = self._graph.streams.get(stream)
        if decl is None or decl.columns is None:
            raise DeclarationError(f"evolve({stream!r}): declare the stream with its new "
                                   f"columns first (engine.stream)")
        casts = dict(cast) if isinstance(cast, Mapping) else dict.fromkeys(cast or ())
        self._evolutions[stream] = Explicit(dict(rename or {}), tuple(drop), casts)

    def upgrade(self, name: str, new_fn: Callable[..., Any], *,
                from_batch: int | None = None) -> None:
        """Replace procedure ``name``'s code at a batch boundary (``sstore.storage.upgrades``):
        declare it as before, then call this before the first ingest or run. Pending batches
        below ``from_batch`` still run the declared code; batches from it on run ``new_fn``,
        recorded as the next version. ``from_batch`` must come after every batch the
        procedure committed (default: the next one). Once recorded, the call is a no-op."""
        self._declaring()
        if name not in self._graph.procedures:
            raise DeclarationError(f"upgrade({name!r}): declare the procedure first, as "
                                   f"before (its current version's code)")
        self._upgrades[name] = Upgrade(new_fn, from_batch)

    def procedure(self, input: str | Sequence[str], output: str | Sequence[str] = (), *,
                  name: str | None = None, on_error: str | ErrorPolicy = ErrorPolicy.HALT,
                  retries: int = 2, timeout: float | None = None, version: int = 1
                  ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Declare a stored procedure: ``fn(tx, batch)`` runs once per batch as one transaction.

        ``batch`` is the input batch as an Arrow table (and the SQL relation ``batch``); with
        several inputs it is a dict of tables (relations ``<input>_batch``). What ``fn`` returns
        becomes batch b of the output stream (a dict of stream to rows with several outputs).
        ``on_error``: "halt" (default) or "dead_letter"; ``retries``: how often a transient
        error is tried again. ``timeout``: seconds one execution may run; past it, the
        execution is interrupted (its SQL statement and its Python code), rolled back, and
        ``on_error`` applies. None (the default): no limit, so a procedure that never returns
        holds the engine (every stream, ``status()``) until the process ends.
        ``version``: the version of its code; a higher one than the state file recorded runs
        from the batch after the procedure's last (``sstore.storage.upgrades``).
        """
        self._declaring()
        inputs = (input,) if isinstance(input, str) else tuple(input)
        outputs = (output,) if isinstance(output, str) else tuple(output)

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._graph.add_procedure(ProcedureDecl(
                name or fn.__name__, fn, inputs, outputs, ErrorPolicy(on_error), retries,
                doc=(fn.__doc__ or "").strip().split("\n")[0], timeout=timeout))
            self._versions[name or fn.__name__] = version
            return fn

        return register

    def sql_procedure(self, name: str, sql: str, *, input: str, output: str,
                      on_error: str | ErrorPolicy = ErrorPolicy.HALT, retries: int = 2,
                      timeout: float | None = None, doc: str = "", version: int = 1) -> None:
        """Declare a stored procedure that is one SELECT over its input batch ``batch``: its
        rows become batch b of ``output``. The same as a function procedure returning
        ``tx.sql(sql)``, but the engine may chain it with the SQL procedure that reads its
        output, running both (and the rest of such a chain) as one statement in the batch's
        group commit (``sstore.dataflow.fusion``: an intermediate batch is then never materialized).
        The SELECT must not depend on the order of its input rows."""
        sql = fusion.check_select(name, sql)
        self._declaring()

        def run(tx: Transaction, batch: pa.Table) -> pa.Table:
            return tx.sql(sql)

        self._graph.add_procedure(ProcedureDecl(
            name, run, (input,), (output,), ErrorPolicy(on_error), retries,
            doc=doc or sql.strip().split("\n")[0], timeout=timeout, sql=sql))
        self._versions[name] = version
