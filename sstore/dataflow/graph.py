"""The dataflow graph: the declarations a program makes each time it starts.

Streams, windows and procedures share one namespace, because each of them is a node whose
progress the engine records under its name. The graph checks itself once, when the engine
starts, so that a wrong declaration fails before any batch is touched.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sstore.base.errors import DeclarationError, UnknownStreamError


class ErrorPolicy(enum.StrEnum):
    """What the engine does when a procedure raises on a batch (after its retries).

    ``HALT`` (the default) stops that procedure and everything downstream of it at the failing
    batch, keeps the batch, and records the error and the halt: nothing is lost and order is
    kept. The halt is kept in the state file, so the procedure stays halted across restarts
    until ``Engine.resume`` (or ``sstore resume STATE PROC``) lets it try the batch again.
    ``DEAD_LETTER`` copies the input batch into ``<stream>__dead_letter`` with the error,
    commits an empty output batch and moves on.
    """

    HALT = "halt"
    DEAD_LETTER = "dead_letter"


RETAIN = ("latest", "all")


@dataclass(frozen=True)
class StreamDecl:
    """A stream. ``retain`` says what happens to batches no reader has declared an interest in:
    "latest" keeps only the newest (for pull readers), "all" keeps every batch until a consumer
    (a sink declared later) has acknowledged it."""

    name: str
    columns: dict[str, str] | None  # None: inferred from the first non-empty output batch
    retain: str = "latest"

    def __post_init__(self) -> None:
        if self.retain not in RETAIN:
            raise DeclarationError(f"stream {self.name!r}: retain must be one of {RETAIN}, "
                                   f"not {self.retain!r}")


@dataclass(frozen=True)
class WindowDecl:
    """A window over ``source``: ``rows``/``slide`` tuples, or ``batches``/``slide`` batches."""

    name: str
    source: str
    size: int
    slide: int
    unit: str  # "rows" or "batches"


@dataclass(frozen=True)
class EventWindowDecl:
    """An event-time window over ``source`` (``sstore.dataflow.event_windows``; made by ``declare``
    there, which checks the columns and the aggregates against DuckDB).

    Times, sizes and the watermark are integers: microseconds since the epoch for a
    TIMESTAMP/TIMESTAMPTZ column, the column's own unit for an integer column. Its output is
    the stream ``name`` (one row per window fired: ``key``, window_start, window_end,
    revision, ``aggregates``) and the stream ``name + "__late"`` (rows too late for their
    windows, with the source's columns)."""

    name: str
    source: str
    time: str
    time_type: str  # the DuckDB type of the time column
    size: int
    slide: int
    key: tuple[str, ...]
    delay: int  # watermark = max event time seen - delay
    allowed_lateness: int  # a window takes late rows until watermark >= end + allowed_lateness
    aggregates: tuple[tuple[str, str], ...]  # (output column, SQL aggregate over the rows)
    columns: tuple[tuple[str, str], ...]  # the source's columns with plain DuckDB types
    output: tuple[tuple[str, str], ...]  # the output stream's columns and types
    retain: str = "latest"  # of the output stream; the late stream keeps "all"

    @property
    def late(self) -> str:
        return self.name + "__late"

    def spec(self) -> dict[str, Any]:
        """What a state file records of this declaration (and checks at the next start)."""
        return {"source": self.source, "time": self.time, "time_type": self.time_type,
                "size": self.size, "slide": self.slide, "key": list(self.key),
                "delay": self.delay, "allowed_lateness": self.allowed_lateness,
                "aggregates": [list(a) for a in self.aggregates],
                "columns": [list(c) for c in self.columns],
                "output": [list(c) for c in self.output], "retain": self.retain}

    @classmethod
    def from_spec(cls, name: str, spec: dict[str, Any]) -> EventWindowDecl:
        """The declaration a state file recorded (``spec``), for ``Engine.open_existing``."""
        return cls(name, spec["source"], spec["time"], spec["time_type"], spec["size"],
                   spec["slide"], tuple(spec["key"]), spec["delay"], spec["allowed_lateness"],
                   tuple((a, e) for a, e in spec["aggregates"]),
                   tuple((c, t) for c, t in spec["columns"]),
                   tuple((c, t) for c, t in spec["output"]), spec["retain"])


@dataclass(frozen=True)
class TriggerDecl:
    """SQL run inside the transaction that appends to ``target`` (a stream or a window)."""

    target: str
    sql: str


@dataclass
class ProcedureDecl:
    """A stored procedure. ``timeout``: seconds one transaction execution may run before it is
    interrupted and the error policy applies (None: no limit)."""

    name: str
    fn: Callable[..., Any]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    on_error: ErrorPolicy = ErrorPolicy.HALT
    retries: int = 2
    deterministic: bool = True
    doc: str = ""
    timeout: float | None = None
    #: a SQL procedure's one SELECT (``Engine.sql_procedure``): what ``fn`` runs, and what lets
    #: a group commit chain it with the next one (``sstore.dataflow.fusion``); None for a function
    sql: str | None = None


@dataclass
class Graph:
    streams: dict[str, StreamDecl] = field(default_factory=dict)
    windows: dict[str, WindowDecl] = field(default_factory=dict)
    procedures: dict[str, ProcedureDecl] = field(default_factory=dict)
    triggers: list[TriggerDecl] = field(default_factory=list)
    event_windows: dict[str, EventWindowDecl] = field(default_factory=dict)
    #: each event window's output streams (its fired windows, its late rows) -> the window
    event_outputs: dict[str, str] = field(default_factory=dict)

    # -- declaring ---------------------------------------------------------------------------
    def _check_new_name(self, name: str) -> None:
        if not isinstance(name, str) or not name or name.startswith("sstore_"):
            raise DeclarationError(f"invalid name {name!r} (non-empty, not starting with sstore_)")
        for kind, names in (("stream", self.streams), ("window", self.windows),
                            ("procedure", self.procedures)):
            if name in names:
                raise DeclarationError(f"{name!r} is already declared as a {kind} (streams, "
                                       f"windows and procedures share one namespace)")

    def add_stream(self, decl: StreamDecl) -> None:
        self._check_new_name(decl.name)
        self.streams[decl.name] = decl

    def add_window(self, decl: WindowDecl) -> None:
        self._check_new_name(decl.name)
        if decl.size < 1 or decl.slide < 1 or decl.slide > decl.size:
            raise DeclarationError(f"window {decl.name!r}: need 1 <= slide <= size, got "
                                   f"size={decl.size} slide={decl.slide}")
        self.windows[decl.name] = decl

    def add_event_window(self, decl: EventWindowDecl) -> None:
        """Declare an event window and its two output streams (one namespace for all three:
        the window is the stream of its fired windows)."""
        self._check_new_name(decl.name)
        self._check_new_name(decl.late)
        if decl.source not in self.streams:
            raise UnknownStreamError(f"event window {decl.name!r} follows unknown stream "
                                     f"{decl.source!r} (declare it first, with its columns)")
        self.streams[decl.name] = StreamDecl(decl.name, dict(decl.output), decl.retain)
        self.streams[decl.late] = StreamDecl(decl.late, dict(decl.columns), "all")
        self.event_windows[decl.name] = decl
        self.event_outputs[decl.name] = decl.name
        self.event_outputs[decl.late] = decl.name

    def event_windows_on(self, stream: str) -> list[EventWindowDecl]:
        return [w for w in self.event_windows.values() if w.source == stream]

    def writer_of(self, stream: str) -> str | None:
        """Who writes ``stream`` ("procedure 'p'", "event window 'w'"), None for a border
        stream."""
        if stream in self.event_outputs:
            return f"event window {self.event_outputs[stream]!r}"
        producer = self.producer_of(stream)
        return None if producer is None else f"procedure {producer!r}"

    def add_procedure(self, decl: ProcedureDecl) -> None:
        self._check_new_name(decl.name)
        if not decl.inputs:
            raise DeclarationError(f"procedure {decl.name!r} needs at least one input")
        if len(set(decl.outputs)) != len(decl.outputs) or len(set(decl.inputs)) != len(decl.inputs):
            raise DeclarationError(f"procedure {decl.name!r}: inputs and outputs must be unique")
        if decl.timeout is not None and (isinstance(decl.timeout, bool)
                                         or not isinstance(decl.timeout, (int, float))
                                         or not decl.timeout > 0):
            raise DeclarationError(f"procedure {decl.name!r}: timeout must be a positive number "
                                   f"of seconds or None, not {decl.timeout!r}")
        if isinstance(decl.retries, bool) or not isinstance(decl.retries, int) \
                or decl.retries < 0:
            raise DeclarationError(f"procedure {decl.name!r}: retries must be an integer >= 0, "
                                   f"not {decl.retries!r}")
        params = inspect.signature(decl.fn).parameters
        if len(params) < 2:
            raise DeclarationError(f"procedure {decl.name!r} must take (tx, batch)")
        self.procedures[decl.name] = decl

    def add_trigger(self, decl: TriggerDecl) -> None:
        self.triggers.append(decl)

    # -- reading -----------------------------------------------------------------------------
    def producer_of(self, stream: str) -> str | None:
        for proc in self.procedures.values():
            if stream in proc.outputs:
                return proc.name
        return None

    def is_stream(self, name: str) -> bool:
        """Declared as a stream, or the (not yet inferred) output of a procedure."""
        return name in self.streams or any(name in p.outputs for p in self.procedures.values())

    def is_border(self, stream: str) -> bool:
        return (stream in self.streams and stream not in self.event_outputs
                and self.producer_of(stream) is None)

    def consumers_of(self, node: str) -> list[str]:
        return [p.name for p in self.procedures.values() if node in p.inputs]

    def windows_on(self, stream: str) -> list[WindowDecl]:
        return [w for w in self.windows.values() if w.source == stream]

    def triggers_on(self, target: str) -> list[TriggerDecl]:
        return [t for t in self.triggers if t.target == target]

    def validate(self) -> list[str]:
        """Check the whole graph; return procedure names in topological order."""
        producers: dict[str, str] = {}
        for proc in self.procedures.values():
            for name in proc.outputs:  # an undeclared output is a stream typed by its first rows
                if name not in self.streams and name not in self.windows:
                    self._check_new_name(name)
                    self.streams[name] = StreamDecl(name, None)
        for proc in self.procedures.values():
            for name in proc.inputs:
                if name not in self.streams and name not in self.windows:
                    raise UnknownStreamError(
                        f"procedure {proc.name!r} reads {name!r}, which is not a declared stream "
                        f"or window (declare inputs with Engine.stream)")
            for name in proc.outputs:
                if name in self.event_outputs:
                    raise DeclarationError(f"procedure {proc.name!r} writes {name!r}, which "
                                           f"event window {self.event_outputs[name]!r} writes")
                if name in self.windows:
                    raise DeclarationError(f"procedure {proc.name!r} writes window {name!r}; "
                                           f"procedures write streams, windows follow them")
                if name in producers:
                    raise DeclarationError(f"stream {name!r} is written by both "
                                           f"{producers[name]!r} and {proc.name!r}")
                producers[name] = proc.name
        for win in self.windows.values():
            if win.source not in self.streams:
                raise UnknownStreamError(f"window {win.name!r} follows unknown stream "
                                         f"{win.source!r}")
        for trig in self.triggers:
            if trig.target not in self.streams and trig.target not in self.windows:
                raise UnknownStreamError(f"trigger on unknown stream or window {trig.target!r}")
        return self._topological_order()

    def upstream_procedures(self, proc: ProcedureDecl) -> list[str]:
        """Procedures whose output ``proc`` reads directly (through a window too)."""
        ups = []
        for name in proc.inputs:
            stream = self.source_stream(name)
            producer = self.producer_of(stream)
            if producer is not None:
                ups.append(producer)
        return ups

    def _topological_order(self) -> list[str]:
        order: list[str] = []
        state: dict[str, int] = {}

        def visit(name: str, path: tuple[str, ...]) -> None:
            if state.get(name) == 2:
                return
            if state.get(name) == 1:
                cycle = " -> ".join(path[path.index(name):] + (name,))
                raise DeclarationError(f"the dataflow graph has a cycle: {cycle}")
            state[name] = 1
            for up in self.upstream_procedures(self.procedures[name]):
                visit(up, path + (name,))
            state[name] = 2
            order.append(name)

        for name in self.procedures:
            visit(name, ())
        return order

    def source_stream(self, node: str) -> str:
        """The stream whose commits make ``node`` (a stream or a window) advance: a window's
        source, an event window's output's source (they commit with it), else ``node``."""
        while True:
            if node in self.windows:
                node = self.windows[node].source
            elif node in self.event_outputs:
                node = self.event_windows[self.event_outputs[node]].source
            else:
                return node
