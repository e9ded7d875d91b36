"""The SQL files sstore ships (``schemas/*.sql``), read the same way from a checkout and a wheel.

The DDL lives in the top-level ``schemas/`` folder of the source tree, where psql users find
it. pyproject.toml installs that folder as the package ``sstore._schemas`` (``package-dir``), so
a wheel carries the files inside sstore (no top-level ``schemas`` package to clash with other
distributions) and an editable install maps the name to the checkout's folder. Code reads them
only through ``read_schema`` (``importlib.resources``), never relative to its own file:
``Path(__file__).parents[...]`` finds the checkout and misses in site-packages.
"""

from __future__ import annotations

from importlib import resources

from sstore.base.errors import TerminalError

SCHEMA_PACKAGE = "sstore._schemas"


def read_schema(name: str) -> str:
    """The text of ``schemas/NAME.sql`` (e.g. ``read_schema("tpcdi")``)."""
    try:
        folder = resources.files(SCHEMA_PACKAGE)
    except ModuleNotFoundError as exc:
        raise TerminalError(
            f"sstore's SQL schemas ({SCHEMA_PACKAGE}) are not installed: install sstore again "
            "(in a checkout: pip install -e . ; scripts/setup.sh does it when pyproject.toml "
            "changes)") from exc
    file = folder / f"{name}.sql"
    if not file.is_file():
        shipped = sorted(f.name for f in folder.iterdir() if f.name.endswith(".sql"))
        raise TerminalError(f"no schema {name!r} in {SCHEMA_PACKAGE}; it has {shipped}")
    return file.read_text(encoding="utf-8")
