"""Passwords out of text that people or machines read: messages, logs, status documents.

Why a function over text rather than care at each message: a URL reaches a message by many
roads (an exception of a driver, a repr, a log argument), and the one place that cannot be
forgotten is where text leaves the process. ``mask_secrets`` replaces the password of every
URL (``scheme://user:PASSWORD@host``) and every ``password=...`` keyword (libpq's keyword
form, a query parameter) with ``***``; the rest of the text, user and host included, stays
as it was, so the message still says where.
"""

from __future__ import annotations

import re

MASK = "***"

#: ``scheme://user:password@``: the password runs from the first ``:`` of the user-info to
#: the last ``@`` before the path (a password written unescaped may itself hold ``@``). The
#: pattern starts at the literal ``://``, which the regex engine finds by a fast search: a
#: ``/status`` body of 24 kB is scanned in microseconds, not milliseconds.
_URL_PASSWORD = re.compile(r"(?P<head>://[^\s/?#@:'\"]*:)(?P<secret>[^\s/?#'\"]*)(?P<at>@)")
#: ``password=secret`` in a query string or a libpq keyword string (quoted or not).
_KEYWORD_PASSWORD = re.compile(r"(?P<head>\b(?:password|passwd|pwd)\s*=\s*)"
                               r"(?P<secret>'(?:[^'\\]|\\.)*'|[^\s&;'\"]+)", re.IGNORECASE)


def mask_secrets(text: str) -> str:
    """``text`` with the password of each URL and each ``password=`` keyword shown as
    ``***`` (``postgresql://app:s3cret@db/x`` -> ``postgresql://app:***@db/x``)."""
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}{m['at']}", text)
    lowered = text.lower()
    if "pass" in lowered or "pwd" in lowered:  # the keyword pattern only where it can match
        text = _KEYWORD_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)
    return text
