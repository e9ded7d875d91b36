"""The one retry helper: terminal failures are raised at once, transient ones retried."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import duckdb
import psycopg
import pytest

from migrators.errors import MigrationError, PostgresUnavailable
from migrators.postgres import Session, connect
from migrators.postgres_to_engine import read_postgres
from migrators.urls import (
    CONNECT_TIMEOUT_ENV,
    DEFAULT_CONNECT_TIMEOUT,
    parse,
    with_connect_timeout,
    with_database,
)
from sstore.base.errors import DeclarationError, TransientError
from sstore.base.retry import GaveUp, Kind, RetryPolicy, call, kind_of
from sstore.polystore.connectors import PostgresConnector

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


def test_a_host_name_that_does_not_resolve_fails_at_once() -> None:
    """psycopg resolves host names itself ("failed to resolve host ...: Name or service not
    known"), not in libpq's words ("could not translate host name"): a typo in the host must
    still be terminal, not eight tries and 16 s of backoff. ``.invalid`` never resolves
    (RFC 2606), and the resolver answers that at once."""
    url = "postgresql://postgres@sstore-no-such-host.invalid:5432/postgres"
    began = time.monotonic()
    with pytest.raises(MigrationError, match="sstore-no-such-host.invalid"):
        Session(url, RetryPolicy(attempts=8, first_delay=1.0)).run(lambda con: 1, "probe")
    assert time.monotonic() - began < 2


def test_a_temporary_resolver_failure_stays_transient() -> None:
    from migrators.pg_errors import classify_connect_failure

    assert classify_connect_failure("failed to resolve host 'db': [Errno -3] Temporary "
                                    "failure in name resolution") is Kind.TRANSIENT
    assert classify_connect_failure("failed to resolve host 'db': [Errno -2] Name or "
                                    "service not known") is Kind.TERMINAL


def test_an_unreachable_server_is_transient() -> None:
    with pytest.raises(PostgresUnavailable, match="unreachable"):
        connect("postgresql://postgres@127.0.0.1:1/postgres")
    with pytest.raises(PostgresUnavailable, match="gave up after 2 attempts"):
        Session("postgresql://postgres@127.0.0.1:1/postgres",
                RetryPolicy(attempts=2, first_delay=0.01)).run(lambda con: 1, "probe")


# -- connect timeouts: a silent address (a real socket that listens and never answers, as a
# firewalled or hung server does) costs the URL's connect_timeout, else the environment's, else
# 5 s per attempt. psycopg waits at least 2 s whatever the setting (libpq's old floor).
@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose kernel completes the TCP handshake but nobody ever answers libpq. Closing
    it at the end resets the connections still waiting, so no client is left hanging."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


def timed_failure(fn: Callable[[], object], budget: float) -> tuple[BaseException, float]:
    """Run ``fn`` in a thread, expecting it to fail within ``budget`` seconds; return the
    error and the time it took (a client that hangs fails the test instead of hanging it)."""
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    began = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(budget)
    took = time.monotonic() - began
    assert not thread.is_alive(), f"still waiting after {budget} s"
    assert "error" in outcome, "connected to a silent address?"
    return outcome["error"], took


def test_the_urls_connect_timeout_wins(silent_port: int,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "30")  # the URL's own parameter is stronger
    url = f"postgresql://postgres@127.0.0.1:{silent_port}/postgres?connect_timeout=2"
    error, took = timed_failure(lambda: connect(url), budget=10)
    assert isinstance(error, PostgresUnavailable) and "timeout expired" in str(error)
    assert 1.5 <= took < 4, took  # 2 s, not the fixed 5 s of before nor the environment's 30


def test_the_environment_sets_the_connect_timeout_of_both_clients(
        silent_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"postgresql://postgres@127.0.0.1:{silent_port}/postgres"
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "2")
    error, took = timed_failure(lambda: connect(url), budget=10)  # psycopg
    assert isinstance(error, PostgresUnavailable) and 1.5 <= took < 4, (error, took)
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "1")
    # ADBC (the reads): before, no timeout at all, so a silent address hung the read forever
    error, took = timed_failure(lambda: read_postgres(
        url, "SELECT 1", policy=RetryPolicy(attempts=2, first_delay=0.01)), budget=10)
    assert isinstance(error, PostgresUnavailable), error
    assert "gave up after 2 attempts" in str(error) and "timeout expired" in str(error)
    assert 1.8 <= took < 4, took  # two attempts of 1 s


def test_the_polystores_reads_are_bounded_too(silent_port: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "1")
    connector = PostgresConnector("pg", f"postgresql://postgres@127.0.0.1:{silent_port}/postgres")
    error, took = timed_failure(lambda: connector.fetch("SELECT 1"), budget=10)
    assert isinstance(error, PostgresUnavailable) and "gave up after 3 attempts" in str(error)
    assert took < 6, took  # its fixed 3 attempts of 1 s and 0.6 s of waits; before: forever


def test_connect_timeout_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONNECT_TIMEOUT_ENV, raising=False)
    base = "postgresql://u@h:5432/db"
    assert with_connect_timeout(base) == f"{base}?connect_timeout={DEFAULT_CONNECT_TIMEOUT}"
    assert with_connect_timeout(f"{base}?sslmode=disable") == \
        f"{base}?sslmode=disable&connect_timeout={DEFAULT_CONNECT_TIMEOUT}"
    assert with_connect_timeout(f"{base}?connect_timeout=0") == f"{base}?connect_timeout=0"
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, " 12 ")
    assert with_connect_timeout(base) == f"{base}?connect_timeout=12"
    for bad in ("0", "-1", "1.5", "soon"):
        monkeypatch.setenv(CONNECT_TIMEOUT_ENV, bad)
        with pytest.raises(MigrationError, match=CONNECT_TIMEOUT_ENV):
            connect(base)  # refused before any connection attempt: a setting, not an outage


def test_the_timeout_is_added_to_the_text_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Appended, never by taking the URL apart: ``urlunsplit`` turned a Unix-socket URL
    (``postgresql:///db?host=/dir``, no network location) into ``postgresql:/db?...``, which
    libpq refuses; a keyword string gets one more keyword; a fragment stays last."""
    monkeypatch.delenv(CONNECT_TIMEOUT_ENV, raising=False)
    n = DEFAULT_CONNECT_TIMEOUT
    assert with_connect_timeout("postgresql:///db?host=/run/postgresql") == \
        f"postgresql:///db?host=/run/postgresql&connect_timeout={n}"
    assert with_connect_timeout("postgresql://h/db?") == f"postgresql://h/db?connect_timeout={n}"
    assert with_connect_timeout("postgresql://h/db#x") == f"postgresql://h/db?connect_timeout={n}#x"
    assert with_connect_timeout("host=h dbname=db") == f"host=h dbname=db connect_timeout={n}"
    assert with_connect_timeout("host=h connect_timeout=2") == "host=h connect_timeout=2"


def test_a_url_without_a_network_location_connects(pg_url: str) -> None:
    """``postgresql:///db?host=...`` (the form of a Unix-socket URL: the host in the query,
    none before the path), here with the test server's own host: psycopg and ADBC both
    connect with the timeout added (before, the URL rebuilt lost its ``//``)."""
    where = parse(pg_url)
    url = f"postgresql:///{where.dbname}?host={where.host}&port={where.port}" + (
        f"&user={where.user}" if where.user else "")
    with connect(url) as con:
        assert con.execute("SELECT 1").fetchone() == (1,)
    assert read_postgres(url, "SELECT 1 AS one").to_pylist() == [{"one": 1}]


def test_a_bad_connect_timeout_in_the_url_is_terminal(pg_url: str) -> None:
    with pytest.raises(MigrationError, match="connect_timeout"):
        connect(f"{pg_url}?connect_timeout=soon")


def test_with_database_keeps_every_other_part_of_the_url() -> None:
    """The private server's URLs carry a password file's path in their query: cutting the
    text at its last slash put the database inside that path ("no password supplied")."""
    url = "postgresql://postgres@127.0.0.1:5433/postgres?passfile=/home/u/.sstore/pg.pgpass"
    assert with_database(url, "model_1") == \
        "postgresql://postgres@127.0.0.1:5433/model_1?passfile=/home/u/.sstore/pg.pgpass"
    assert with_database("postgresql://u:p@h/db", "x y") == "postgresql://u:p@h/x%20y"
    assert with_database("postgresql://h:5432", "d") == "postgresql://h:5432/d"
    assert with_database("postgresql:///db?host=/run/postgresql", "d") == \
        "postgresql:///d?host=/run/postgresql"
    assert with_database("host=/tmp dbname=a", "b") == "host=/tmp dbname=a dbname=b"
