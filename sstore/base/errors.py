"""One root exception, split into terminal and transient failures.

Retry loops in sstore act on this distinction only: a ``TransientError`` may succeed when tried
again (a lost connection, a write conflict), a ``TerminalError`` never will (bad input, a bug in a
stored procedure, a schema mismatch). Every error the engine raises on purpose derives from
``SStoreError`` so callers can catch the whole family with one clause.
"""

from __future__ import annotations

from typing import Any


class SStoreError(Exception):
    """Root of every error sstore raises on purpose."""


class TerminalError(SStoreError):
    """Retrying will not help: the input, the code or the declaration is wrong."""


class TransientError(SStoreError):
    """Retrying later may succeed (conflicts, unreachable services)."""


class DeclarationError(TerminalError):
    """A stream, table, window or procedure declaration is invalid or conflicts with another."""


class SchemaError(TerminalError):
    """Rows do not fit the declared schema of a stream (unknown column, wrong type, ...)."""


class UnknownStreamError(DeclarationError):
    """A name was used as a stream but no stream or window of that name is declared."""


class OutOfOrderBatchError(TerminalError):
    """A batch-id lower than the last one ingested on the stream, and never ingested before."""


class BatchIdTakenError(OutOfOrderBatchError):
    """A client sent a batch under an id that a dead-letter replay took for the replayed rows
    (``sstore.dead_letters.replay`` ingests them as the next batch). Taken as a re-send it
    would be a no-op and the client's rows would be lost without a word; nothing was
    ingested: send the batch again under an id above the stream's last one."""


class ResendMismatchError(TerminalError):
    """A batch was sent under a batch-id that its border stream had already ingested, but
    with other rows than the first time (another row count, or the same count and another
    fingerprint, ``sstore.base.fingerprint``). An identical re-send is a no-op, which is what makes
    re-sends exactly once; this one was not a re-send, and taking it for one would drop its
    rows without a word. Nothing was ingested; the batch ingested first stays as it was.

    ``stream`` and ``batch_id`` name the batch; ``ingested_rows`` / ``sent_rows`` are the
    two row counts (equal when only the values differ)."""

    def __init__(self, stream: str, batch_id: int, ingested_rows: int, sent_rows: int,
                 last: int) -> None:
        if ingested_rows != sent_rows:
            what = (f"it was ingested with {ingested_rows} rows and is re-sent with "
                    f"{sent_rows}")
        else:
            what = (f"it was ingested with {ingested_rows} rows and is re-sent with as many "
                    f"rows but other values or another row order")
        super().__init__(
            f"stream {stream!r}: batch-id {batch_id} was already ingested with other rows: "
            f"{what}. A re-send must carry exactly the rows of the first send (then it is a "
            f"no-op); this batch was NOT ingested and batch {batch_id} stays as first "
            f"ingested. An ingested batch cannot be replaced: if these rows are new (a "
            f"corrected file, another chunking, another source reusing ids), send what is "
            f"not already in batch {batch_id} under a batch-id above {last} (or without one); "
            f"if they are the same rows in another order, send them in the first order or "
            f"not at all")
        self.stream = stream
        self.batch_id = batch_id
        self.ingested_rows = ingested_rows
        self.sent_rows = sent_rows


class ProcedureError(TerminalError):
    """A stored procedure raised; the transaction execution was rolled back.

    ``procedure`` and ``batch_id`` say which transaction execution failed; ``__cause__`` holds the
    original exception.
    """

    def __init__(self, procedure: str, batch_id: int, message: str) -> None:
        super().__init__(f"procedure {procedure!r} failed on batch {batch_id}: {message}")
        self.procedure = procedure
        self.batch_id = batch_id
        self.message = message


class TransactionStateError(TerminalError):
    """A transaction object was used in a state that does not allow the operation."""


class InputLogError(TerminalError):
    """The input log of a weak-durability engine is unreadable beyond a torn tail."""


class NondeterministicError(TerminalError):
    """Weak durability refuses a statement that would write other values when replayed
    (``random()``, ``now()``...: ``sstore.base.volatile``)."""


class ProgramChangedError(DeclarationError):
    """Weak durability: the input log was written by a program this one changed on purpose
    (``retire``); only the program that wrote the log can replay it
    (``sstore.execution.recovery``)."""


class ReplayMismatchError(InputLogError):
    """Weak durability's replay did not do what the logged transaction did live (its digest,
    ``sstore.base.digest``, differs): the restart stops rather than go on from another state."""


