"""Run an sstore process under jemalloc when the machine has it (the ``sstore`` command and the
benchmarks do; a program that imports sstore chooses its own allocator).

Why: DuckDB keeps its data in its own jemalloc, but its many small C++ objects (operator and
expression states, plans, update and version records) come from the C library's ``malloc``. In
a long streaming run glibc's heap fragments as the state grows, and every statement's many
small allocations get slower: TPC-DI DimTrade at SF 10, 1,000-trade batches, cost 40 ms per
batch early in Batch1 and 56 ms late under glibc, 37 and 42 ms under jemalloc (docs/tpcdi.md,
"SF 10's growth: the C library's allocator"). ``LD_PRELOAD`` is the only way to swap
``malloc`` in a running Python, and it is read when a process starts, so ``use_jemalloc()``
re-executes the process once, with the same interpreter and arguments (same PID: a
supervisor's signals and ``kill -9`` still reach it), with jemalloc preloaded. The
re-executed process then removes the preload from its environment again, so that what it
starts (Spark's JVM, PostgreSQL, ``pip``) inherits the environment the user gave it.

``SSTORE_MALLOC`` chooses: ``auto`` (the default: jemalloc when found, else the C library's
malloc, said once in the log), ``jemalloc`` (an error if it cannot be found), ``system`` (no
re-execution). ``SSTORE_JEMALLOC`` names the library file when it is not in a usual place.
This module imports only the standard library and ``sstore.base.errors``: it runs before anything
heavy is loaded.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from sstore.base.errors import TerminalError

log = logging.getLogger(__name__)

MODE_VARIABLE = "SSTORE_MALLOC"
LIBRARY_VARIABLE = "SSTORE_JEMALLOC"
MODES = ("auto", "jemalloc", "system")
#: Set on the re-executed process: the ``LD_PRELOAD`` it had before (possibly empty), so that
#: it can restore it, and so that a process whose preload did not take is not re-executed again.
REEXEC_MARKER = "_SSTORE_MALLOC_PRELOAD_BEFORE"
_USUAL_PLACES = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2", "/usr/local/lib/libjemalloc.so.2",
)


#: Why ``auto`` fell back to the C library's malloc in this process, if it did: the command
#: logs it once its logging is configured (this runs before that).
fallback_note: str | None = None


class AllocatorError(TerminalError):
    """``SSTORE_MALLOC`` asks for something this machine cannot give: a configuration error,
    raised before any work starts; retrying cannot help."""


def mode() -> str:
    """The allocator policy from ``SSTORE_MALLOC`` (``auto`` when unset)."""
    chosen = os.environ.get(MODE_VARIABLE, "auto").strip().lower() or "auto"
    if chosen not in MODES:
        raise AllocatorError(f"{MODE_VARIABLE}={chosen!r}: expected one of {', '.join(MODES)}")
    return chosen


def jemalloc_library() -> str | None:
    """The jemalloc shared library to preload: ``SSTORE_JEMALLOC``, else the first of the usual
    places of Debian's, Fedora's and a local build's ``libjemalloc.so.2`` that exists
    (``scripts/jemalloc.sh`` asks this function too)."""
    named = os.environ.get(LIBRARY_VARIABLE)
    if named:
        return named if Path(named).is_file() else None
    return next((place for place in _USUAL_PLACES if Path(place).is_file()), None)


def in_use() -> str:
    """``jemalloc`` when it is mapped into this process (preloaded or linked), else
    ``system``. Read from ``/proc/self/maps``, so it tells what is true, not what was asked."""
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "system"
    return "jemalloc" if "libjemalloc" in maps else "system"


def use_jemalloc() -> None:
    """Re-execute this process under jemalloc if the policy and the machine allow; return
    when it need not (already under it, ``system``, not Linux, or, in ``auto``, not found).

    Steps, in this order:

    1. A re-executed process (the marker is set) restores the ``LD_PRELOAD`` it was started
       with, so children do not inherit the preload, and returns: one re-execution at most,
       even where the loader ignored the preload.
    2. ``system``, a platform other than Linux, or jemalloc already mapped: return.
    3. Find the library; if it is missing, ``jemalloc`` raises ``AllocatorError`` and ``auto``
       keeps the reason in ``fallback_note`` (the command logs it at info) and returns.
    4. ``os.execve`` the same interpreter with the original command line (``sys.orig_argv``,
       so ``-m module`` and ``-c code`` work as well as a script) and jemalloc first in
       ``LD_PRELOAD``, the user's own preloads kept after it.
    """
    if REEXEC_MARKER in os.environ:  # 1.
        before = os.environ.pop(REEXEC_MARKER)
        if before:
            os.environ["LD_PRELOAD"] = before
        else:
            os.environ.pop("LD_PRELOAD", None)
        if in_use() != "jemalloc" and mode() == "jemalloc":
            raise AllocatorError("jemalloc was preloaded but is not in the process (the "
                                 "loader ignored LD_PRELOAD); unset SSTORE_MALLOC=jemalloc")
        return
    policy = mode()
    if policy == "system" or not sys.platform.startswith("linux") or in_use() == "jemalloc":
        return  # 2.
    library = jemalloc_library()  # 3.
    if library is None:
        if policy == "jemalloc":
            raise AllocatorError(
                "SSTORE_MALLOC=jemalloc but no libjemalloc.so.2 was found: install it "
                "(Debian: apt-get install libjemalloc2) or name it in SSTORE_JEMALLOC")
        global fallback_note
        fallback_note = ("jemalloc not found: using the C library's malloc (long runs slow "
                         "down as its heap fragments; Debian: apt-get install libjemalloc2)")
        log.info(fallback_note)
        return
    before = os.environ.get("LD_PRELOAD", "")
    env = dict(os.environ)
    env[REEXEC_MARKER] = before
    env["LD_PRELOAD"] = f"{library} {before}".strip()
    sys.stdout.flush()
    sys.stderr.flush()
    argv = list(sys.orig_argv)
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)  # 4.


def describe() -> str:
    """One line for ``--version`` and the benchmarks' machine record."""
    return f"malloc: {in_use()}, {MODE_VARIABLE}={os.environ.get(MODE_VARIABLE, 'auto')}"
