"""Where a batch's time goes in the engine: closed-loop rounds under cProfile, split into the
commit protocol's phases, plus every DuckDB call a transaction execution (TE) makes.

A phase is named by the sstore function that does it (``module.function``; a method counts by
its own name), optionally only when called from another one, and is resolved against the code
before anything runs. A phase whose function, caller or call no longer exists is reported as
MISSING with the reason, never as a zero; one that exists but did not run is "not called"
(expected for a few: the input log outside weak mode, GC in a short run). So renaming engine
internals shows up here as a visible gap in the table, not as a crash or a silent 0.

cProfile cannot see DuckDB's nanobind methods (their time lands in the caller's own time), so
while profiling, the methods of ``duckdb.DuckDBPyConnection`` are wrapped at class level:
each call is counted and timed by context (TE, ingest, GC) and by the sstore function that made
it. The per-TE statement budget is a design goal, so it is checked by counting, not by reading
the code. Nothing inside the engine is replaced or reached into. cProfile's overhead inflates
every number a bit: read the shares, and the unprofiled ms/TE of the main table.
"""

from __future__ import annotations

import collections
import cProfile
import importlib
import inspect
import os
import pstats
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import CodeType, ModuleType
from typing import Any, Self

import duckdb
import pyarrow as pa

from benchmarks.engine_driver import LatencyProbe, engine_step, slices, start_engine
from benchmarks.engine_workloads import Workload
from sstore import Engine

HERE = os.path.abspath(__file__)
DUCKDB_DIR = os.path.dirname(os.path.abspath(duckdb.__file__)) + os.sep
FuncKey = tuple[str, int, str]  # cProfile's key: (file, first line, function)


@dataclass(frozen=True)
class Phase:
    label: str
    depth: int
    kind: str  # "py": an sstore function's cumulative time; "db": DuckDB calls; "proc": bodies
    target: str = ""  # "module.function" (py), or the DuckDB connection method (db)
    caller: str = ""  # "module.function": only calls made from there
    context: str = ""  # db: the CONTEXTS key the call must be made under
    optional: bool = False  # may legitimately not run in a given mode or run length


# The sstore function whose frame on the stack says what a DuckDB call is for.
CONTEXTS = {"TE": "execution.group._run_group", "ingest": "execution.ingest.apply_ingest", "GC":
"execution.gc.collect"}

PHASES: tuple[Phase, ...] = (
    # engine_step feeds with Engine.ingest_and_run: the ingest leads its batch's group commit
    Phase("ingest_and_run (whole call)", 0, "py", "engine.ingest_and_run"),
    Phase("conform rows to the stream schema", 1, "py", "storage.streams.conform",
          "execution.ingest.ingest_batch"),
    Phase("backpressure check", 1, "py", "execution.backpressure.admit",
          "execution.ingest.ingest_batch"),
    # weak durability: ingest_and_run is a plain ingest, then run_until_idle's groups
    Phase("plain ingest (weak durability)", 1, "py", "execution.ingest.apply_ingest",
          optional=True),
    Phase("group commit led by the ingest (every TE of the batch)", 1, "py",
          "execution.group.ingest_and_run", optional=True),
    Phase("BEGIN", 2, "db", "begin", "execution.group._run_group", "TE"),
    Phase("append rows to the border stream", 2, "py", "storage.streams.append",
          "execution.group._append_lead",
          optional=True),
    Phase("scheduler.next", 2, "py", "execution.scheduler.next"),
    Phase("read input batch (not the lead's: in memory)", 2, "py", "execution.runtime.input_batch",
          "execution.group._run_member", optional=True),
    Phase("register input relation", 2, "py", "execution.executor.register_inputs",
          "execution.group._run_member"),
    Phase("procedure body", 2, "proc"),
    Phase("tx.sql (bind, run, to Arrow)", 3, "py", "execution.transaction.sql"),
    Phase("tx.execute", 3, "py", "execution.transaction.execute"),
    Phase("check output schema", 2, "py", "execution.executor.check_outputs",
          "execution.group._run_member"),
    Phase("append output stream", 2, "py", "storage.streams.append", "execution.group._run_member"),
    Phase("store held-back rows", 2, "py", "execution.group._store_held_back",
          "execution.group._run_group"),
    Phase("insert commit records", 2, "py", "storage.systables.insert_commits",
          "execution.group._run_group"),
    Phase("COMMIT", 2, "db", "commit", "execution.group._run_group", "TE"),
    Phase("apply to memory (finish)", 2, "py", "execution.runtime.finish",
          "execution.group._apply"),
    Phase("commit observers (this benchmark's probe)", 2, "py", "execution.runtime.observe",
          "execution.group._apply"),
    Phase("run_until_idle after the group (finds nothing)", 1, "py", "engine.run_until_idle"),
    Phase("garbage collection (own txn)", 1, "py", "execution.gc.collect", optional=True),
    Phase("publish to subscribers", 1, "py", "storage.subscriptions.publish",
          "execution.ingest.ingest_batch"),
)

