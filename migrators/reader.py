"""Read paths into PostgreSQL run as a role that can only read: privilege, not a list.

Why: a READ ONLY transaction stops INSERT and DDL, but not every function with side effects
(``lo_create``, ``pg_terminate_backend``, ``pg_logical_emit_message``, ``COPY ... TO`` a server
file inside a user's function, ...), and a denylist of such functions (``sstore.base.readonly``) has
a hole for every function it does not name, including the next release's. A role without the
privilege to write closes them all, whatever the function is called.

The reader role is ``sstore_reader`` (``SSTORE_POSTGRES_READER_ROLE`` names another one): a
member of ``pg_read_all_data`` (PostgreSQL 14+), nothing more. Every read path (``sstore
query`` and the polystore's PostgreSQL connector, ``read_postgres``/``cross_system_query``,
replicas, casts into the engine) reads through this module:

1. ``ensure(url)`` (once per process and server): the role exists, is no superuser, and the
   URL's user may ``SET ROLE`` to it. sstore creates the default role (``NOLOGIN``, member of
   ``pg_read_all_data``) and grants it to the URL's user when it may; a role named by the
   environment is never created. When it cannot, ``ReaderRoleError`` says what to run.
2. ``reader_url(url)``: the URL the read connects with. When the URL's password file has a
   line for the reader (the private server's does: ``migrators.private_auth``), the read
   **logs in as the reader**; else it logs in as the URL's user.
3. ``begin(execute)``: ``SET TRANSACTION READ ONLY`` then ``SET LOCAL ROLE`` to the reader, in
   the read's transaction, before the query.

What a user must know: logged in as the reader (2), nothing the query calls can write with
the reader's rights (a ``SECURITY DEFINER`` function runs with its owner's: whoever made one
and let PUBLIC call it chose that it may write for anyone), and the read is rolled back. Logged
in as a writer who switches role (3), a function already defined in the database could switch
back (``set_config('role', ...)`` checks the login user's rights, not the current role's): the
denylist refuses such calls by name in the query itself, but only a login as the reader closes
that door for functions written by others. For a server sstore did not start, give the
reader a login and a line in the URL's password file (docs/operations.md, Security).

Writes (sinks, migrations, casts into PostgreSQL, ``bdcast``) keep the URL's own user.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from migrators.urls import parse, passfile_password, shown
from sstore.base.errors import TerminalError
from sstore.base.sql import ident

ROLE_ENV = "SSTORE_POSTGRES_READER_ROLE"
DEFAULT_ROLE = "sstore_reader"

_ensured: set[tuple[str, int, str | None, str]] = set()
_lock = threading.Lock()


class ReaderRoleError(TerminalError):
    """The read-only role is missing, unusable or able to write; the message says the fix."""


def role() -> str:
    """The reader role's name: ``SSTORE_POSTGRES_READER_ROLE``, else ``sstore_reader``."""
    return os.environ.get(ROLE_ENV, "").strip() or DEFAULT_ROLE


def reader_url(url: str) -> str:
    """``url`` with the reader as its user when the URL's password file has the reader's
    password (the read then logs in as the reader); else ``url`` as it is."""
    if "://" not in url:
        return url
    found = parse(url)
    name = role()
    if not found.passfile or found.user == name or passfile_password(
            found.passfile, found.host, found.port, found.dbname, name) is None:
        return url
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]  # the writer's password goes, the file has the reader's
    return urlunsplit(parts._replace(netloc=f"{name}@{host}"))


def begin(execute: Callable[[str], Any]) -> None:
    """Make the open transaction a read as the reader: READ ONLY, then the reader's role."""
    execute("SET TRANSACTION READ ONLY")
    execute(f"SET LOCAL ROLE {ident(role())}")


def ensure(url: str) -> None:
    """Step 1 of the module docstring, once per process, server and login user."""
    found = parse(url) if "://" in url else None
    key = (found.host, found.port, found.user, role()) if found else ("", 0, url, role())
    with _lock:
        if key in _ensured:
            return
        _check(url)
        _ensured.add(key)


def _check(url: str) -> None:
    import psycopg

    from migrators.postgres import connect
    name = role()
    with connect(url) as con:
        con.autocommit = True
        row = con.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
        if row is None:
            if name != DEFAULT_ROLE:
                raise ReaderRoleError(
                    f"the reader role {name!r} ({ROLE_ENV}) does not exist on {shown(url)}; "
                    f"create it (CREATE ROLE {ident(name)} NOLOGIN; GRANT pg_read_all_data TO "
                    f"{ident(name)}) or unset {ROLE_ENV}")
            _create(con, url, name)
        elif row[0]:
            raise ReaderRoleError(f"the reader role {name!r} on {shown(url)} is a superuser, "
                                  "so it can write; sstore reads only as a role that cannot "
                                  f"(ALTER ROLE {ident(name)} NOSUPERUSER)")
        member = con.execute("SELECT pg_has_role(current_user, %s, 'MEMBER')",
                             (name,)).fetchone()
        if member and member[0]:
            return
        try:
            con.execute(f"GRANT {ident(name)} TO CURRENT_USER")
        except psycopg.Error as exc:
            raise ReaderRoleError(
                f"user {found_user(url)!r} may not read as the reader role {name!r} on "
                f"{shown(url)} ({_one_line(exc)}); as an administrator run: GRANT "
                f"{ident(name)} TO {ident(found_user(url))}") from None


def _create(con: Any, url: str, name: str) -> None:
    import psycopg
    try:
        with con.transaction():
            con.execute(f"CREATE ROLE {ident(name)} NOLOGIN")
            con.execute(f"GRANT pg_read_all_data TO {ident(name)}")
    except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
        return  # another process made it just now
    except psycopg.Error as exc:
        raise ReaderRoleError(
            f"sstore reads PostgreSQL only as a role that cannot write, and user "
            f"{found_user(url)!r} may not create one on {shown(url)} ({_one_line(exc)}). "
            f"As an administrator run: CREATE ROLE {ident(name)} NOLOGIN; GRANT "
            f"pg_read_all_data TO {ident(name)}; GRANT {ident(name)} TO "
            f"{ident(found_user(url))}; or name an existing read-only role in "
            f"{ROLE_ENV}") from None


def found_user(url: str) -> str:
    """The URL's login user (libpq's default, the OS user, is not guessed: 'postgres')."""
    return (parse(url).user if "://" in url else None) or "postgres"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
