"""Weak durability refuses SQL that gives another answer when it runs again: ``random()``,
``uuid()``, ``now()``, ``current_timestamp`` and their kin.

Weak durability rebuilds the state after a crash by running the logged inputs through the
procedures and ad hoc transactions again (``sstore.execution.recovery``). A statement that calls
one of these functions writes other values at replay, and when it writes as many rows (``INSERT INTO
t SELECT k, now() FROM batch``) no digest (``sstore.base.digest``) can tell. So in weak durability
every statement of a procedure or an ad hoc transaction is checked here first, and refused
before it runs: the one place that knows the answer is now, not after a crash.

The check reads the SQL text with string literals, quoted identifiers and comments blanked out,
so ``'random()'`` in a literal or a column named ``"now"`` is not refused; the functions are
named, not guessed (sequences' ``nextval`` is state, which the snapshot keeps: allowed). The
answer is cached per text: a procedure's SQL is checked once.
"""

from __future__ import annotations

import functools
import re

from sstore.base.errors import NondeterministicError

#: functions whose answer changes from one run to the next (DuckDB's names and aliases)
CALLS = ("random", "setseed", "uuid", "uuidv4", "uuidv7", "gen_random_uuid", "now", "today",
         "get_current_time", "get_current_timestamp", "transaction_timestamp",
         "current_localtime", "current_localtimestamp")
#: SQL keywords that read the clock without parentheses
KEYWORDS = ("current_timestamp", "current_date", "current_time", "localtimestamp", "localtime")

_CALL = re.compile(r"\b(" + "|".join(CALLS) + r")\s*\(", re.IGNORECASE)
_KEYWORD = re.compile(r"\b(" + "|".join(KEYWORDS) + r")\b", re.IGNORECASE)
_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.DOTALL)


def check(sql: str, procedure: str | None) -> None:
    """Raise ``NondeterministicError`` if ``sql`` calls a function whose answer changes at
    replay; ``procedure``: the procedure running it (None: an ad hoc transaction)."""
    found = _volatile_call(sql)
    if found is None:
        return
    where = f"procedure {procedure!r}" if procedure else "an ad hoc transaction"
    instead = ("take the value from the batch (a column the source sends)" if procedure else
               "compute the value in Python and bind it as a parameter (parameters are logged)")
    raise NondeterministicError(
        f"{where} calls {found} in {sql.strip()[:120]!r}: with weak durability the statement "
        f"runs again after a crash and would write another value there, so it is refused; "
        f"{instead}, or use full durability (a state file)")


@functools.lru_cache(maxsize=4096)
def _volatile_call(sql: str) -> str | None:
    """The first volatile function ``sql`` calls, as written, or None."""
    text = _QUOTED.sub(" ", sql)
    match = _CALL.search(text)
    if match is not None:
        return match.group(1) + "()"
    match = _KEYWORD.search(text)
    return match.group(1) if match is not None else None
