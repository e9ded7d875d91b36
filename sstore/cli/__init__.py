"""The ``sstore`` command line, one package: ``main`` is the click group; ``run`` is the console
script (``sstore.cli:run``) and ``python -m sstore.cli``: it first puts the process under
jemalloc where the machine has it (``sstore.base.allocator``), then runs ``main``. ``main`` is
loaded on first use, so that choosing the allocator happens before DuckDB is loaded."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

__all__ = ["main", "run"]

if TYPE_CHECKING:
    from sstore.cli.app import main


def run() -> None:
    """The ``sstore`` command: the allocator first (it may re-execute the process), then the
    click group. A misconfigured ``SSTORE_MALLOC`` is a one-line error, exit status 2."""
    from sstore.base.allocator import AllocatorError, use_jemalloc

    try:
        use_jemalloc()
    except AllocatorError as e:
        print(f"Error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    from sstore.cli.app import main

    main()


def __getattr__(name: str) -> Any:
    if name == "main":
        from sstore.cli.app import main

        return main
    raise AttributeError(f"module 'sstore.cli' has no attribute {name!r}")
