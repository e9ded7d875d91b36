"""The one retry helper: every loop in sstore that tries again decides by terminal vs transient.

Why one helper: retry loops written by hand drift apart (one retries everything, one retries
nothing, one retries a deterministic failure forever). Here the decision is made once:

- ``kind_of(exc)`` classifies any exception as ``Kind.TRANSIENT`` (trying again later may
  succeed: a dropped connection, a restarting server, a write-write conflict) or
  ``Kind.TERMINAL`` (it never will: bad input, a bug, a schema mismatch, a database that does
  not exist). sstore's own errors say it by their class (``TransientError`` /
  ``TerminalError``); other libraries' errors are classified by the rules in ``RULES``, an
  ordered list of pure functions that the layers owning those libraries extend
  (``register_rule``: the migrators add PostgreSQL's SQLSTATE table). Anything no rule knows
  is terminal: a loud stop is better than retrying a bug forever.
- ``call(fn, policy, what)`` runs ``fn`` and retries transient failures with exponential
  backoff (tenacity), up to ``policy.attempts`` (``None``: until ``stop`` is set); a terminal
  failure is raised at once, unchanged.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import duckdb
import tenacity

from sstore.base.errors import SStoreError, TerminalError, TransientError
from sstore.base.redact import mask_secrets

log = logging.getLogger("sstore.base.retry")

T = TypeVar("T")


class Kind(enum.Enum):
    TERMINAL = "terminal"
    TRANSIENT = "transient"


Rule = Callable[[BaseException], "Kind | None"]


def _sstore_errors(exc: BaseException) -> Kind | None:
    if isinstance(exc, TransientError):
        return Kind.TRANSIENT
    if isinstance(exc, (TerminalError, SStoreError)):
        return Kind.TERMINAL
    return None


def _duckdb_errors(exc: BaseException) -> Kind | None:
    if isinstance(exc, duckdb.TransactionException):  # a write-write conflict: try again
        return Kind.TRANSIENT
    if isinstance(exc, duckdb.Error):
        return Kind.TERMINAL
    return None


def _os_errors(exc: BaseException) -> Kind | None:
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return Kind.TRANSIENT
    return None


#: Classification rules, tried in order; the first that answers decides.
RULES: list[Rule] = [_sstore_errors, _duckdb_errors, _os_errors]


def register_rule(rule: Rule) -> Rule:
    """Add a classification rule (before the catch-all OS rule); usable as a decorator."""
    if rule not in RULES:
        RULES.insert(len(RULES) - 1, rule)
    return rule


def kind_of(exc: BaseException) -> Kind:
    """Whether retrying ``exc`` may help. Unknown errors are terminal."""
    for rule in RULES:
        kind = rule(exc)
        if kind is not None:
            return kind
    return Kind.TERMINAL


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, Exception) and kind_of(exc) is Kind.TRANSIENT


@dataclass
class RetryPolicy:
    """How long to keep trying transient failures: ``attempts`` tries in all (``None``: no
    limit, for services that must outlive an outage), waiting ``first_delay`` seconds after
    the first failure, doubling up to ``max_delay``."""

    attempts: int | None = 8
    first_delay: float = 0.2
    max_delay: float = 5.0
    retries_done: int = field(default=0, compare=False)

    def delay(self, attempt: int) -> float:
        return min(self.max_delay, self.first_delay * 2.0 ** (attempt - 1))


class GaveUp(TransientError):
    """A transient failure outlasted the retry policy. Still transient: a scheduler (Airflow)
    may try the whole task again later."""


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type when it has none), passwords masked: it
    goes into messages and logs (``sstore.base.redact``)."""
    text = mask_secrets(str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def call(fn: Callable[[], T], policy: RetryPolicy, what: str, *,
         on_retry: Callable[[BaseException, int], None] | None = None,
         stop: threading.Event | None = None, tried: int = 0) -> T:
    """Run ``fn``; retry its transient failures by ``policy``; raise terminal ones at once.

    ``tried``: attempts already made elsewhere (and failed transiently) that count against
    ``policy.attempts`` (a TE that failed inside a group commit, ``sstore.execution.group``).

    ``on_retry(exc, attempt)`` runs before each wait (close a broken connection, count the
    retry). ``stop``: when set, waiting ends and the last error is raised (a service shutting
    down must not sleep through its stop). Giving up raises ``GaveUp`` from the last error.
    """
    stop_rules: list[tenacity.stop.stop_base] = \
        [tenacity.stop_after_attempt(max(1, policy.attempts - tried))] if policy.attempts else []
    sleep: Callable[[float], None] = tenacity.nap.sleep
    if stop is not None:
        stopped = stop
        stop_rules.append(tenacity.stop_when_event_set(stopped))

        def sleep(seconds: float) -> None:  # a set stop ends the wait
            stopped.wait(seconds)

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        assert exc is not None
        policy.retries_done += 1
        limit = f"/{policy.attempts - 1}" if policy.attempts else ""
        pause = state.next_action.sleep if state.next_action else 0.0
        log.warning("%s: transient failure (%s); retry %d%s in %.1fs", what, first_line(exc),
                    state.attempt_number + tried, limit, pause)
        if on_retry is not None:
            on_retry(exc, state.attempt_number + tried)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        stop=tenacity.stop_any(*stop_rules) if stop_rules else tenacity.stop_never,
        wait=tenacity.wait_exponential(multiplier=policy.first_delay, min=policy.first_delay,
                                       max=policy.max_delay),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=False)
    try:
        return retrying(fn)
    except tenacity.RetryError as exc:
        last = exc.last_attempt.exception()
        assert last is not None
        attempts = exc.last_attempt.attempt_number + tried
        raise GaveUp(f"{what}: gave up after {attempts} attempt{'s' * (attempts != 1)}: "
                     f"{first_line(last)}") from last
