"""Errors of the cast operators, in sstore's terminal/transient hierarchy."""

from __future__ import annotations

from sstore.errors import TerminalError, TransientError


class PostgresUnavailable(TransientError):
    """PostgreSQL did not answer, or dropped the connection (retried with backoff)."""


class IncompatibleSchemaError(TerminalError):
    """The target table exists with columns that cannot take the source's rows."""


class UnsupportedTypeError(TerminalError):
    """A column type that has no documented mapping to the target engine."""


class MigrationError(TerminalError):
    """A cast failed for a reason that retrying will not fix."""
