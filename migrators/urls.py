"""PostgreSQL connection URLs: where they come from and how each client wants them.

Credentials come from the URL (or the environment that supplies it), never from code. The
default is ``SSTORE_POSTGRES_URL``, else the local server of the machine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qs, quote, unquote, urlsplit

from migrators.errors import MigrationError
from sstore.base.redact import mask_secrets

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

#: Seconds libpq waits for a server to answer a connection attempt when neither the URL's own
#: ``connect_timeout`` nor ``SSTORE_PG_CONNECT_TIMEOUT`` says otherwise.
DEFAULT_CONNECT_TIMEOUT = 5
CONNECT_TIMEOUT_ENV = "SSTORE_PG_CONNECT_TIMEOUT"


def default_url() -> str:
    return os.environ.get("SSTORE_POSTGRES_URL", DEFAULT_URL)


@dataclass(frozen=True)
class PgUrl:
    host: str
    port: int
    dbname: str
    user: str | None
    password: str | None = field(repr=False)  # a repr lands in logs and tracebacks
    #: libpq's ``passfile`` parameter: where the password is kept (the private server's URL
    #: names its password file instead of carrying the password)
    passfile: str | None = None

    @property
    def jdbc(self) -> str:
        """``jdbc:postgresql://host:port/db`` (user and password go in properties)."""
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.dbname}"

    def jdbc_properties(self) -> dict[str, str]:
        props = {"driver": "org.postgresql.Driver"}
        if self.user:
            props["user"] = self.user
        if self.password:
            props["password"] = self.password
        return props

    def redacted(self) -> str:
        """For messages and logs: the URL without its password (its password file, a path
        only its owner can read, is named: the URL still works for that owner)."""
        user = f"{self.user}@" if self.user else ""
        where = f"?passfile={quote(self.passfile, safe='/')}" if self.passfile else ""
        return f"postgresql://{user}{self.host}:{self.port}/{self.dbname}{where}"


def parse(url: str) -> PgUrl:
    """The parts of a ``postgresql://`` URL. A URL with a ``passfile`` and no password gets
    its password from that file (libpq's format, ``passfile_password``), so that clients
    which do not read password files (Spark's JDBC driver) are handed it too."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError("not a PostgreSQL URL (postgresql://user@host:port/db): "
                         f"{mask_secrets(repr(url))}")
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    dbname = unquote(parts.path.lstrip("/")) or "postgres"
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    passfile = parse_qs(parts.query).get("passfile", [None])[-1]
    if password is None and passfile:
        password = passfile_password(passfile, host, port, dbname, user or "postgres")
    return PgUrl(host, port, dbname, user, password, passfile)


def passfile_password(path: str, host: str, port: int, dbname: str, user: str) -> str | None:
    """The password libpq would take from password file ``path`` for this connection: the
    first line ``host:port:database:user:password`` that matches (``*`` matches anything,
    ``\\`` escapes ``:`` and ``\\``); None when no line matches or the file cannot be read
    (libpq then connects without one, and the server says what it wants)."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError:
        return None
    wanted = (host, str(port), dbname, user)
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = _passfile_fields(line)
        if len(fields) == 5 and all(f in ("*", w) for f, w in zip(fields[:4], wanted)):
            return fields[4]
    return None


def _passfile_fields(line: str) -> list[str]:
    fields: list[str] = []
    current: list[str] = []
    escaped = False
    for char in line:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ":" and len(fields) < 4:
            fields.append("".join(current))
            current = []
        else:
            current.append(char)
    fields.append("".join(current))
    return fields


def shown(url: str) -> str:
    """``url`` as messages show it: a ``postgresql://`` URL without its password
    (``PgUrl.redacted``), anything else (a libpq keyword string) with its password masked."""
    try:
        return parse(url).redacted()
    except ValueError:
        return mask_secrets(url)


def with_database(url: str, name: str) -> str:
    """``url`` naming the database ``name`` instead of its own, every other part as written.

    Not by cutting the text at its last slash: the query may hold paths (the private
    server's ``passfile=/.../postgres.pgpass``, ``host=/run/postgresql``), and the cut put the
    database inside the path, so the password file was lost ("no password supplied"). A
    libpq keyword string gets ``dbname=`` as its last keyword (the last one wins)."""
    if "://" not in url:
        return f"{url} dbname={name}"
    head, mark, query = url.partition("?")
    scheme, _sep, rest = head.partition("://")
    authority = rest.partition("/")[0]
    return f"{scheme}://{authority}/{quote(name, safe='')}{mark}{query}"


def with_connect_timeout(url: str) -> str:
    """``url`` with a ``connect_timeout`` for libpq, so that an address that never answers
    costs a bounded time per attempt: psycopg and ADBC alike (ADBC's libpq, left alone, waits
    for such an address forever, and a retry policy never gets its turn).

    The URL's own ``connect_timeout`` (libpq's standard parameter) is kept as written, even
    when it is invalid (libpq then says so); else ``SSTORE_PG_CONNECT_TIMEOUT``; else
    ``DEFAULT_CONNECT_TIMEOUT``. Read at each connection, so a changed environment applies.

    The parameter is appended to the text as it is, never by taking the URL apart and putting
    it back together: ``urlunsplit`` writes ``postgresql:///db?host=/run/postgresql`` (a Unix
    socket, no network location) as ``postgresql:/db?...``, which libpq refuses. A libpq
    keyword string (``host=... dbname=...``) gets ``connect_timeout=N`` as one more keyword.
    """
    if "://" not in url:  # keyword/value form
        if re.search(r"(^|\s)connect_timeout\s*=", url):
            return url
        return f"{url} connect_timeout={connect_timeout()}"
    base, hash_mark, fragment = url.partition("#")
    query = urlsplit(base).query
    if "connect_timeout" in parse_qs(query, keep_blank_values=True):
        return url
    joint = "" if base.endswith(("?", "&")) else "&" if query else "?"
    return f"{base}{joint}connect_timeout={connect_timeout()}{hash_mark}{fragment}"


def connect_timeout() -> int:
    """The connect timeout in seconds for URLs that do not carry one: the environment's, else
    the default. Only whole seconds from 1 up: libpq's 0 means wait forever, which is what
    this setting exists to prevent."""
    raw = os.environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_CONNECT_TIMEOUT
    if not raw.isdigit() or int(raw) < 1:
        raise MigrationError(f"{CONNECT_TIMEOUT_ENV} must be a whole number of seconds, at "
                             f"least 1, not {raw!r}")
    return int(raw)
