"""PostgreSQL connection URLs: where they come from and how each client wants them.

Credentials come from the URL (or the environment that supplies it), never from code. The
default is ``SSTORE_POSTGRES_URL``, else the local server of the machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def default_url() -> str:
    return os.environ.get("SSTORE_POSTGRES_URL", DEFAULT_URL)


@dataclass(frozen=True)
class PgUrl:
    host: str
    port: int
    dbname: str
    user: str | None
    password: str | None

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
        """For messages and logs: the URL without its password."""
        user = f"{self.user}@" if self.user else ""
        return f"postgresql://{user}{self.host}:{self.port}/{self.dbname}"


def parse(url: str) -> PgUrl:
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL URL (postgresql://user@host:port/db): {url!r}")
    return PgUrl(parts.hostname or "127.0.0.1", parts.port or 5432,
                 unquote(parts.path.lstrip("/")) or "postgres",
                 unquote(parts.username) if parts.username else None,
                 unquote(parts.password) if parts.password else None)
