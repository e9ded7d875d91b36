"""Airflow tasks fail the way their error says: transient errors are retried by Airflow,
terminal ones fail the task at once.

Why: Airflow retries every failure of a task that has ``retries``. Retrying a task whose data
set is missing, whose audit failed or whose declaration is wrong only delays the alert (and
may repeat side effects); retrying one whose PostgreSQL restarted is exactly right. sstore
already knows which is which (``sstore.base.retry.kind_of``), so every task of ``dags/`` is wrapped
in ``airflow_errors``:

- a transient error (``kind_of`` is ``TRANSIENT``: ``sstore.base.retry.GaveUp``,
  ``PostgresUnavailable``, a lost connection) is raised unchanged: the try fails and Airflow
  retries it after ``retry_delay``, up to the task's ``retries`` (``TASK_DEFAULTS``);
- any other ``Exception`` (terminal) becomes ``AirflowFailException`` with the error's type
  and message, raised from it: the task fails without retry;
- Airflow's own exceptions (skip, defer, ...) and what is not an ``Exception`` (a stop, the
  task being killed) pass through untouched.

Airflow is imported only when a task fails, and where it is not installed the original error
is raised as it is: the wrapped functions work without Airflow.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from sstore.base.retry import Kind, kind_of

F = TypeVar("F", bound=Callable[..., Any])

#: ``default_args`` of the DAGs: transient failures are tried again, with growing delays.
TASK_DEFAULTS: dict[str, Any] = {"retries": 2, "retry_delay": dt.timedelta(seconds=30),
                                 "retry_exponential_backoff": True}


def airflow_errors(fn: F) -> F:
    """Wrap an Airflow task's function (see the module docstring). Keeps its signature."""

    @functools.wraps(fn)
    def task_function(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            fail = _fail_exception()
            if fail is None or type(exc).__module__.split(".")[0] == "airflow" or \
                    kind_of(exc) is Kind.TRANSIENT:
                raise
            raise fail(f"terminal, not retried: {type(exc).__name__}: {exc}") from exc

    task_function.maps_sstore_errors = True  # type: ignore[attr-defined]
    return task_function  # type: ignore[return-value]


def _fail_exception() -> type[Exception] | None:
    try:
        from airflow.sdk.exceptions import AirflowFailException
    except ImportError:  # no Airflow: the original error is raised as it is
        return None
    return AirflowFailException
