"""PostgreSQL plumbing shared by the migrators: connections, retries, binary COPY from Arrow.

Retries act only on the terminal/transient distinction: an ``OperationalError`` (refused,
dropped, terminated by an administrator) is transient and retried with exponential backoff on a
fresh connection; anything else (a constraint, a type error, a missing table) is terminal and
raised at once. Every retry is logged and counted, so an operator sees what happened.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import psycopg
import pyarrow as pa
from pgpq import ArrowToPostgresBinaryEncoder

from migrators.errors import MigrationError, PostgresUnavailable
from migrators.urls import parse
from sstore.errors import TransientError
from sstore.sql import ident, qualified

log = logging.getLogger("sstore.migrators")

T = TypeVar("T")


@dataclass
class RetryPolicy:
    """How long to keep trying when PostgreSQL is away."""

    attempts: int = 8
    first_delay: float = 0.2
    max_delay: float = 5.0
    retries_done: int = field(default=0, compare=False)

    def delay(self, attempt: int) -> float:
        return min(self.max_delay, self.first_delay * 2 ** (attempt - 1))


def connect(url: str) -> psycopg.Connection:
    """A connection in explicit-transaction mode; unreachable servers become transient errors."""
    try:
        return psycopg.connect(url, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise PostgresUnavailable(f"PostgreSQL at {parse(url).redacted()} is unreachable: "
                                  f"{_first_line(exc)}") from exc


def with_retries(url: str, work: Callable[[psycopg.Connection], T], policy: RetryPolicy,
                 what: str) -> T:
    """Run ``work`` in its own connection; retry transient failures with backoff."""
    attempt = 0
    while True:
        attempt += 1
        try:
            with connect(url) as con:
                return work(con)
        except (PostgresUnavailable, psycopg.OperationalError, TransientError) as exc:
            if attempt >= policy.attempts:
                raise PostgresUnavailable(f"{what}: gave up after {attempt} attempts: "
                                          f"{_first_line(exc)}") from exc
            policy.retries_done += 1
            wait = policy.delay(attempt)
            log.warning("%s: transient failure (%s); retry %d/%d in %.1fs", what,
                        _first_line(exc), attempt, policy.attempts - 1, wait)
            time.sleep(wait)
        except psycopg.Error as exc:
            raise MigrationError(f"{what}: {_first_line(exc)}") from exc


def copy_arrow(cur: psycopg.Cursor, table: str, rows: pa.Table) -> int:
    """Binary COPY of an Arrow table into ``table`` (its columns by name, in its order)."""
    if rows.num_rows == 0:
        return 0
    encoder = ArrowToPostgresBinaryEncoder(rows.schema)
    columns = ", ".join(ident(c) for c in rows.column_names)
    with cur.copy(f"COPY {qualified(table)} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(encoder.write_header())
        for batch in rows.to_batches(max_chunksize=65536):
            copy.write(encoder.write_batch(batch))
        copy.write(encoder.finish())
    return rows.num_rows


def split_name(table: str) -> tuple[str, str]:
    """``schema.table`` -> (schema, table); a bare name is in ``public``."""
    schema, _, name = table.rpartition(".")
    return (schema or "public"), name


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
