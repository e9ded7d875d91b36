"""Halts of procedures and consumers (sinks): a halted one waits at its failing batch, across
restarts (``sstore_sys.halts``), until it is resumed (``Engine.resume``, ``sstore resume``).

A procedure halts in the executor (its ``on_error`` policy); a consumer halts itself on a
terminal error (``Engine.halt_consumer``). The procedures of a state file opened by another
program (``Engine.open_existing``) are halted in memory only, with ``FOREIGN`` as the reason.
"""

from __future__ import annotations

from sstore.base.errors import DeclarationError
from sstore.execution.runtime import Runtime
from sstore.storage import systables

FOREIGN = "declared by the program that owns this state file; only that program runs it"


def resume(rt: Runtime, procedure: str, foreign: bool) -> bool:
    """``Engine.resume``: delete the halt of ``procedure`` (or consumer) from the state file
    and from the scheduler; ``foreign``: the engine was opened by another program than the
    state file's, whose procedures stay halted here."""
    consumers_known = {c for holders in rt.ledger.holders.values() for c in holders}
    if procedure not in rt.graph.procedures and procedure not in consumers_known:
        raise DeclarationError(
            f"no procedure or consumer {procedure!r}; procedures: "
            f"{', '.join(sorted(rt.graph.procedures)) or 'none'}; consumers: "
            f"{', '.join(sorted(consumers_known)) or 'none'}")
    with rt.lock:
        cleared = systables.clear_halt(rt.con, procedure)
        was = rt.scheduler.halted.pop(procedure, None)
        if foreign and procedure in rt.graph.procedures:
            rt.scheduler.halted[procedure] = FOREIGN  # its program runs it, not this one
            was = None
    return cleared or was is not None


def halt_consumer(rt: Runtime, consumer: str, batch_id: int, message: str) -> None:
    """``Engine.halt_consumer``: the error and the halt, in one transaction."""
    with rt.lock:
        rt.con.begin()
        try:
            systables.record_error(rt.con, consumer, batch_id, "halt", message)
            systables.record_halt(rt.con, consumer, batch_id, message)
            rt.con.commit()
        except BaseException:
            rt.con.rollback()
            raise


def consumer_halt(rt: Runtime, consumer: str) -> str | None:
    """Why ``consumer`` is halted ("batch N: error"), or None."""
    with rt.lock:
        halt = systables.load_halts(rt.con).get(consumer)
    return None if halt is None else systables.halt_text(*halt)
