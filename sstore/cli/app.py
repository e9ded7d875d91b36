"""The ``sstore`` command line: one click group, one small function per subcommand.

Commands only parse options, call the library and hand results to ``sstore.cli.format``; what
they do lives in the library (``sstore.workloads``, ``sstore.storage.statefile``) so that tests and
benchmarks call the same code. Library errors become one-line ``Error: ...`` messages with
exit status 1 instead of tracebacks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator

import click
import duckdb
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from sstore import __version__
from sstore.base import allocator
from sstore.base.errors import SStoreError
from sstore.base.readonly import ReadOnlyQueryError
from sstore.base.retry import RetryPolicy
from sstore.cli.environment import epilog
from sstore.cli.format import (
    arrow_table,
    consumers_view,
    leaderboard_view,
    run_summary,
    status_view,
    to_csv,
    to_json,
)
from sstore.cli.logs import FORMATS, LEVELS, configure, level_of, progress_bars
from sstore.cli.options import (
    CONTEXT,
    catalog_option,
    json_option,
    postgres_option,
    warehouse,
)
from sstore.engine import Engine
from sstore.execution.stopping import command_stops
from sstore.observe.live import file_status
from sstore.observe.options import serve_options, start_serving
from sstore.storage.statefile import explain, query_file


@click.group(context_settings=CONTEXT, epilog=epilog())
@click.version_option(__version__, "-V", "--version", prog_name="sstore",
                      message=f"%(prog)s, version %(version)s ({allocator.describe()})")
@click.option("-v", "--verbose", count=True,
              help="Log more to stderr: -v from info on, -vv from debug on.")
@click.option("--log-level", type=click.Choice(LEVELS, case_sensitive=False), default=None,
              help="Log from this level on (default: warning; overrides -v).")
@click.option("--log-format", type=click.Choice(FORMATS), default="text", show_default=True,
              help="text: plain lines; json: one JSON object per line (time, level, logger, "
                   "message and the record's extra fields) for log collectors.")
def main(verbose: int, log_level: str | None, log_format: str) -> None:
    """sstore: transactional streaming on DuckDB, in the style of S-Store, in front of a
    polystore (PostgreSQL, Spark) in the style of BigDAWG.

    A stream is cut into atomic batches; each stored procedure runs on each batch as one ACID
    transaction over DuckDB state, in dataflow order and exactly once. Everything lives in one
    state file, so a restart on the same file resumes where the last commit left off. Results
    move into PostgreSQL exactly once; `sstore query SQL` answers across the engines.

    Commands that need PostgreSQL take --postgres URL (else $SSTORE_POSTGRES_URL); without
    one they use the local server, or start a private one (`sstore postgres --help`). Logs go
    to stderr (-v, --log-level, --log-format json); results to stdout, as JSON with --json.

    \b
    Try it:
      sstore tpcdi demo          (TPC-DI DimTrade streamed, audited, queried across engines)
      sstore icu demo            (ICU vital signs: event-time windows, live alerts)
      sstore demo --state voter.duckdb
      sstore status voter.duckdb
      sstore query voter.duckdb "SELECT * FROM vote_totals ORDER BY votes DESC"
    """
    configure(level_of(verbose, log_level), log_format)
    if allocator.fallback_note:  # sstore.cli.run chose the allocator before logging was set up
        logging.getLogger(allocator.__name__).info(allocator.fallback_note)


@main.command(context_settings=CONTEXT)
@click.option("--votes", "n_votes", type=click.IntRange(min=1), default=100_000,
              show_default=True, help="How many votes to generate and process.")
@click.option("--batch-size", type=click.IntRange(min=1), default=1_000, show_default=True,
              help="Votes per atomic batch (one transaction per procedure per batch).")
@click.option("--state", type=click.Path(dir_okay=False), default=None,
              help="State file to use and keep. Default: a temporary file, deleted at the end. "
                   "Running again with the same file, votes and seed resumes an interrupted run.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the vote generator (same seed, same votes).")
@click.option("--remove-every", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Remove the lowest contestant every N valid votes.")
@click.option("--window", "window_rows", type=click.IntRange(min=1), default=100,
              show_default=True, help="Trending leaderboard over the last N valid votes.")
@serve_options
def demo(n_votes: int, batch_size: int, state: str | None, seed: int, remove_every: int,
         window_rows: int, serve: int | None, serve_host: str) -> None:
    """Run the voter benchmark and show the leaderboard and throughput.

    S-Store's voter with leaderboard: generated votes are validated (unknown contestant,
    too many votes from one phone, removed contestant), counted, the lowest contestant is
    removed every --remove-every valid votes, and a trending leaderboard follows the last
    --window valid votes.

    Ctrl-C (SIGINT) or SIGTERM stops it cleanly: the transaction in flight rolls back, nothing
    is recorded as an error, and it exits with status 130 (143 for SIGTERM); run the same
    command again with --state to resume.
    """
    # Workloads load on demand, so that `sstore --help` and `status` never pay for them.
    from sstore.workloads.voter import declare, generate_votes, leaderboard, run_voter

    console = Console(highlight=False)
    with command_stops() as stop, _state_path(state) as path:
        console.print(f"Voter demo: {n_votes:,} votes in batches of {batch_size:,} "
                      f"(seed {seed}), state in {path if state else 'a temporary file'}")
        votes = generate_votes(n_votes, seed=seed)
        stop.check()
        try:
            with Engine(path) as engine:
                declare(engine, remove_every=remove_every, window_rows=window_rows)
                start_serving(engine, serve, serve_host, console.print)
                with _progress(console) as bar:
                    task = bar.add_task("votes", total=n_votes)
                    result = run_voter(engine, votes, batch_size, progress=lambda done, _:
                                       bar.update(task, completed=done))
                console.print(leaderboard_view(leaderboard(engine), window_rows))
                console.print(run_summary(result))
        except (duckdb.IOException, duckdb.ConnectionException) as exc:
            raise click.ClickException(str(explain(path, exc))) from None
        except SStoreError as exc:
            raise click.ClickException(str(exc)) from None
        except duckdb.Error as exc:
            raise click.ClickException(f"{path}: {exc}") from None
    if state:
        console.print(f"Inspect the state file:\n  sstore status {path}\n"
                      f"  sstore query {path} \"SELECT * FROM vote_totals\"", soft_wrap=True)


@main.command(name="status", context_settings=CONTEXT)
@click.argument("state", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status_command(state: str, as_json: bool) -> None:
    """Show a state file's dataflow, progress, streams and recent errors.

    Reads STATE read-only: procedures in dataflow order with the streams they read and
    write, the last batch each one committed and when, stream and window sizes, and the
    latest errors. While a process runs the dataflow it holds the file (DuckDB allows one
    writer and no readers meanwhile): if that process serves (--serve PORT,
    sstore.observe.serve), the status comes from it, live, with rates and sink lags;
    otherwise this fails and says so.
    """
    try:
        status = file_status(state)
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(to_json(status.to_dict()))
    else:
        Console(highlight=False).print(status_view(status))


@main.command(name="resume", context_settings=CONTEXT)
@click.argument("state", type=click.Path(dir_okay=False))
@click.argument("procedure")
@json_option
def resume_command(state: str, procedure: str, as_json: bool) -> None:
    """Let a halted procedure, or a halted sink (a consumer such as migrator:SCHEMA.TABLE),
    run again: its next start retries the failed batch.

    A procedure or sink halted by an error stays halted in STATE across restarts, so that a
    fix can be made first. This deletes the halt; the program that owns STATE (or the next
    `sstore migrate`) then runs it again from the batch that failed. STATE must not be open
    in another process.
    """
    if not os.path.exists(state):
        raise click.ClickException(f"no state file at {state}")
    try:
        with Engine.open_existing(state) as engine:
            status = engine.status()
            halts = {p.name: p.halted for p in status.procedures}
            halts.update({c.consumer: c.halted for c in status.consumers})
            if procedure not in halts:
                raise click.ClickException(
                    f"{state} has no procedure or consumer {procedure!r}; procedures: "
                    f"{', '.join(p.name for p in status.procedures) or 'none'}; consumers: "
                    f"{', '.join(sorted({c.consumer for c in status.consumers})) or 'none'}")
            resumed = engine.resume(procedure)
    except duckdb.Error as exc:
        raise click.ClickException(str(explain(state, exc))) from None
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(to_json({"state": state, "name": procedure, "resumed": resumed,
                            "was_halted_at": halts[procedure] if resumed else None}))
    elif not resumed:
        click.echo(f"{procedure!r} is not halted; nothing to resume")
    else:
        click.echo(f"resumed {procedure!r} (was halted at {halts[procedure]}); it runs again "
                   f"on its next start")


@main.command(name="query", context_settings=CONTEXT)
@click.argument("args", nargs=-1, required=True, metavar="[STATE] SQL")
@catalog_option
@click.option("--explain", is_flag=True, help="Print the plans and their estimated costs.")
@click.option("--analyze", is_flag=True,
              help="With --explain: run the query first, then show its measured time too.")
@click.option("--plan", "plan_name", default=None,
              help="Run this plan (a name --explain lists) instead of the cheapest.")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="How often this query will run (a cached migration may pay off).")
@click.option("--replace", is_flag=True,
              help="Let bdcast(...) replace the table an earlier cast of the same name made.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True, help="Output format.")
def query_command(args: tuple[str, ...], catalog: str, explain: bool, analyze: bool,
                  plan_name: str | None, repeats: int, replace: bool, fmt: str) -> None:
    """Run SQL across the polystore's engines, or over one state file, and print the rows.

    Only queries run (SELECT, WITH, UNION/INTERSECT/EXCEPT, VALUES): anything else, and any
    function that reads files, is refused before it reaches an engine.

    \b
    With one argument, SQL over the names of the polystore catalog: plain SQL, or BigDAWG's
    island syntax bdrel(...), bdstream(...), bdcast(query, name, engine). A query that touches
    one engine runs there whole; otherwise the planner picks a plan by its calibrated costs
    (see `sstore polystore --help`). bdcast creates a NEW table in the engine's sstore_scratch
    schema; --replace lets it replace an earlier cast of that name.
      sstore query "SELECT count(*) FROM orders"
      sstore query --explain "SELECT * FROM orders WHERE o_carrier_id = 3"
      sstore query --explain --analyze "SELECT count(*) FROM orders"   # + measured time
    With two arguments, read-only SQL over one engine state file: stream tables, window
    views, your tables and the engine's own (sstore_sys.commits, ...).
      sstore query voter.duckdb "SELECT * FROM vote_totals"
    """
    if len(args) > 2:
        raise click.UsageError("give SQL, or a STATE file and SQL (quote the SQL)")
    if replace and len(args) == 2:
        raise click.UsageError("--replace is for bdcast in catalog queries; a state file is "
                               "only read")
    try:
        if len(args) == 2:
            table = query_file(args[0], args[1])
        else:
            from sstore.polystore import Polystore
            with Polystore(catalog) as polystore:
                if explain:
                    if analyze:  # EXPLAIN ANALYZE: the plan runs, its time is shown
                        polystore.query(args[0], plan=plan_name, repeats=repeats,
                                        replace=replace)
                    click.echo(polystore.explain(args[0], repeats=repeats))
                    return
                table = polystore.query(args[0], plan=plan_name, repeats=repeats,
                                        replace=replace)
    except ReadOnlyQueryError as exc:
        raise click.ClickException(f"query failed: {exc}") from None
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    except duckdb.Error as exc:
        raise click.ClickException(f"query failed: {exc}") from None
    if fmt == "csv":
        click.echo(to_csv(table), nl=False)
    elif fmt == "json":
        click.echo(to_json(table))
    else:
        Console(highlight=False).print(arrow_table(table))
        click.echo(f"({table.num_rows:,} row{'' if table.num_rows == 1 else 's'})")


@main.command(context_settings=CONTEXT)
@click.argument("state", type=click.Path(dir_okay=False))
@click.option("--stream", required=True, help="The stream to move.")
@postgres_option
@click.option("--table", required=True, help="Target table, SCHEMA.TABLE (created if missing).")
@click.option("--mode", type=click.Choice(["append", "merge"]), default="append",
              show_default=True, help="append new rows, or merge rows by --key.")
@click.option("--key", default="", help="Key columns for merge, comma-separated.")
@click.option("--chunk-rows", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Rows per PostgreSQL transaction (whole batches; never split).")
@click.option("--attempts", type=click.IntRange(min=1), default=RetryPolicy().attempts,
              show_default=True,
              help="Tries in all for a transient PostgreSQL failure (a server away or "
                   "restarting) before giving up; the waits between them double from "
                   f"{RetryPolicy().first_delay:g} s to at most {RetryPolicy().max_delay:g} s. "
                   "1: give up at the first failure.")
@click.option("--batch-column", default=None, metavar="COL",
              help="Target column for each row's batch id (created with the table if it "
                   "is missing). Default: the table's _batch_id column if it has one (as a "
                   "program's sink with batch_column=\"_batch_id\" makes it), else none.")
@click.option("--accept-gap", is_flag=True,
              help="Start even if the engine already removed batches the target lacks; the "
                   "gap is recorded and shown by `sstore status`.")
@click.option("--reset", is_flag=True,
              help="Forget what this target was given (its watermarks and this consumer's "
                   "acknowledgements) and deliver every batch the engine still has again. "
                   "Refused, nothing forgotten, while the table holds rows that would be "
                   "appended twice: TRUNCATE it first, or reset with --mode merge --key "
                   "COLUMNS (a primary key or unique constraint on them) to put back only "
                   "what is missing; and while it holds rows of intervals sealed by a stream "
                   "or replaced by `sstore backfill`.")
@json_option
def migrate(state: str, stream: str, url: str | None, table: str, mode: str, key: str,
            chunk_rows: int, attempts: int, batch_column: str | None, accept_gap: bool,
            reset: bool, as_json: bool) -> None:
    """Move a stream's committed batches into PostgreSQL, exactly once, then exit.

    Each chunk is loaded with binary COPY together with a watermark row (keyed by this state
    file's identity, the stream and the table) in one PostgreSQL transaction; the engine keeps
    the batches until PostgreSQL has committed them. Run it again at any time (or after a
    crash): it continues from the watermark. It refuses, and moves nothing, when the engine
    already removed batches the target lacks (see --accept-gap) or when the table already
    holds this stream from another state file (see --reset). The state file must not be open
    in another process.

    --attempts bounds how long an unreachable server is waited for: the default rides out a
    server restart; a script that must fail fast passes fewer.

    A table a program's sink made with a batch column (_batch_id) gets each row's batch id
    there too, never NULL: split objects, cached copies and backfills read it.
    """
    from migrators import StreamToPostgres  # PostgreSQL clients load only when needed

    console = Console(highlight=False, stderr=as_json)
    keys = tuple(k.strip() for k in key.split(",") if k.strip())
    if not os.path.exists(state):  # before a private PostgreSQL is started for nothing
        raise click.ClickException(f"no state file at {state}")
    url = warehouse(url)
    try:
        with Engine.open_existing(state) as engine:
            migrator = StreamToPostgres(engine, stream, url, table, mode, keys, chunk_rows,
                                        batch_column=batch_column,
                                        detect_batch_column=batch_column is None,
                                        retry=RetryPolicy(attempts=attempts),
                                        accept_gap=accept_gap)
            if reset:
                forgotten = migrator.reset()
                console.print(f"Reset {table}: forgot {forgotten} watermark(s); every batch "
                              f"the engine still has is delivered again.")
            with _progress(console) as bar:
                task = bar.add_task("rows", total=None)
                report = migrator.run_once(
                    progress=lambda done, total: bar.update(task, completed=done, total=total))
    except (duckdb.IOException, duckdb.ConnectionException) as exc:
        raise click.ClickException(str(explain(state, exc))) from None
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(to_json({"state": state, "stream": stream, "table": table,
                            "rows": report.rows, "batches": report.batches,
                            "chunks": report.chunks, "retries": report.retries,
                            "watermark": report.watermark,
                            "seconds": round(report.seconds, 3)}))
        return
    console.print(f"Moved {report.rows:,} rows in {report.batches:,} batches "
                  f"({report.chunks} chunks, {report.retries} retries) to {table} in "
                  f"{report.seconds:.2f} s; watermark at batch {report.watermark}.")


@main.group(context_settings=CONTEXT)
def consumers() -> None:
    """External consumers of a state file's streams (sinks, migrations) and their holds.

    A consumer holds its stream: the engine keeps every batch until the consumer has
    acknowledged it. A consumer nobody runs any more keeps holding; drop it to let the
    engine collect its batches.
    """


@consumers.command(name="list", context_settings=CONTEXT)
@click.argument("state", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the consumers as JSON.")
def consumers_list(state: str, as_json: bool) -> None:
    """List every consumer: its stream, last acknowledged batch, batches waiting, gaps."""
    try:
        status = file_status(state)
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(to_json([vars(c) for c in status.consumers]))
    else:
        Console(highlight=False).print(consumers_view(status.consumers))


@consumers.command(name="drop", context_settings=CONTEXT)
@click.argument("state", type=click.Path(dir_okay=False))
@click.argument("consumer")
@click.option("--stream", default=None,
              help="Only its hold on this stream (default: every stream it holds).")
def consumers_drop(state: str, consumer: str, stream: str | None) -> None:
    """Drop CONSUMER's holds: the engine no longer keeps batches for it."""
    try:
        with Engine.open_existing(state) as engine:
            held = [c.stream for c in engine.consumers() if c.consumer == consumer
                    and (stream is None or c.stream == stream)]
            if not held:
                known = sorted({c.consumer for c in engine.consumers()})
                raise click.ClickException(f"no consumer {consumer!r}"
                                           f"{f' on stream {stream!r}' if stream else ''}; "
                                           f"consumers: {', '.join(known) or 'none'}")
            for name in held:
                engine.drop_consumer(name, consumer)
    except (duckdb.IOException, duckdb.ConnectionException) as exc:
        raise click.ClickException(str(explain(state, exc))) from None
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"Dropped {consumer} from {', '.join(held)}.")


def _attach_workloads() -> None:
    from sstore.cli.backfill import backfill
    from sstore.cli.dead_letters import dead_letters
    from sstore.cli.icu import icu
    from sstore.cli.polystore import polystore
    from sstore.cli.postgres import postgres
    from sstore.cli.tpcdi import tpcdi
    main.add_command(tpcdi)
    main.add_command(icu)
    main.add_command(polystore)
    main.add_command(dead_letters)
    main.add_command(postgres)
    main.add_command(backfill)


_attach_workloads()


@contextlib.contextmanager
def _state_path(state: str | None) -> Iterator[str]:
    """The given state file, or one in a temporary directory removed afterwards."""
    if state is not None:
        yield state
        return
    with tempfile.TemporaryDirectory(prefix="sstore-demo-") as tmp:
        yield os.path.join(tmp, "voter.duckdb")


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    console=console, transient=False, disable=not progress_bars())


if __name__ == "__main__":
    main()
