"""Cutting a transaction execution (TE) short: because the process is stopping, or because the
procedure ran past its timeout.

Why a module of its own: a TE spends its time either inside DuckDB (a statement, which only
``con.interrupt()`` from another thread can end) or in the procedure's Python code (which only
an exception raised in its own thread can end). Stops and timeouts need both, and both must
never cut into the COMMIT: a TE either commits whole or rolls back whole. So every TE runs
inside a window that the executor opens and closes, and interruptions happen only inside it.

Protocol of one TE (the executor calls these; ``Interrupts`` is one per engine):

1. ``arm(con, timeout)`` right after BEGIN: the TE is interruptible from now on; with a
   timeout, the watchdog thread is told its deadline.
2. ``check()``: raises at once when a stop was requested before the TE began.
3. ``procedure_code()`` (a context manager) around the call of the procedure: only inside it
   may an interruption raise an exception in the TE's thread (``PyThreadState_SetAsyncExc``:
   that is how a ``while True:`` loop in Python ends). On the way out an exception that was
   sent but not yet raised is withdrawn.
4. ``disarm()`` just before COMMIT: after it nothing interrupts the TE (a ``con.interrupt()``
   on an idle connection does nothing, so none is left pending for the COMMIT). If the TE was
   interrupted meanwhile, ``disarm`` raises and the executor rolls back: a TE past its
   deadline never commits, even if the procedure swallowed the exception.
5. On any exception the executor calls ``disarm(quiet=True)``, which returns why the TE was
   interrupted (None: it failed on its own), and rolls back.

An interruption (``_interrupt``): under the lock, if a TE is armed and not yet interrupted,
record the reason, ``con.interrupt()`` the statement in flight, and, when the TE is in the
procedure's code, send the exception to its thread.

Limits: Python code blocked in a C call other than DuckDB's (``time.sleep``, a socket read)
gets the exception when that call returns; a procedure that catches ``BaseException`` and
loops on cannot be stopped by any means short of ending the process (its TE still never
commits).
"""

from __future__ import annotations

import ctypes
import enum
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import duckdb

from sstore.base.errors import TerminalError


class Stopped(BaseException):
    """The engine was asked to stop; the transaction in flight rolled back (or had committed).

    Not an ``SStoreError`` on purpose: a stop is not an error. It derives from
    ``BaseException`` (as ``KeyboardInterrupt`` does) so that ``except Exception`` in a
    procedure or a library on the way does not swallow it. Nothing is recorded: no error row,
    no halt; running again resumes after the last commit.
    """


class TimedOut(TerminalError):
    """A transaction execution ran past its procedure's ``timeout`` and was interrupted."""

    def __init__(self, procedure: str, batch_id: int, seconds: float) -> None:
        super().__init__(f"procedure {procedure!r} timed out after {seconds:g} s on batch "
                         f"{batch_id} (interrupted and rolled back)")
        self.procedure = procedure
        self.batch_id = batch_id
        self.seconds = seconds


class Reason(enum.Enum):
    STOP = "stop"
    TIMEOUT = "timeout"


class _Interrupted(BaseException):
    """Sent into the TE's thread to end the procedure's Python code; never leaves the
    executor (which turns it into ``Stopped`` or ``TimedOut``)."""


#: Set while the whole process is stopping (``sstore.execution.stopping``): every engine, also one
#: opened after the signal, refuses to start transaction executions.
PROCESS_STOP = threading.Event()
_live: weakref.WeakSet[Interrupts] = weakref.WeakSet()


def stop_all() -> None:
    """The process is stopping: every engine's TE in flight is interrupted, none starts."""
    PROCESS_STOP.set()
    for interrupts in list(_live):
        interrupts.request_stop()


@dataclass
class _Armed:
    con: duckdb.DuckDBPyConnection
    thread: int
    deadline: float | None
    reason: Reason | None = None
    in_code: bool = False
    sent: bool = False


