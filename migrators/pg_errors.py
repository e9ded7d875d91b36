"""Which PostgreSQL failures are worth retrying: a declarative table, registered with the one
retry helper (``sstore.retry``) when the migrators load.

A server's errors carry a SQLSTATE; its class (the first two characters) mostly decides. A
failure to connect carries none, so the server's message decides there. Everything not listed
as transient is terminal: a protocol violation during binary COPY (a column type that does not
match the encoded rows), a constraint, a missing table or database will fail the same way on
every try.
"""

from __future__ import annotations

import psycopg

from sstore.retry import Kind, register_rule

#: SQLSTATEs (or their two-character classes) that may succeed when tried again.
TRANSIENT_SQLSTATES: dict[str, str] = {
    "08": "connection exception (lost, refused, reset)",
    "40001": "serialization failure",
    "40P01": "deadlock detected",
    "53": "insufficient resources (disk full, out of memory, too many connections)",
    "55P03": "lock not available",
    "57P01": "admin shutdown (the backend was terminated)",
    "57P02": "crash shutdown",
    "57P03": "cannot connect now (starting up or shutting down)",
    "58000": "system error",
    "58030": "I/O error",
}

#: SQLSTATEs inside a transient class that are not transient.
TERMINAL_SQLSTATES: dict[str, str] = {
    "08P01": "protocol violation (e.g. binary COPY rows that do not match the column types)",
}

#: Connection failures have no SQLSTATE: these words in the message make them terminal.
TERMINAL_CONNECT_MESSAGES: tuple[str, ...] = (
    "does not exist",                      # database or role
    "password authentication failed",
    "no pg_hba.conf entry",
    "invalid connection option",
    "invalid integer value",
    "invalid sslmode value",
    "could not translate host name",       # a typo in the host; DNS here is not flaky
)


def classify(exc: BaseException) -> Kind | None:
    """``sstore.retry`` rule for psycopg errors (None: not a psycopg error)."""
    if not isinstance(exc, psycopg.Error):
        return None
    state = exc.sqlstate
    if state:
        if state in TERMINAL_SQLSTATES:
            return Kind.TERMINAL
        if state in TRANSIENT_SQLSTATES or state[:2] in TRANSIENT_SQLSTATES:
            return Kind.TRANSIENT
        return Kind.TERMINAL
    if isinstance(exc, psycopg.OperationalError):
        text = str(exc)
        if any(words in text for words in TERMINAL_CONNECT_MESSAGES):
            return Kind.TERMINAL
        return Kind.TRANSIENT  # refused, reset, timed out, server closed the connection
    if isinstance(exc, psycopg.InterfaceError):
        return Kind.TRANSIENT  # the connection object is closed or broken
    return Kind.TERMINAL


register_rule(classify)
