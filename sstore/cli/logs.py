"""Logging of the ``sstore`` command line: the stdlib ``logging`` module, text or JSON lines.

The root options (``sstore -v``, ``--log-level``, ``--log-format``) call ``configure`` once per
command. Records go to stderr, so stdout keeps the command's result (a table, ``--json``).

- ``text``: at the default level (warning) a record is its message alone, as Python prints a
  warning nobody configured; with ``-v`` (info) or ``-vv`` (debug) each line has the time, the
  level and the logger.
- ``json``: one JSON object per line: ``time`` (ISO 8601, UTC), ``level``, ``logger``,
  ``message``, then every extra field of the record (``log.warning(..., extra={...})``) and
  ``exception`` when there is one. For log collectors: nothing else is written to stderr as a
  log line.

Every line is passed through ``sstore.base.redact.mask_secrets`` last, tracebacks and extra fields
included: a password in a URL that reached a message (a driver's exception, user code) is
shown as ``***``.

The engine's loggers (``sstore``, ``migrators``) get the chosen level; other libraries (Spark's
py4j, sqlglot) stay at warning so that ``-vv`` shows sstore's debug output, not theirs.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any, TextIO

from sstore.base.redact import mask_secrets

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
OWN_LOGGERS = ("sstore", "migrators")
VERBOSE_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: attributes every LogRecord has; anything else on a record came from ``extra=``
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonLines(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
            .isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes (click's test runner and
    pytest swap it; a handler bound to an old stream would write to a closed file)."""

    _sstore_cli = True

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass

    def format(self, record: logging.LogRecord) -> str:
        """The formatted line, passwords masked (the module docstring)."""
        return mask_secrets(super().format(record))


def level_of(verbose: int, log_level: str | None) -> str:
    """``--log-level`` when given, else warning raised by each ``-v``."""
    if log_level:
        return log_level.lower()
    return ("warning", "info", "debug")[min(verbose, 2)]


_format = "text"


def progress_bars() -> bool:
    """Whether commands draw progress bars: not when logs are JSON lines (a bar drawn on
    stderr would be a line that is not JSON, and machines are reading)."""
    return _format != "json"


def configure(level: str, fmt: str) -> None:
    """Send log records to stderr in ``fmt`` ("text" or "json") from ``level`` on. Replaces
    what an earlier call in this process installed (tests run many commands in one)."""
    global _format
    if level not in LEVELS or fmt not in FORMATS:
        raise ValueError(f"log level must be one of {LEVELS} and format one of {FORMATS}")
    _format = fmt
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_sstore_cli", False):
            root.removeHandler(handler)
    handler = _Stderr()
    if fmt == "json":
        handler.setFormatter(JsonLines())
    elif level in ("warning", "error"):
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler.setFormatter(logging.Formatter(VERBOSE_TEXT))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(level.upper())
