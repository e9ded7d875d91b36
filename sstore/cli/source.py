"""``sstore source ...``: feed a state file's border stream from an outside system, exactly once.

The work lives in ``sstore.sources`` (the one feeding loop and each source); these commands
open the state file as its only writer, run the loop until stopped (or caught up, with
``--until-idle``) and print what was taken.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from sstore.cli.options import CONTEXT, json_option, state_file_errors

if TYPE_CHECKING:
    from sstore.sources import Source

STATE = click.argument("state", type=click.Path(dir_okay=False))
STREAM = click.option("--stream", required=True, help="The border stream to feed (declared "
                      "in STATE by its program).")
UNTIL_IDLE = click.option("--until-idle", is_flag=True,
                          help="Exit once everything ready was taken (default: follow until "
                               "stopped with Ctrl-C or SIGTERM).")
POLL = click.option("--poll", type=click.FloatRange(min=0.01), default=0.5, show_default=True,
                    help="Seconds to wait for new input before looking again.")


@click.group(name="source", context_settings=CONTEXT)
def source() -> None:
    """Feed a border stream from landing files, a message broker or PostgreSQL, exactly once.

    Each batch is a contiguous range of the source (a file; a run of JetStream sequence
    numbers; whole transactions of a replication slot) with a batch-id derived from its
    position; the position is committed in the
    state file in the same transaction as the batch, and the source is acknowledged only
    after that commit. Kill the command anywhere and run it again: nothing is lost or taken
    twice. A fed stream has that source as its only feeder.

    \b
      sstore source files STATE --dir landing --pattern '*.csv' --stream trades --until-idle
      sstore source nats STATE --url nats://127.0.0.1:4222 --js-stream ORDERS \\
          --subject orders.new --stream orders
      sstore source postgres STATE --postgres URL --table public.orders --stream orders
      sstore source status STATE               every fed stream, its position, dead letters
      sstore source drop STATE --stream trades forget the source (the batches stay)

    STATE must exist and declare the stream (run its program once); it must not be open in
    another process. The program's procedures run on the batches when it next runs.
    See docs/sources.md.
    """


def _run(state: str, stream: str, make: Callable[[], Source], until_idle: bool, poll: float,
         as_json: bool) -> None:
    """Open STATE, feed ``stream`` from the source ``make`` builds, print the report. A
    signal ends the loop between batches (exit 130 / 143)."""
    from sstore.cli.format import to_json
    from sstore.engine import Engine
    from sstore.execution.stopping import STOPPED_MESSAGE, command_stops
    from sstore.sources import feed

    if not os.path.exists(state):
        raise click.ClickException(f"no state file at {state}: run its program once to "
                                   f"declare {stream!r}")
    with command_stops() as stop, state_file_errors(state):
        with Engine.open_existing(state) as engine:
            report = feed(engine, make(), stream, until_idle=until_idle, stop=stop.event,
                          poll=poll)
    if as_json:
        click.echo(to_json({"state": state, "stream": stream, "batches": report.batches,
                            "rows": report.rows, "dead_letters": report.dead_letters,
                            "position": report.position,
                            "seconds": round(report.seconds, 3)}))
    else:
        click.echo(f"{stream}: {report.batches} batch(es), {report.rows} row(s), "
                   f"{report.dead_letters} dead letter(s); position {report.position}")
    if stop.requested:
        click.echo(STOPPED_MESSAGE, err=True)
        raise SystemExit(stop.exit_status)


@source.command(name="files", context_settings=CONTEXT)
@STATE
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="The landing folder.")
@click.option("--pattern", default="*.csv", show_default=True,
              help="Which names to take (shell pattern; names starting with '.' never).")
@STREAM
@click.option("--settle", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Seconds a file's size and time must stay unchanged before it is taken.")
@click.option("--delimiter", default=",", show_default=True,
              help="The field separator, one character (TPC-DI's files: '|').")
@click.option("--header/--no-header", default=True, show_default=True,
              help="Whether the first line names the columns; without, the fields are the "
                   "stream's columns in their declared order.")
@UNTIL_IDLE
@POLL
@json_option
def files_command(state: str, directory: str, pattern: str, stream: str, settle: float,
                  delimiter: str, header: bool, until_idle: bool, poll: float,
                  as_json: bool) -> None:
    """Take each complete CSV file of --dir matching --pattern once, in name order, one
    batch per file.

    A file is complete when no process has it open for writing (asked of the kernel on
    Linux) and its size and time have not changed for --settle seconds; land files by
    writing them under another name (x.csv.part, .x.csv) and renaming them into the pattern.
    Its name, size and SHA-256 are recorded with its batch. A taken file that changes is an
    error (exit 1), never a second batch; taken files may be moved away. The header names the
    stream's columns (--no-header: the fields are the stream's columns in order); values are
    stored by the engine's input rule (an empty field is NULL).
    """
    from sstore.sources import FileSource

    if len(delimiter) != 1:
        raise click.BadParameter("one character", param_hint="--delimiter")
    _run(state, stream, lambda: FileSource(directory, pattern, settle=settle,
                                           delimiter=delimiter, header=header),
         until_idle, poll, as_json)


@source.command(name="nats", context_settings=CONTEXT)
@STATE
@click.option("--url", default="nats://127.0.0.1:4222", show_default=True,
              help="The NATS server.")
@click.option("--js-stream", required=True, help="The JetStream stream to read.")
@click.option("--subject", required=True, help="Its subject (or wildcard) to take.")
@STREAM
@click.option("--durable", default=None,
              help="The durable consumer's name (default: sstore_STREAM). It is recreated "
                   "at each start, from the position STATE committed.")
@click.option("--batch", type=click.IntRange(min=1), default=500, show_default=True,
              help="Messages per fetch, at most one batch each.")
@click.option("--ack-wait", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds the broker waits for an acknowledgement before delivering again.")
@UNTIL_IDLE
@POLL
@json_option
def nats_command(state: str, url: str, js_stream: str, subject: str, stream: str,
                 durable: str | None, batch: int, ack_wait: float, until_idle: bool,
                 poll: float, as_json: bool) -> None:
    """Take the messages of --subject in the JetStream stream --js-stream exactly once.

    A batch is the run of sequence numbers one fetch returned; its batch-id is the last
    sequence number. Messages are acknowledged only after the batch committed; a message
    given again (an ack timeout, a crash before the ack) is skipped. Each message is a JSON
    object naming the stream's columns (an absent key is NULL), stored by the engine's input
    rule; one that is not, or whose values are refused, is a dead letter (kept in STATE's
    sstore_sources.dead_letters with the batch that skipped it; `sstore source status`).
    Never purge the JetStream stream below what was taken: a start that finds a gap refuses.
    """
    from sstore.sources.jetstream import NatsSource

    _run(state, stream, lambda: NatsSource(url, js_stream, subject, durable=durable,
                                           batch=batch, ack_wait=ack_wait),
         until_idle, poll, as_json)


@source.command(name="postgres", context_settings=CONTEXT)
@STATE
@click.option("--postgres", "url", required=True, metavar="URL",
              help="The source PostgreSQL (wal_level = logical), not the warehouse.")
@click.option("--table", "tables", required=True, multiple=True,
              help="The table to capture, SCHEMA.TABLE; repeat for several tables from one "
                   "slot (the stream then has their columns and _table).")
@STREAM
@click.option("--batch", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Changes per read (whole transactions; a batch may hold more).")
@UNTIL_IDLE
@POLL
@json_option
def postgres_command(state: str, url: str, tables: tuple[str, ...], stream: str, batch: int,
                     until_idle: bool, poll: float, as_json: bool) -> None:
    """Capture --table: its snapshot, then its changes, exactly once.

    Several --table options capture several tables from one slot into one stream: one
    snapshot of all of them as of the same instant, then their changes in commit order, a
    transaction that touches several tables in one batch; the stream has the union of their
    columns (NULL where a row's table has none) plus _table ('schema.table').

    The first run creates the replication slot sstore_STREAM (and a publication of that
    name) and takes the table's snapshot as of the slot's start (one batch, _op 'snapshot');
    then each batch is the transactions of one read of the slot, batch-id the LSN of the
    last. The stream has the table's columns plus _op ('snapshot', 'insert', 'update',
    'delete', 'truncate') and _lsn. The slot advances only after the batch committed. Needs
    wal_level = logical. Never drop or advance the slot by hand: `sstore source drop STATE
    --stream S --postgres URL` removes it.
    """
    from sstore.sources.postgres_cdc import PostgresSource

    _run(state, stream, lambda: PostgresSource(url, list(tables), batch=batch), until_idle,
         poll, as_json)


@source.command(name="status", context_settings=CONTEXT)
@STATE
@click.option("--postgres", "url", default=None, metavar="URL",
              help="A PostgreSQL source's server: show its slot's retained WAL and lag too.")
@click.option("--max-retained", type=click.IntRange(min=0), default=1 << 30,
              show_default=True,
              help="Retained WAL (bytes) above which a slot is an ALERT (exit status 1).")
@json_option
def status_command(state: str, url: str | None, max_retained: int, as_json: bool) -> None:
    """Every stream fed by a source: its kind, where it reads, its committed position, the
    batches taken and the dead letters kept. Reads STATE read-only. With --postgres, each
    PostgreSQL source's slot too: the WAL it keeps on the server and how far behind it is;
    a slot past --max-retained (or missing) is an ALERT, and the exit status is 1."""
    import duckdb

    from sstore.cli.format import to_json
    from sstore.sources.base import STATUS_SQL
    from sstore.storage.statefile import query_file

    with state_file_errors(state):
        try:
            rows = query_file(state, STATUS_SQL).to_pylist()
        except duckdb.CatalogException:  # no source ever fed this state
            rows = []
    if url is not None:
        from sstore.sources.postgres_cdc import slot_status

        with state_file_errors(state):
            for r in rows:
                if r["kind"] == "postgres":
                    r["slot"] = slot_status(url, r["stream"], max_retained)
    alert = any(r.get("slot", {}).get("alert") for r in rows)
    if as_json:
        click.echo(to_json(rows))
    else:
        if not rows:
            click.echo(f"{state}: no stream is fed by a source")
        for r in rows:
            click.echo(f"{r['stream']}: {r['kind']} {r['origin']}, position {r['position']}, "
                       f"{r['batches']} batch(es), {r['dead_letters']} dead letter(s), last at "
                       f"{r['updated'] or 'never'}")
            slot = r.get("slot")
            if slot is not None:
                click.echo(f"  slot {slot['slot']}: " + (
                    f"retains {slot['retained_bytes']:,} bytes of WAL, {slot['lag_bytes']:,} "
                    f"behind, {'active' if slot['active'] else 'idle'}" if slot["exists"]
                    else "MISSING (dropped by hand?)") + (" ALERT" if slot["alert"] else ""))
    if alert:
        raise SystemExit(1)


@source.command(name="drop", context_settings=CONTEXT)
@STATE
@STREAM
@click.option("--postgres", "url", default=None, metavar="URL",
              help="A PostgreSQL source's server: its slot and publication are dropped too "
                   "(required for such a source: a slot left behind keeps WAL for ever).")
def drop_command(state: str, stream: str, url: str | None) -> None:
    """Forget the source of --stream: its position (and, for landing files, which files it
    took; for PostgreSQL, its replication slot). The stream's batches stay. A source started
    afterwards begins at its start, and is refused while the stream holds batch-ids it would
    take (a stream has one feeder, whose positions are its batch-ids). A NATS source's durable
    consumer is left to delete with `nats consumer rm` (it holds no messages back)."""
    from sstore.engine import Engine
    from sstore.sources import forget
    from sstore.sources.base import kind_of

    with state_file_errors(state), Engine.open_existing(state) as engine:
        if kind_of(engine, stream) == "postgres":
            if url is None:
                raise click.ClickException(
                    f"{stream!r} is fed by a PostgreSQL source: give --postgres URL so that "
                    f"its replication slot is dropped too (left behind, it keeps WAL)")
            from sstore.sources.postgres_cdc import drop_slot
            drop_slot(url, stream)
        dropped = forget(engine, stream)
    click.echo(f"dropped the source of {stream!r}" if dropped
               else f"{stream!r} has no source; nothing to drop")

