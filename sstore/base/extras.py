"""Optional dependencies (pyproject's extras) and the one-line hint when one is missing.

sstore installs without PySpark or matplotlib; only some paths need them (the TPC-DI
dimensions, Spark in the polystore, the benchmark plots). When such a path runs
without its extra, the user should read what to install, not a traceback ending in
``No module named 'pyspark'``. So every way into code that imports an optional module goes
through ``needs``: the import itself (``migrators.spark_session``, ``migrators.spark``,
``dimtrade_spark``, the benchmark plots) or the package that gathers such modules (the TPC-DI
``dimensions``). It turns "that module is not installed" into ``MissingExtraError``: a
``TerminalError`` (the CLI prints it as one ``Error: ...`` line, exit 1) that is also a
``ModuleNotFoundError`` (code that probes with ``except ImportError`` keeps working). Any other
import failure (a module of ours that is missing, a broken installation) passes through
unchanged. A new module that imports an optional one at its top must be reached only through
such a guarded import, or guard its own.

Use it where the optional module is imported, so that every caller gets the hint:

    with needs("spark"):
        from pyspark.sql import SparkSession

and ``require("bench")`` at the start of a long job that would need the extra only at its end.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

from sstore.base.errors import TerminalError

# top-level import name -> (what people call it, the extra that installs it); keep in step
# with [project.optional-dependencies] in pyproject.toml (tests/project/test_wheel.py checks it)
OPTIONAL_MODULES: dict[str, tuple[str, str]] = {
    "pyspark": ("PySpark", "spark"),
    "py4j": ("PySpark", "spark"),
    "matplotlib": ("matplotlib", "bench"),
}


class MissingExtraError(TerminalError, ModuleNotFoundError):
    """An optional module is not installed; the message says which extra installs it."""

    def __init__(self, module: str) -> None:
        label, extra = OPTIONAL_MODULES[module]
        ModuleNotFoundError.__init__(self, f"this needs {label}: pip install 'sstore[{extra}]'",
                                     name=module)
        self.extra = extra


def _modules_of(extra: str) -> list[str]:
    modules = [m for m, (_label, e) in OPTIONAL_MODULES.items() if e == extra]
    if not modules:
        raise ValueError(f"unknown extra {extra!r}; known: "
                         f"{sorted({e for _label, e in OPTIONAL_MODULES.values()})}")
    return modules


@contextmanager
def needs(extra: str) -> Iterator[None]:
    """Around imports that need ``extra``: a missing module of that extra becomes
    ``MissingExtraError``; every other exception passes through as it is."""
    modules = _modules_of(extra)
    try:
        yield
    except MissingExtraError:
        raise
    except ModuleNotFoundError as exc:
        root = (exc.name or "").partition(".")[0]
        if root not in modules:
            raise
        raise MissingExtraError(root) from exc


def require(extra: str) -> None:
    """Fail now, with the hint, if a module of ``extra`` is not installed (for jobs that would
    otherwise find out only after minutes of work)."""
    for module in _modules_of(extra):
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(module)
