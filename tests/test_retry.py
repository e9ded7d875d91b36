"""The one retry helper: terminal failures are raised at once, transient ones retried."""

from __future__ import annotations

import threading
import time

import duckdb
import psycopg
import pytest

from migrators.errors import MigrationError, PostgresUnavailable
from migrators.postgres import Session, connect
from sstore.errors import DeclarationError, TransientError
from sstore.retry import GaveUp, Kind, RetryPolicy, call, kind_of

FAST = RetryPolicy(attempts=3, first_delay=0.01, max_delay=0.02)


def test_classification_table() -> None:
    assert kind_of(TransientError("x")) is Kind.TRANSIENT
    assert kind_of(DeclarationError("x")) is Kind.TERMINAL
    assert kind_of(duckdb.TransactionException("conflict")) is Kind.TRANSIENT
    assert kind_of(duckdb.ConstraintException("not null")) is Kind.TERMINAL
    assert kind_of(ConnectionResetError()) is Kind.TRANSIENT
    assert kind_of(ValueError("bug")) is Kind.TERMINAL  # unknown errors are terminal
    assert kind_of(psycopg.errors.AdminShutdown("terminated")) is Kind.TRANSIENT
    assert kind_of(psycopg.errors.SerializationFailure("x")) is Kind.TRANSIENT
    assert kind_of(psycopg.errors.ProtocolViolation("insufficient data")) is Kind.TERMINAL
    assert kind_of(psycopg.errors.UndefinedTable("x")) is Kind.TERMINAL


def test_terminal_errors_are_not_retried() -> None:
    tries = []

    def fail() -> None:
        tries.append(1)
        raise DeclarationError("wrong")

    with pytest.raises(DeclarationError):
        call(fail, RetryPolicy(attempts=5, first_delay=0.01), "fail")
    assert len(tries) == 1


def test_transient_errors_are_retried_then_given_up() -> None:
    tries = []

    def flaky() -> int:
        tries.append(1)
        if len(tries) < 3:
            raise TransientError("later")
        return 7

    policy = RetryPolicy(attempts=5, first_delay=0.01, max_delay=0.02)
    assert call(flaky, policy, "flaky") == 7
    assert policy.retries_done == 2
    with pytest.raises(GaveUp, match="gave up after 3 attempts") as info:
        call(lambda: (_ for _ in ()).throw(TransientError("down")), FAST, "down")
    assert isinstance(info.value, TransientError)


def test_stop_event_ends_an_unlimited_retry() -> None:
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    began = time.monotonic()
    with pytest.raises(GaveUp):
        call(lambda: (_ for _ in ()).throw(TransientError("down")),
             RetryPolicy(attempts=None, first_delay=0.05, max_delay=0.1), "forever", stop=stop)
    assert time.monotonic() - began < 2


def test_a_database_that_does_not_exist_fails_at_once(pg_url: str) -> None:
    url = pg_url.rsplit("/", 1)[0] + "/sstore_no_such_database"
    began = time.monotonic()
    with pytest.raises(MigrationError, match="does not exist"):
        Session(url, RetryPolicy(attempts=8, first_delay=1.0)).run(lambda con: 1, "probe")
    assert time.monotonic() - began < 2  # not 16 s of retries


def test_an_unreachable_server_is_transient() -> None:
    with pytest.raises(PostgresUnavailable, match="unreachable"):
        connect("postgresql://postgres@127.0.0.1:1/postgres")
    with pytest.raises(PostgresUnavailable, match="gave up after 2 attempts"):
        Session("postgresql://postgres@127.0.0.1:1/postgres",
                RetryPolicy(attempts=2, first_delay=0.01)).run(lambda con: 1, "probe")