class Interrupts:
    """Interruptions of one engine's transaction executions (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._armed: _Armed | None = None
        self._last_reason: Reason | None = None
        self._watchdog: threading.Thread | None = None
        self._closed = False
        self.stop_requested = threading.Event()
        _live.add(self)

    def stopping(self) -> bool:
        return self.stop_requested.is_set() or PROCESS_STOP.is_set()

    @property
    def closed(self) -> bool:
        """The engine closed (an ingest waiting under backpressure gives up)."""
        return self._closed

    def request_stop(self) -> None:
        """From any thread: no TE starts any more, the one in flight is interrupted."""
        self.stop_requested.set()
        with self._lock:
            self._interrupt(Reason.STOP)

    # -- the executor's side (steps 1-5) -------------------------------------------------------
    def arm(self, con: duckdb.DuckDBPyConnection, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._armed = _Armed(con, threading.get_ident(), deadline)
            self._last_reason = None
            if deadline is not None:
                self._start_watchdog()
                self._wake.notify()

    def check(self) -> None:
        """Step 2: raise if a stop was requested before the TE began."""
        if self.stopping():
            with self._lock:
                self._interrupt(Reason.STOP)
        armed = self._armed
        if armed is not None and armed.reason is not None:
            raise _Interrupted()

    @contextmanager
    def procedure_code(self) -> Iterator[None]:
        """Step 3: the procedure's own code runs inside; interruptions may raise there."""
        armed = self._armed
        assert armed is not None, "arm() first"
        with self._lock:
            if armed.reason is not None:
                raise _Interrupted()
            armed.in_code = True
        try:
            yield
        finally:
            with self._lock:
                armed.in_code = False
                withdraw = armed.sent
            if withdraw:
                _withdraw()  # in this thread: the one the exception was sent to

    def disarm(self, *, quiet: bool = False) -> Reason | None:
        """Steps 4 and 5: the TE is no longer interruptible. Raises ``_Interrupted`` if it was
        interrupted (unless ``quiet``); returns the reason (None: it was not)."""
        with self._lock:
            if self._armed is not None:
                self._last_reason = self._armed.reason
                self._armed = None
                self._wake.notify()
            reason = self._last_reason
        if reason is not None and not quiet:
            raise _Interrupted()
        return reason

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify()
        _live.discard(self)

    # -- inside ----------------------------------------------------------------------------------
    def _interrupt(self, reason: Reason) -> None:
        """Caller holds the lock."""
        armed = self._armed
        if armed is None or armed.reason is not None:
            return
        armed.reason = reason
        armed.con.interrupt()  # ends the statement in flight; a no-op between statements
        if armed.in_code:
            _send(armed.thread, _Interrupted)
            armed.sent = True

    def _start_watchdog(self) -> None:
        """Caller holds the lock."""
        if self._watchdog is None or not self._watchdog.is_alive():
            self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                              name="sstore-te-watchdog")
            self._watchdog.start()

    def _watch(self) -> None:
        """Interrupt the armed TE when its deadline passes."""
        with self._wake:
            while not self._closed:
                armed = self._armed
                if armed is None or armed.deadline is None or armed.reason is not None:
                    self._wake.wait()
                    continue
                remaining = armed.deadline - time.monotonic()
                if remaining > 0:
                    self._wake.wait(remaining)
                    continue
                self._interrupt(Reason.TIMEOUT)


class _Withdrawn(BaseException):
    """Raised in a thread only to consume an interruption that arrived too late."""


def _withdraw() -> None:
    """Consume, in the current thread, an exception sent to it that has not been raised yet.

    Why not ``PyThreadState_SetAsyncExc(id, NULL)``: CPython 3.11 then still flags the whole
    interpreter as having an asynchronous exception pending, and only raising one clears that
    flag. Left set, every thread takes the interpreter's slow path at each check from then on,
    and code run under a profiler (``cProfile``) spins forever at its next call (seen: the
    engine benchmark's profile hung after a stopped ``Engine.run``). So the pending exception is
    replaced by ``_Withdrawn`` and raised and caught right here, which clears the flag."""
    _send(threading.get_ident(), _Withdrawn)
    try:
        for _ in range(1000):  # the loop's backward jumps let the pending exception in
            pass
    except _Withdrawn:
        return
    raise AssertionError("an exception sent to this thread was not raised")


def _send(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in thread ``thread_id`` at its next Python instruction (None: withdraw an
    exception sent before and not raised yet)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None)


def is_interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is what an interruption raised: ours (sent into the thread, or DuckDB's
    ``InterruptException``), or Ctrl-C reaching DuckDB without a handler installed (DuckDB then
    raises ``RuntimeError('Query interrupted')``, or an error naming the KeyboardInterrupt)."""
    if isinstance(exc, (_Interrupted, KeyboardInterrupt, duckdb.InterruptException)):
        return True
    text = str(exc)
    return ((isinstance(exc, RuntimeError) and text == "Query interrupted")
            or (isinstance(exc, duckdb.Error) and "KeyboardInterrupt" in text))