class GapError(TerminalError):
    """A consumer would start after batches that garbage collection already removed.

    ``first``..``last`` is the range of batch-ids it would never see. Declare consumers with the
    dataflow (``Engine.consumer``) so their batches are kept from the first one, or accept the
    gap on purpose (``accept_gap=True``, ``sstore migrate --accept-gap``): it is then recorded.
    """

    def __init__(self, stream: str, consumer: str, first: int, last: int, *,
                 why: str | None = None) -> None:
        """``why``: what the consumer knows of how it came to lack them (a sink whose target
        lost batches it had delivered); without it, the two ways a gap arises."""
        advice = ("The engine cannot deliver them again: restore their rows into the target, "
                  "or accept the gap on purpose" if why else
                  "Declare the consumer with the dataflow (Engine.consumer) so the engine "
                  "keeps its batches, or accept the gap on purpose")
        why = why or ("they were collected before this consumer existed, or after it "
                      "acknowledged them to a target that has since lost them")
        super().__init__(
            f"{consumer} would start after a gap: batches {first}..{last} of stream {stream!r} "
            f"were already removed by garbage collection ({why}). {advice} (accept_gap=True, "
            f"sstore migrate --accept-gap); an accepted gap is recorded and shown by sstore "
            f"status")
        self.stream = stream
        self.consumer = consumer
        self.first = first
        self.last = last


class ChainedBatchError(TerminalError):
    """The newest batch of a stream was never materialized: the SQL procedure that wrote it
    ran chained into its reader's statement (``sstore.dataflow.fusion``). Read the chain's last
    output, or declare the engine with ``chain_sql=False``."""


class BackpressureError(SStoreError):
    """An ingest was refused because a reader of the stream lags past its bound
    (``sstore.execution.backpressure``). The batch was NOT ingested and nothing was written: send
    the same batch again (same ``batch_id``) once the reader has caught up.

    ``stream`` is the stream the ingest was for; ``consumers`` the readers past their bound
    (``sstore.execution.backpressure.Pressure``: name, kind, lag, bound, halt); ``waited`` the
    seconds the ingest waited before giving up (0 when it was refused at once)."""

    def __init__(self, message: str, stream: str, consumers: list[Any], waited: float) -> None:
        super().__init__(message)
        self.stream = stream
        self.consumers = consumers
        self.waited = waited


def _lagging(consumers: list[Any]) -> str:
    parts = []
    for p in consumers:
        bound = " and ".join(
            b for b in ((f"{p.bound_batches} batches" if p.bound_batches is not None else ""),
                        (f"{p.bound_bytes} bytes" if p.bound_bytes is not None else "")) if b)
        why = f", halted at {p.halted}" if p.halted else ""
        parts.append(f"{p.kind} {p.consumer!r} ({p.lag_batches} batches, {p.lag_rows} rows, "
                     f"~{p.lag_bytes} bytes behind; bound {bound or 'none'}{why})")
    return "; ".join(parts)


class IngestTimeoutError(BackpressureError, TransientError):
    """Ingest waited ``Engine.backpressure.timeout`` seconds for a running reader (a sink
    thread, the engine's runner) to get back under its bound, and it did not. Transient: the
    reader is alive, only slow (a locked or overloaded target); retrying later may succeed."""

    def __init__(self, stream: str, consumers: list[Any], waited: float) -> None:
        super().__init__(
            f"ingest into stream {stream!r} waited {waited:.1f} s for readers past their "
            f"backpressure bound: {_lagging(consumers)}. The batch was not ingested; send it "
            f"again once they catch up (sstore status shows their lag), or raise the bound or "
            f"the timeout (docs/operations.md, Backpressure)", stream, consumers, waited)


class ConsumerStalledError(BackpressureError, TerminalError):
    """A reader past its bound cannot make progress while this thread waits: it is halted,
    or nothing in this process runs it (a declared consumer with no running sink, procedures
    while no other thread runs the engine). Waiting would only hang, so the ingest is refused
    at once. Terminal: retrying as is never helps; run the reader (``run_until_idle``,
    ``StreamToPostgres.attach``/``run_once``), resume it, or drop it, then send the batch
    again."""

    def __init__(self, stream: str, consumers: list[Any], waited: float) -> None:
        super().__init__(
            f"ingest into stream {stream!r} refused: readers past their backpressure bound "
            f"cannot progress while this ingest waits: {_lagging(consumers)}. The batch was "
            f"not ingested. Run them (Engine.run_until_idle for procedures, the sink's attach "
            f"or run_once for a sink), resume a halted one (sstore resume), or drop a consumer "
            f"nobody runs (sstore consumers drop), then send the batch again", stream,
            consumers, waited)
