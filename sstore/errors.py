"""One root exception, split into terminal and transient failures.

Retry loops in sstore act on this distinction only: a ``TransientError`` may succeed when tried
again (a lost connection, a write conflict), a ``TerminalError`` never will (bad input, a bug in a
stored procedure, a schema mismatch). Every error the engine raises on purpose derives from
``SStoreError`` so callers can catch the whole family with one clause.
"""

from __future__ import annotations


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


class GapError(TerminalError):
    """A consumer would start after batches that garbage collection already removed.

    ``first``..``last`` is the range of batch-ids it would never see. Declare consumers with the
    dataflow (``Engine.consumer``) so their batches are kept from the first one, or accept the
    gap on purpose (``accept_gap=True``, ``sstore migrate --accept-gap``): it is then recorded.
    """

    def __init__(self, stream: str, consumer: str, first: int, last: int) -> None:
        super().__init__(
            f"{consumer} would start after a gap: batches {first}..{last} of stream {stream!r} "
            f"were already removed by garbage collection (they were collected before this "
            f"consumer existed, or after it acknowledged them to a target that has since lost "
            f"them). Declare the consumer with the dataflow (Engine.consumer) so the engine "
            f"keeps its batches, or accept the gap on purpose (accept_gap=True, sstore migrate "
            f"--accept-gap); an accepted gap is recorded and shown by sstore status")
        self.stream = stream
        self.consumer = consumer
        self.first = first
        self.last = last
