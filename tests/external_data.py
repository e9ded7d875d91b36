"""Data sets the project does not hold (real DIGen output): where the tests find them, and what
happens when one is absent.

A clean clone on a machine without the data must still pass the README's test command, and the
tests of that data must not pass without it. So an absent data set makes its tests not run,
with a reason that ``pytest_terminal_summary`` (tests/conftest.py) repeats in a banner at the
end of the run, never silently; where the data must be present (CI, which has it:
``SSTORE_REQUIRE_EXTERNAL_DATA=1``, set by ``.ci/run``) its absence fails the tests instead.
The location comes from the environment only: nothing in the repository points outside it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: the prefix of an absent data set's skip reason, which the end-of-run banner collects
ABSENT = "EXTERNAL DATA ABSENT"
REQUIRE_ENV = "SSTORE_REQUIRE_EXTERNAL_DATA"


def external_data(env: str, what: str, marker: str) -> Path:
    """The directory named by environment variable ``env`` holding ``what``, checked by the
    presence of ``marker`` inside it; otherwise the test does not run (or fails, when data is
    required), saying which variable to set."""
    value = os.environ.get(env)
    path = Path(value) if value else None
    if path is not None and (path / marker).exists():
        return path
    where = f"{env}={value} has no {marker}" if value else f"{env} is not set"
    message = f"{ABSENT}: {what} ({where}); set {env} to its directory to run these tests"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_ENV}=1: the data must be here)")
    pytest.skip(message)


def absent_reasons(terminalreporter: object) -> list[str]:
    """The distinct absent-data reasons among this run's skips (a plain run or pytest-xdist's
    controller, which receives its workers' reports)."""
    reasons: set[str] = set()
    for report in getattr(terminalreporter, "stats", {}).get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        if isinstance(longrepr, tuple) and len(longrepr) == 3 and ABSENT in str(longrepr[2]):
            reasons.add(str(longrepr[2]).removeprefix("Skipped: "))
    return sorted(reasons)
