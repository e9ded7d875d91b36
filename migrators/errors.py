"""Errors of the cast operators, in sstore's terminal/transient hierarchy."""

from __future__ import annotations

from sstore.base.errors import TerminalError, TransientError


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
