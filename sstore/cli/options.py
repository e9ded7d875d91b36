"""Options and helpers that several commands share, so each reads and behaves the same.

``postgres_option`` is the one ``--postgres`` of every command that needs a warehouse (same
name, same environment variable, same help); ``warehouse`` turns its value into the URL to use
by the one rule of ``migrators.warehouse_url`` (given, else the default address, else a private
server). ``json_option`` is the one ``--json``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from sstore.base.errors import SStoreError

CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

F = TypeVar("F", bound=Callable[..., Any])


#: the rule of ``migrators.warehouse_url`` in a sentence (written out here: importing
#: ``migrators`` costs half a second, and ``sstore --help`` should not pay it)
POSTGRES_HELP = ("The warehouse's PostgreSQL. Default: $SSTORE_POSTGRES_URL; else "
                 "postgresql://postgres@127.0.0.1:5432/postgres if a server answers there; else "
                 "a private PostgreSQL, started and left running, with its data in "
                 ".sstore/postgres (or $SSTORE_HOME/postgres): see `sstore postgres --help`.")


def postgres_option(fn: F) -> F:
    """``--postgres URL`` (``url`` in the command), read from ``SSTORE_POSTGRES_URL`` when not
    given; None when neither is set: ``warehouse`` then applies the default rule."""
    return click.option("--postgres", "url", envvar="SSTORE_POSTGRES_URL", default=None,
                        metavar="URL", help=POSTGRES_HELP)(fn)


def warehouse(url: str | None) -> str:
    """The PostgreSQL URL a command uses: ``url`` as given, else the default rule (which may
    start the private server, and says so on stderr)."""
    from migrators.warehouse_url import resolve_warehouse

    try:
        return resolve_warehouse(url).url
    except SStoreError as exc:
        raise click.ClickException(f"no warehouse: {exc}") from None


def json_option(fn: F) -> F:
    """``--json``: the result as JSON on stdout (progress and messages go to stderr)."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the result as JSON on stdout.")(fn)


def catalog_option(fn: F) -> F:
    """``--catalog FILE`` of the polystore commands and ``sstore query``."""
    return click.option("--catalog", envvar="SSTORE_CATALOG", default="sstore-catalog.json",
                        show_default=True,
                        help="Polystore catalog file (default: $SSTORE_CATALOG).")(fn)


@contextlib.contextmanager
def state_file_errors(state: str) -> Iterator[None]:
    """Library errors as one-line ``Error: ...`` messages: DuckDB's about the state file
    (missing, locked by another process, not a state file) in plain words
    (``statefile.explain``), sstore's own as they are."""
    import duckdb

    from sstore.storage.statefile import explain

    try:
        yield
    except (duckdb.IOException, duckdb.ConnectionException) as exc:
        raise click.ClickException(str(explain(state, exc))) from None
    except duckdb.Error as exc:
        raise click.ClickException(f"{state}: {exc}") from None
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
