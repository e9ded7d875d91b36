"""Errors of the cast operators, in sstore's terminal/transient hierarchy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sstore.base.errors import TerminalError, TransientError

if TYPE_CHECKING:
    from migrators.delivery import SinkKey, Watermark


class PostgresUnavailable(TransientError):
    """PostgreSQL did not answer, or dropped the connection (retried with backoff)."""


class IncompatibleSchemaError(TerminalError):
    """The target table exists with columns that cannot take the source's rows."""


class UnsupportedTypeError(TerminalError):
    """A column type that has no documented mapping to the target engine."""


class MigrationError(TerminalError):
    """A cast failed for a reason that retrying will not fix."""


class ResetRefused(TerminalError):
    """Forgetting what a target was given (``sstore migrate --reset``,
    ``StreamToPostgres.reset``) would make the next delivery write rows a second time over
    the ones the target holds; nothing was forgotten."""


class LateTiesError(MigrationError):
    """An incremental append by ``since`` found rows at the source that tie with the newest
    ``since`` already copied and came after that copy: an append cannot take them without
    taking the others twice (both directions: ``table_to_postgres``, ``postgres_to_engine``)."""

    def __init__(self, copy: str, since: str, newest: object, count: int) -> None:
        super().__init__(
            f"{copy}: {count} row(s) with {since} = {newest!r} (the newest value already "
            f"copied) came after the last copy, and an append by {since!r} cannot take them "
            f"without taking the others twice; use a {since!r} whose values are unique, or "
            f"mode='merge' with a key")


# ------------------------------------------------ the delivery protocol's (``migrators.delivery``)
class TargetBehind(TerminalError):
    """The target's watermark is below what the writer planned from: it lacks batches the
    writer thought it had (a target dropped or emptied by hand). Nothing was written; plan
    again from ``watermark``."""

    def __init__(self, key: SinkKey, watermark: Watermark, expected: int) -> None:
        how = "emptied" if watermark.emptied else "dropped or recreated"
        why = (f"{key.target} was {how} since batch {watermark.previous} was delivered"
               if watermark.reset and watermark.previous > 0 else
               f"{key.target} was {how} again, its watermark had started over already"
               if watermark.reset else f"its watermark is at {watermark.batch_id}")
        super().__init__(f"{key}: the target lacks batches after {watermark.batch_id} that the "
                         f"writer expected it to have up to {expected} ({why})")
        self.key = key
        self.watermark = watermark
        self.expected = expected


class TargetClaimedError(TerminalError):
    """Another source's live watermark already claims this stream's batches in this target."""


class TargetReplacedError(TerminalError):
    """The table under the target's name is not the one the watermark was written for (it was
    rebuilt or restored by hand) and it holds rows: which of the stream's batches they are
    cannot be known, so nothing is delivered (and no query counts them) until it is emptied
    or dropped."""


class FencedError(TerminalError):
    """A newer writer of the same (source, stream, target) claimed the watermark since this
    one did (a second process delivering the same stream, a restored copy of the state file
    still running): this writer's delivery wrote nothing, and none of its deliveries will."""


class TargetMissingError(TerminalError):
    """The target table does not exist and this writer does not create it."""


class TargetNamesConflictError(TerminalError):
    """Two watermark rows of one (source, stream) were both written for the table now under
    the target's name, under two spellings of it: which one counts the batches the table
    holds cannot be known, so neither is used, merged or changed."""
