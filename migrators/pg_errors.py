"""Which PostgreSQL failures are worth retrying: a declarative table, registered with the one
retry helper (``sstore.base.retry``) when the migrators load, and used for every client we have
(psycopg, ADBC, and Spark's JDBC driver through ``classify_sqlstate``).

A server's errors carry a SQLSTATE; its class (the first two characters) mostly decides. A
failure to connect carries none, so the server's message decides there. Everything not listed
as transient is terminal: a protocol violation during binary COPY (a column type that does not
match the encoded rows), a constraint, a missing table or database will fail the same way on
every try.
"""

from __future__ import annotations

import adbc_driver_manager as adbc
import psycopg

from sstore.base.retry import Kind, register_rule

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

#: A unique violation (23505) on one of these system catalog indexes is two sessions running
#: ``CREATE SCHEMA/TABLE ... IF NOT EXISTS`` for the same name at once (sinks attached together
#: into a new schema): the loser fails instead of finding the object, and trying again finds it.
CATALOG_RACES: dict[str, str] = {
    "pg_namespace_nspname_index": "CREATE SCHEMA IF NOT EXISTS raced another session's",
    "pg_class_relname_nsp_index": "CREATE TABLE IF NOT EXISTS raced another session's",
    "pg_type_typname_nsp_index": "CREATE TABLE IF NOT EXISTS raced another session's (its "
                                 "row type)",
}

#: Connection failures have no SQLSTATE: these words in the message make them terminal.
TERMINAL_CONNECT_MESSAGES: tuple[str, ...] = (
    "does not exist",                      # database or role
    "password authentication failed",
    "no password supplied",                # a server that wants one (waiting brings none)
    "no pg_hba.conf entry",
    "invalid connection option",
    "invalid integer value",
    "invalid sslmode value",
    "could not translate host name",       # a typo in the host (libpq's lookup, ADBC)
    "Name or service not known",           # the same from psycopg's own lookup (EAI_NONAME);
)                                          # "Temporary failure in name resolution" stays transient


def classify_sqlstate(state: str) -> Kind:
    """The kind of a PostgreSQL error by its SQLSTATE (any client: psycopg, ADBC, JDBC)."""
    if state in TERMINAL_SQLSTATES:
        return Kind.TERMINAL
    if state in TRANSIENT_SQLSTATES or state[:2] in TRANSIENT_SQLSTATES:
        return Kind.TRANSIENT
    return Kind.TERMINAL


def classify_connect_failure(message: str) -> Kind:
    """The kind of a failure to connect, which carries no SQLSTATE, by libpq's message."""
    if any(words in message for words in TERMINAL_CONNECT_MESSAGES):
        return Kind.TERMINAL
    return Kind.TRANSIENT  # refused, reset, timed out, server closed the connection


def classify(exc: BaseException) -> Kind | None:
    """``sstore.base.retry`` rule for psycopg's and ADBC's errors (None: neither)."""
    if isinstance(exc, psycopg.Error):
        if exc.sqlstate == "23505" and exc.diag.constraint_name in CATALOG_RACES:
            return Kind.TRANSIENT
        if exc.sqlstate:
            return classify_sqlstate(exc.sqlstate)
        if isinstance(exc, psycopg.OperationalError):
            return classify_connect_failure(str(exc))
        if isinstance(exc, psycopg.InterfaceError):
            return Kind.TRANSIENT  # the connection object is closed or broken
        return Kind.TERMINAL
    if isinstance(exc, adbc.Error):
        state = getattr(exc, "sqlstate", None)
        if state:
            return classify_sqlstate(str(state))
        if isinstance(exc, adbc.OperationalError):
            return classify_connect_failure(str(exc))
        return Kind.TERMINAL
    return None


register_rule(classify)
