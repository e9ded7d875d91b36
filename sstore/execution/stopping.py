"""Clean stops: SIGINT and SIGTERM end a dataflow run between transactions, never inside one,
and record nothing.

A stop request is not an error. Ctrl-C on a run used to reach DuckDB as an error inside a
transaction execution, which the engine recorded as a failure and halted the procedure for;
here a signal only sets a flag and interrupts the engine, and the engine tells "interrupted
because we are stopping" (roll back, raise ``Stopped``) from a failure.

Protocol of a stop (``stop_on_signals``):

1. ``with stop_on_signals() as stop:`` installs handlers for SIGINT and SIGTERM (from the main
   thread; elsewhere Python allows none, and the block runs without). The previous handlers
   come back when the block ends. A signal the process ignores (``nohup``) stays ignored.
2. Python's C-level handler writes the signal's number into a pipe (``signal.set_wakeup_fd``)
   the moment it arrives. The Python-level handler does nothing: it would run only when the
   main thread next runs Python code, which may be long after, when the main thread is inside
   a DuckDB statement; and it runs between two instructions of the main thread, possibly
   inside the engine's bookkeeping or holding a lock it would need.
3. A watcher thread reads the pipe, sets ``stop.event``, calls ``interrupts.stop_all()``
   (every engine of the process interrupts its transaction execution in flight and starts no
   other; an engine opened later starts none either) and the callbacks given to
   ``stop.on_stop`` (e.g. cancel Spark jobs).
4. The execution in flight rolls back (or, if it was already committing, commits); the engine
   raises ``Stopped``; the program unwinds through its ``finally`` and ``with`` blocks: sinks
   detach after their chunk in flight, engines close. Committed batches are in the state file;
   what a sink had not moved yet stays held there for the next run.
5. ``command_stops`` (for CLI commands) then prints ``STOPPED_MESSAGE`` on stderr and exits
   with 128 + the signal number: 130 for SIGINT, 143 for SIGTERM, the shell's convention for
   "ended by that signal".

A second signal ends the process at once (``os._exit``, same status): as safe as a crash, which
the engine recovers from, but attached sinks do not finish their chunk in flight.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from sstore.execution import interrupts
from sstore.execution.interrupts import Stopped

__all__ = ["STOPPED_MESSAGE", "StopSignal", "Stopped", "command_stops", "stop_on_signals"]

STOPPED_MESSAGE = "stopped; every committed batch is safe; run again to resume"
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignal:
    """What ``stop_on_signals`` yields: ``event`` is set once a stop was requested."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self._callbacks: list[Callable[[], None]] = []

    @property
    def requested(self) -> bool:
        return self.event.is_set() or self.signum is not None

    @property
    def exit_status(self) -> int:
        """128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + int(self.signum or signal.SIGINT)

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (from the watcher thread) when a stop is requested: for work
        that is not an engine's, e.g. ``SparkContext.cancelAllJobs``."""
        self._callbacks.append(callback)

    def check(self) -> None:
        """Raise ``Stopped`` if a stop was requested: for loops and phases of a program that
        run outside any engine (generating data, reading files)."""
        if self.requested:
            raise Stopped("stopped")

    def request(self, signum: int | None = None) -> None:
        """Stop now: what a signal does (step 3), callable from any thread but a handler."""
        if self.signum is None:
            self.signum = signum
        self.event.set()
        interrupts.stop_all()
        for callback in self._callbacks:
            try:
                callback()
            except Exception as exc:  # noqa: BLE001 - a callback must not keep others from running
                print(f"sstore: while stopping: {type(exc).__name__}: {exc}", file=sys.stderr)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopSignal]:
    """SIGINT and SIGTERM request a clean stop while the block runs (see the module
    docstring); yields the ``StopSignal``."""
    stop = StopSignal()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # only the main thread may install handlers
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def watch() -> None:
        while True:
            signum = os.read(read_end, 1)[0]
            if signum == 0:
                return  # the block ended
            if signum not in SIGNALS:
                continue  # another signal with a Python handler: not ours
            if stop.signum is not None:
                os.write(2, b"sstore: second signal: exiting at once\n")
                os._exit(128 + signum)
            stop.request(signum)

    watcher = threading.Thread(target=watch, daemon=True, name="sstore-stop-watcher")
    watcher.start()
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    ours = [signum for signum, handler in previous.items() if handler is not signal.SIG_IGN]
    old_wakeup = signal.set_wakeup_fd(write_end)
    for signum in ours:
        signal.signal(signum, _note)
    try:
        yield stop
    finally:
        for signum in ours:
            signal.signal(signum, previous[signum])
        signal.set_wakeup_fd(old_wakeup)
        os.write(write_end, b"\0")
        watcher.join()
        os.close(read_end)
        os.close(write_end)
        interrupts.PROCESS_STOP.clear()


def _note(_signum: int, _frame: FrameType | None) -> None:
    """The Python-level handler: nothing to do. It only replaces the default one (which would
    raise KeyboardInterrupt or end the process): the signal's number reaches the watcher
    thread through the wakeup fd, written by Python's C-level handler at once, even while the
    main thread is inside a long DuckDB statement and runs no Python code."""


@contextlib.contextmanager
def command_stops() -> Iterator[StopSignal]:
    """For a command that runs a dataflow: a signal stops it cleanly and the process exits
    with ``STOPPED_MESSAGE`` and 130 (SIGINT) or 143 (SIGTERM).

    Once a stop was requested, whatever ends the block (``Stopped``, or an error that the
    interruption caused on the way, e.g. a cancelled Spark job) is the stop: it rolled back,
    and the next run shows any real error again."""
    with stop_on_signals() as stop:
        try:
            yield stop
        except BaseException as exc:
            if isinstance(exc, SystemExit) or not stop.requested:
                raise
            print(STOPPED_MESSAGE, file=sys.stderr, flush=True)
            raise SystemExit(stop.exit_status) from None