# ---------------------------------------------------------------------------------------------
# resolving names against the code


def _functions(module: ModuleType) -> dict[str, list[CodeType]]:
    """Code objects of the functions and methods defined in ``module``, by name."""
    found: dict[str, list[CodeType]] = {}

    def add(fn: Any) -> None:
        code = getattr(inspect.unwrap(fn), "__code__", None)
        if code is not None and code.co_filename == module.__file__:
            codes = found.setdefault(code.co_name, [])
            if code not in codes:
                codes.append(code)

    for obj in vars(module).values():
        if inspect.isfunction(obj):
            add(obj)
        elif inspect.isclass(obj) and obj.__module__ == module.__name__:
            for attr in vars(obj).values():
                attr = getattr(attr, "__func__", None) or getattr(attr, "fget", None) or attr
                if inspect.isfunction(attr):
                    add(attr)
    return found


def find(qualname: str) -> tuple[list[CodeType], str]:
    """The code objects of ``sstore.<module>.<function>`` (``<module>`` may be dotted: a wing's
    module, ``execution.group``), or ([], why not)."""
    module_name, _, function = qualname.rpartition(".")
    try:
        module = importlib.import_module(f"sstore.{module_name}")
    except ImportError:
        return [], f"no module sstore.{module_name}"
    codes = _functions(module).get(function, [])
    return (codes, "") if codes else ([], f"sstore.{module_name} has no function {function}")


def _mentions(code: CodeType, name: str) -> bool:
    """Whether ``code`` (or a closure or comprehension inside it) uses the name ``name``."""
    return name in code.co_names or any(
        _mentions(const, name) for const in code.co_consts if isinstance(const, CodeType))


def _with_nested(codes: list[CodeType]) -> list[CodeType]:
    nested = [const for code in codes for const in code.co_consts if isinstance(const, CodeType)]
    return codes + (_with_nested(nested) if nested else [])


@dataclass(frozen=True)
class Resolved:
    phase: Phase
    targets: tuple[CodeType, ...] = ()
    callers: tuple[CodeType, ...] = ()
    missing: str = ""  # why the phase cannot be measured any more


def resolve(phase: Phase) -> Resolved:
    """Check a phase against the code: its function, its caller, that the caller calls it."""
    targets: list[CodeType] = []
    if phase.kind == "py":
        targets, why = find(phase.target)
        if why:
            return Resolved(phase, missing=why)
    callers: list[CodeType] = []
    if phase.caller:
        callers, why = find(phase.caller)
        if why:
            return Resolved(phase, missing=f"caller: {why}")
        name = phase.target.rpartition(".")[2]
        if not any(_mentions(code, name) for code in callers):
            return Resolved(phase, missing=f"{phase.caller} no longer calls {name}")
        callers = _with_nested(callers)  # a call from a comprehension inside counts too
    if phase.context:
        context = CONTEXTS.get(phase.context, "")
        if not context or find(context)[1]:
            return Resolved(phase, missing=f"context {phase.context}: "
                                           f"{find(context)[1] if context else 'unknown'}")
    return Resolved(phase, tuple(targets), tuple(callers))


def _key(code: CodeType) -> FuncKey:
    return code.co_filename, code.co_firstlineno, code.co_name


def _label(code: CodeType) -> str:
    return f"{os.path.splitext(os.path.basename(code.co_filename))[0]}.{code.co_name}"


# ---------------------------------------------------------------------------------------------
# recording DuckDB calls


