"""Running the transaction executions (TEs) behind ``Engine.run_until_idle`` and ``Engine.run``:
one step (the next TE with the rest of its batch's group), steps until none is runnable, and
serving until a stop; garbage collection and checkpoints between batches.

The functions take the engine's runtime and settings explicitly (``group_commit``,
``gc_every``, ``gc_min_seconds``: ``Engine``'s attributes of those names).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sstore.execution import gc, group
from sstore.execution.executor import run_te
from sstore.execution.interrupts import Interrupts, Stopped
from sstore.execution.runtime import Runtime


def run_one(rt: Runtime, group_commit: bool, gc_every: int, gc_min_seconds: float,
            most: int | None = None) -> bool:
    """Run the next transaction execution, if any, with the ones of the same batch that
    follow it as one group commit (at most ``most`` in all). Caller holds the lock. Raises
    ``Stopped`` instead when a stop was requested (``interrupt``)."""
    if rt.interrupts.stopping():
        raise Stopped("stopped between transaction executions")
    nxt = rt.scheduler.next()
    if nxt is None:
        return False
    if group_commit:
        group.run_batch(rt, *nxt, limit=most)
    else:
        run_te(rt, *nxt)
    if not rt.replaying and gc.due(rt, gc_every, gc_min_seconds):
        following = rt.scheduler.next()
        if following is None or following[1] != nxt[1]:  # between batches, not inside one
            gc.collect(rt)
    if rt.input_log is not None and not rt.replaying and rt.input_log.pending_tes():
        rt.input_log.append_tes(rt.te_seq)  # what these TEs did, for replay to check
    if rt.checkpoints is not None:
        rt.checkpoints.after_commit()
    return True


def run_until_idle(rt: Runtime, interrupts: Interrupts, group_commit: bool, gc_every: int,
                   gc_min_seconds: float, max_executions: int | None) -> int:
    """``Engine.run_until_idle``: ``run_one`` until none is runnable (or ``max_executions``
    ran), publishing each step's batches to the subscribers; return how many ran."""
    done = 0
    try:
        while max_executions is None or done < max_executions:
            with rt.lock:
                before = rt.te_seq
                most = None if max_executions is None else max_executions - done
                if not run_one(rt, group_commit, gc_every, gc_min_seconds, most):
                    break
                done += rt.te_seq - before
            rt.subscribers.publish(rt.take_outbox())
    except Stopped:
        interrupts.stop_requested.clear()
        rt.subscribers.publish(rt.take_outbox())  # what committed before the stop
        raise
    with rt.lock:
        if gc.due(rt, gc_every, gc_min_seconds):
            gc.collect(rt)
    return done


def run_until_stopped(rt: Runtime, interrupts: Interrupts, stop: threading.Event,
                      poll_seconds: float, run_until_idle: Callable[[], int],
                      interrupt: Callable[[], None]) -> None:
    """``Engine.run``: ``run_until_idle`` (the engine's, a runner) whenever batches arrive,
    tidying up when idle, until ``stop`` is set (a helper thread turns it into
    ``interrupt()``) or a stop is requested."""
    served = threading.Event()
    relay = threading.Thread(target=_relay_stop, args=(stop, served, poll_seconds, interrupt),
                             daemon=True, name="sstore-stop-relay")
    relay.start()
    try:
        while not stop.is_set():
            run_until_idle()
            with rt.lock:
                if rt.scheduler.next() is None and not rt.interrupts.stopping():
                    if rt.since_gc:
                        gc.collect(rt)  # idle: a good moment to tidy up
                    if rt.checkpoints is not None:
                        rt.checkpoints.when_idle()
                    rt.wakeup.wait(poll_seconds)
    except Stopped:
        pass  # asked to stop (``stop``, ``interrupt()``, a signal): serving ends
    finally:
        served.set()
        relay.join()
        interrupts.stop_requested.clear()


def request_stop(interrupts: Interrupts, rt: Runtime | None) -> None:
    """``Engine.interrupt``: request the stop, and wake an idle ``run`` if the lock is free."""
    interrupts.request_stop()
    if rt is not None and rt.wakeup.acquire(blocking=False):  # never wait for the lock
        try:
            rt.wakeup.notify_all()  # an idle ``run`` returns now, not after its poll
        finally:
            rt.wakeup.release()


def _relay_stop(stop: threading.Event, served: threading.Event, poll_seconds: float,
                interrupt: Callable[[], None]) -> None:
    """``run``'s helper: turn ``stop`` being set into ``interrupt()``."""
    while not served.is_set():
        if stop.wait(poll_seconds):
            if not served.is_set():
                interrupt()
            return
