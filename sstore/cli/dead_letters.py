"""``sstore dead-letters ...``: see, replay and discard the batches procedures gave up on.

The work lives in ``sstore.dead_letters`` (what a replay may do, and its protocol); these
commands open the state file (read-only to look, as its only writer to change it) and show the
result.
"""

from __future__ import annotations

import click

from sstore.cli.options import CONTEXT, json_option, state_file_errors

STATE = click.argument("state", type=click.Path(dir_okay=False))
BATCHES = click.option("--batch", "batches", type=click.IntRange(min=1), multiple=True,
                       help="Only this dead-lettered batch (repeat for several; default: all).")


@click.group(name="dead-letters", context_settings=CONTEXT)
def dead_letters() -> None:
    """Input batches that a procedure declared with on_error="dead_letter" gave up on.

    When such a procedure fails on batch b, the engine keeps b's rows of each input N in the
    table N__dead_letter (columns _batch_id, _procedure, _error, then N's columns), commits
    the procedure's empty output for b and moves on.

    \b
      sstore dead-letters list STATE              what failed, where, how many rows, why
      sstore dead-letters show STATE INPUT        the rows
      sstore dead-letters replay STATE INPUT      send them through again (a new batch)
      sstore dead-letters discard STATE INPUT --all   delete them, once handled by hand

    A replay ingests each dead-lettered batch of a border stream again as a new batch, and
    deletes its dead letters in the same transaction (never both, never neither); the
    procedure runs on it when its program next runs. It is refused (and explained) when the
    rows would reach anything twice: another reader of the stream, a window, a trigger, a
    sink, or a stream that a procedure writes.
    """


@dead_letters.command(name="list", context_settings=CONTEXT)
@STATE
@json_option
def list_command(state: str, as_json: bool) -> None:
    """List the dead-lettered batches: input, procedure, batch, rows, the error."""
    from rich.console import Console
    from rich.table import Table

    from sstore import dead_letters as dl
    from sstore.cli.format import TABLE_STYLE, to_json
    from sstore.storage.statefile import StateFileReader

    with state_file_errors(state):
        reader = StateFileReader(state)
        try:
            found = dl.summary(reader)
        finally:
            reader.close()
    if as_json:
        click.echo(to_json([d.to_dict() for d in found]))
        return
    if not found:
        click.echo(f"No dead letters in {state}.")
        return
    table = Table(title=f"Dead letters in {state}", **TABLE_STYLE)  # type: ignore[arg-type]
    for name, justify in (("input", "left"), ("procedure", "left"), ("batch", "right"),
                          ("rows", "right"), ("error", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for d in found:
        table.add_row(d.input, d.procedure, str(d.batch_id), f"{d.rows:,}", d.error)
    Console(highlight=False).print(table)


@dead_letters.command(name="show", context_settings=CONTEXT)
@STATE
@click.argument("input_name", metavar="INPUT")
@BATCHES
@json_option
def show_command(state: str, input_name: str, batches: tuple[int, ...], as_json: bool) -> None:
    """Show the dead-lettered rows of INPUT (a stream or window), batch by batch."""
    from rich.console import Console

    from sstore import dead_letters as dl
    from sstore.cli.format import arrow_table, to_json
    from sstore.storage.statefile import StateFileReader

    with state_file_errors(state):
        reader = StateFileReader(state)
        try:
            rows = dl.read(reader, input_name, batches)
        finally:
            reader.close()
    if as_json:
        click.echo(to_json(rows))
        return
    Console(highlight=False).print(arrow_table(rows, title=f"{dl.table_of(input_name)}"))
    click.echo(f"({rows.num_rows:,} row{'' if rows.num_rows == 1 else 's'})")


@dead_letters.command(name="replay", context_settings=CONTEXT)
@STATE
@click.argument("input_name", metavar="INPUT")
@BATCHES
@json_option
def replay_command(state: str, input_name: str, batches: tuple[int, ...], as_json: bool) -> None:
    """Send INPUT's dead letters through again: each dead-lettered batch becomes a new batch
    of the border stream INPUT, in one transaction with the deletion of its dead letters.

    Fix what made the procedure fail first. The procedure runs on the new batches when the
    program that owns STATE next runs its dataflow (this command never runs procedures: their
    code lives in that program). STATE must not be open in another process.
    """
    from sstore import dead_letters as dl
    from sstore.cli.format import to_json
    from sstore.engine import Engine

    with state_file_errors(state), Engine.open_existing(state) as engine:
        done = dl.replay(engine, input_name, batches)
    if as_json:
        click.echo(to_json([r.to_dict() for r in done]))
        return
    if not done:
        click.echo(f"No dead letters of {input_name} to replay.")
    for r in done:
        click.echo(f"Replayed batch {r.from_batch} of {r.input} ({r.rows:,} rows, "
                   f"dead-lettered by {r.procedure}) as batch {r.batch_id}.")
    if done:
        names = ", ".join(sorted({r.procedure for r in done}))
        click.echo(f"{names} runs on them when the program that owns {state} next runs.")


@dead_letters.command(name="discard", context_settings=CONTEXT)
@STATE
@click.argument("input_name", metavar="INPUT")
@BATCHES
@click.option("--all", "everything", is_flag=True,
              help="Every dead-lettered batch of INPUT (needed without --batch).")
def discard_command(state: str, input_name: str, batches: tuple[int, ...],
                    everything: bool) -> None:
    """Delete dead letters of INPUT, once they were handled by hand: nothing else keeps
    their rows. Give --batch B (repeatable) or --all."""
    from sstore import dead_letters as dl
    from sstore.engine import Engine

    if not batches and not everything:
        raise click.UsageError("give --batch B (repeatable) or --all")
    if batches and everything:
        raise click.UsageError("give --batch or --all, not both")
    with state_file_errors(state), Engine.open_existing(state) as engine:
        gone = dl.discard(engine, input_name, batches)
    click.echo(f"Discarded {gone:,} dead-lettered row{'' if gone == 1 else 's'} of "
               f"{input_name}.")