class DuckDBCalls:
    """While installed (``with``), counts and times every call of the ``COUNTED`` methods of
    every DuckDB connection, by (context, calling function, method)."""

    COUNTED = ("execute", "executemany", "sql", "begin", "commit", "rollback", "register",
               "unregister")

    def __init__(self) -> None:
        self.contexts: dict[CodeType, str] = {}
        self.missing_contexts: dict[str, str] = {}
        for label, qualname in CONTEXTS.items():
            codes, why = find(qualname)
            self.contexts.update((code, label) for code in codes)
            if why:
                self.missing_contexts[label] = why
        self.calls: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.seconds: collections.defaultdict[tuple[str, str, str], float] = \
            collections.defaultdict(float)
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> Self:
        cls = duckdb.DuckDBPyConnection
        self._saved = {name: cls.__dict__[name] for name in self.COUNTED if name in cls.__dict__}
        for name, original in self._saved.items():
            setattr(cls, name, self._wrap(name, original))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._saved.items():
            setattr(duckdb.DuckDBPyConnection, name, original)

    def _wrap(self, name: str, original: Any) -> Any:
        calls, seconds, context = self.calls, self.seconds, self._context

        def recorded(con: Any, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(DUCKDB_DIR):
                return original(con, *args, **kwargs)  # part of an outer call, already timed
            key = (context(caller), _label(caller.f_code), name)
            start = time.perf_counter()
            try:
                return original(con, *args, **kwargs)
            finally:
                calls[key] += 1
                seconds[key] += time.perf_counter() - start
        return recorded

    def _context(self, frame: Any) -> str:
        while frame is not None:
            label = self.contexts.get(frame.f_code)
            if label is not None:
                return label
            frame = frame.f_back
        return "other"


# ---------------------------------------------------------------------------------------------
# profiling


def profile_phases(workload: Workload, mode: str, batch_size: int, batches: int,
                   source: pa.Table, state_dir: str) -> dict[str, Any]:
    """Run closed-loop rounds under cProfile with DuckDB calls recorded; split their time
    into the commit protocol's phases."""
    resolved = [resolve(phase) for phase in PHASES]
    eng, commits = start_engine(workload, mode, state_dir)
    try:
        step = engine_step(eng, workload.input_stream, commits, LatencyProbe())
        step(1, source.slice(0, batch_size))  # first-use costs stay outside the profile
        with DuckDBCalls() as recorder:
            profiler = cProfile.Profile()
            start = time.perf_counter()
            profiler.enable()
            tes = sum(step(i, t) for i, t in enumerate(
                slices(source.slice(batch_size), batch_size, batches), 2))
            profiler.disable()
            wall = time.perf_counter() - start
        stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        bodies, bodies_missing = _procedure_codes(eng)
    finally:
        eng.close()
    phases = [_phase(r, stats, recorder, bodies, bodies_missing, batches, tes, wall)
              for r in resolved]
    missing = [f"{p['phase']}: {p['status']}" for p in phases if p["status"].startswith("MISSING")]
    missing += [f"DuckDB call context {label}: {why}"
                for label, why in recorder.missing_contexts.items()]
    in_duckdb = _seconds_in_duckdb(stats, recorder)
    return {"workload": workload.name, "mode": mode, "batch_size": batch_size,
            "batches": batches, "tes": tes, "wall_ms_per_batch": wall * 1000 / batches,
            "duckdb_ms_per_batch": in_duckdb * 1000 / batches, "duckdb_share": in_duckdb / wall,
            "phases": phases, "missing": missing,
            "duckdb_calls": _call_rows(recorder, batches, tes),
            "top_self": _top_self(stats, batches)}


def _procedure_codes(eng: Engine) -> tuple[set[FuncKey], str]:
    """The declared procedure functions, found by their code objects."""
    try:
        return {_key(d.fn.__code__) for d in eng.graph.procedures.values()}, ""
    except AttributeError as exc:
        return set(), f"procedures not found on Engine.graph ({exc})"


def _phase(r: Resolved, stats: dict[FuncKey, Any], recorder: DuckDBCalls, bodies: set[FuncKey],
           bodies_missing: str, batches: int, tes: int, wall: float) -> dict[str, Any]:
    phase = r.phase
    row: dict[str, Any] = {"phase": phase.label, "depth": phase.depth}
    missing = r.missing or (bodies_missing if phase.kind == "proc" else "")
    if missing:
        return {**row, "status": f"MISSING: {missing}", "calls_per_batch": None,
                "ms_per_batch": None, "ms_per_te": None, "share": None}
    if phase.kind == "py":
        calls, seconds = _cumulative(stats, {_key(c) for c in r.targets},
                                     {_key(c) for c in r.callers})
    elif phase.kind == "db":
        labels = {_label(c) for c in r.callers}
        calls = sum(n for (ctx, caller, call), n in recorder.calls.items()
                    if ctx == phase.context and caller in labels and call == phase.target)
        seconds = sum(s for (ctx, caller, call), s in recorder.seconds.items()
                      if ctx == phase.context and caller in labels and call == phase.target)
    else:
        calls, seconds = _cumulative(stats, bodies, set())
    status = "ok" if calls else "not called" if phase.optional else "NOT CALLED (unexpected)"
    return {**row, "status": status, "calls_per_batch": calls / batches,
            "ms_per_batch": seconds * 1000 / batches, "ms_per_te": seconds * 1000 / tes,
            "share": seconds / wall}


def _cumulative(stats: dict[FuncKey, Any], targets: set[FuncKey],
                callers: set[FuncKey]) -> tuple[int, float]:
    """(calls, cumulative seconds) of the target functions, only from ``callers`` if given."""
    calls, seconds = 0, 0.0
    for key in targets & stats.keys():
        _, nc, _, ct, from_callers = stats[key]
        if not callers:
            calls, seconds = calls + nc, seconds + ct
            continue
        for ckey, (cnc, _, _, cct) in from_callers.items():
            if ckey in callers:
                calls, seconds = calls + cnc, seconds + cct
    return calls, seconds


def _seconds_in_duckdb(stats: dict[FuncKey, Any], recorder: DuckDBCalls) -> float:
    """Time inside DuckDB: the recorded connection calls, plus DuckDB's Python-level methods
    (such as a relation's ``to_arrow_table``, where a ``con.sql`` query really runs) called from
    outside the duckdb package and this file. The rest of the wall time is the engine's Python."""
    total = sum(recorder.seconds.values())
    for key, (_, _, _, _, callers) in stats.items():
        if not key[0].startswith(DUCKDB_DIR):
            continue
        for ckey, (_, _, _, cct) in callers.items():
            if not ckey[0].startswith(DUCKDB_DIR) and ckey[0] != HERE:
                total += cct
    return total


def _call_rows(recorder: DuckDBCalls, batches: int, tes: int) -> dict[str, Any]:
    """DuckDB calls per batch by (context, caller, call), and the per-TE totals."""
    rows = [{"context": ctx, "caller": caller, "call": call, "per_batch": n / batches,
             "ms_per_call": recorder.seconds[(ctx, caller, call)] * 1000 / n}
            for (ctx, caller, call), n in sorted(recorder.calls.items())]
    statements = {"execute", "executemany", "sql"}

    def count(keys: Iterable[tuple[str, str, str]]) -> int:
        return sum(recorder.calls[k] for k in keys)

    keys = list(recorder.calls)
    return {"rows": rows,
            "sql_statements_per_te": count(k for k in keys if k[0] == "TE"
                                           and k[2] in statements) / tes,
            "duckdb_calls_per_te": count(k for k in keys if k[0] == "TE") / tes,
            "sql_statements_per_batch": count(k for k in keys if k[2] in statements) / batches,
            "duckdb_calls_per_batch": count(keys) / batches}


def _top_self(stats: dict[FuncKey, Any], batches: int) -> list[dict[str, Any]]:
    """Functions by their own time. DuckDB's nanobind calls show up as the recorder's
    ``recorded`` wrapper: cProfile cannot see inside them."""
    top = sorted(((key, tt) for key, (_, _, tt, _, _) in stats.items()), key=lambda kv: -kv[1])
    return [{"function": _where(k), "ms_per_batch": round(tt * 1000 / batches, 4)}
            for k, tt in top[:20]]


def _where(key: FuncKey) -> str:
    filename, line, name = key
    if filename == HERE and name == "recorded":
        return "DuckDB connection calls (nanobind, timed by the recorder)"
    return name if filename == "~" else f"{os.path.basename(filename)}:{line}({name})"
