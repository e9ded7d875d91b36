"""``sstore tpcdi ...``: the TPC-DI DimTrade workload from the command line.

A thin group: generate and audit have modules of their own (``tpcdi_generate``,
``tpcdi_audit``); the workload's library code (``sstore.workloads.tpcdi``) is imported only
when a command runs, so ``sstore --help`` does not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from sstore.cli.options import CONTEXT, json_option, postgres_option, warehouse
from sstore.cli.tpcdi_audit import audit_command
from sstore.cli.tpcdi_generate import generate_command
from sstore.execution.stopping import StopSignal, command_stops
from sstore.observe.options import serve_options, start_serving

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console
    from rich.progress import Progress, TaskID

    from sstore.workloads.tpcdi.spark_pipeline import SparkReport
    from sstore.workloads.tpcdi.spark_streaming.run import SparkStreamingReport
    from sstore.workloads.tpcdi.streaming.pipeline import StreamingReport


@click.group(context_settings=CONTEXT)
def tpcdi() -> None:
    """TPC-DI DimTrade: generate source data, load the warehouse, audit it.

    \b
    Try it:
      sstore tpcdi generate --scale-factor 0.1 --output /tmp/tpcdi
      sstore tpcdi run --input /tmp/tpcdi
      sstore tpcdi audit --input /tmp/tpcdi

    run, audit and demo use --postgres URL, else $SSTORE_POSTGRES_URL, else the local server
    or a private one (`sstore postgres --help`).
    """


tpcdi.add_command(generate_command, name="generate")
tpcdi.add_command(audit_command, name="audit")


@tpcdi.command(name="run", context_settings=CONTEXT)
@click.option("--input", "data_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="A TPC-DI data set (Batch1, Batch2, Batch3), e.g. from `sstore tpcdi generate`.")
@postgres_option
@click.option("--mode", type=click.Choice(["streaming", "spark-streaming", "spark"]),
              default="streaming", show_default=True,
              help="The engine's dataflow of five procedures, the same five steps on Spark "
                   "Structured Streaming (master: $SSTORE_SPARK_MASTER, else local[2]), or "
                   "Spark bulk. See docs/scaling.md.")
@click.option("--batch-size", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Streaming: trade events per engine batch; spark-streaming: per "
                   "micro-batch.")
@click.option("--schema", default="tpcdi", show_default=True, help="Warehouse schema.")
@click.option("--state", type=click.Path(dir_okay=False), default=None,
              help="Streaming: the engine's state file (default: STATE.duckdb in --input). "
                   "Running again on the same file changes nothing: exactly once.")
@click.option("--checkpoint", type=click.Path(file_okay=False), default=None,
              help="spark-streaming: the query's directory (watched inbox, checkpoint), on "
                   "storage every Spark node reads (default: SSS in --input). Running again "
                   "with the same directory resumes; nothing is written twice.")
@json_option
@serve_options
def run_command(data_dir: str, url: str | None, mode: str, batch_size: int, schema: str,
                state: str | None, checkpoint: str | None, as_json: bool, serve: int | None,
                serve_host: str) -> None:
    """Load DimTrade and its dimensions into the PostgreSQL warehouse.

    Every mode builds the dimensions with PySpark. Streaming then sends Batch1's trades in
    time order, and the Batch2/Batch3 CDC rows, through five stored procedures (S-Store's
    split), moving results into PostgreSQL with the exactly-once migrator. spark-streaming
    runs the same five steps on Spark Structured Streaming (a file of --batch-size events per
    micro-batch, exactly once by batchId). Spark mode does the same work as bulk Spark jobs.
    All give identical dimtrade and dimessages tables.

    Ctrl-C (SIGINT) or SIGTERM stops it cleanly (exit status 130 or 143): the engine's
    transaction in flight and running Spark jobs are cancelled and roll back, the sinks finish
    the chunk they are moving; run the same command again to resume.
    """
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, stderr=as_json)
    on_command_line = click.get_current_context().get_parameter_source("url") \
        is click.core.ParameterSource.COMMANDLINE
    url = warehouse(url)
    with command_stops() as stop:
        stop.on_stop(_cancel_spark_jobs)
        report = _run(stop, console, data_dir, url, mode, batch_size, schema, state,
                      checkpoint, serve, serve_host)
    if as_json:
        from dataclasses import asdict

        from sstore.cli.format import to_json
        result = {k: v for k, v in asdict(report).items() if k != "batch_latencies"}
        click.echo(to_json({"mode": mode, "schema": schema, "input": data_dir, **result,
                            "seconds": round(report.seconds, 3)}))
        return
    table = Table(title=f"TPC-DI DimTrade, {mode} mode")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    for phase, seconds in report.phases.items():
        table.add_row(phase, f"{seconds:.2f}")
    table.add_row("total", f"{report.seconds:.2f}")
    console.print(table)
    console.print(f"Check it: sstore tpcdi audit{' --postgres URL' if on_command_line else ''} "
                  f"--schema {schema} --input {data_dir}", soft_wrap=True)


def _run(stop: StopSignal, console: Console, data_dir: str, url: str, mode: str,
         batch_size: int, schema: str, state: str | None, checkpoint: str | None,
         serve: int | None, serve_host: str) -> Any:
    """``run_command``'s work, inside its clean-stop block."""
    import os

    from sstore.base.errors import SStoreError
    from sstore.workloads.tpcdi.warehouse import create_warehouse

    report: StreamingReport | SparkStreamingReport | SparkReport
    try:
        create_warehouse(url, schema)
        with _phase_bar(console) as bar:
            progress = _phase_progress(bar, stop)
            if mode == "streaming":
                from sstore.workloads.tpcdi.streaming.pipeline import StreamingDimTrade
                run = StreamingDimTrade(data_dir, url,
                                        state or os.path.join(data_dir, "STATE.duckdb"),
                                        schema, batch_size, progress)
                try:
                    start_serving(run.engine, serve, serve_host, bar.console.print)
                    report = run.run()
                    status = run.engine.status()
                    if status.halted():
                        raise click.ClickException(f"the DimTrade dataflow halted: "
                                                   f"{status.halt_report()}")
                finally:
                    run.close()
            elif mode == "spark-streaming":
                from sstore.workloads.tpcdi.spark_streaming.run import (
                    SparkStreamingDimTrade,
                )
                sss = SparkStreamingDimTrade(data_dir, url,
                                             checkpoint or os.path.join(data_dir, "SSS"),
                                             schema, batch_size, progress)
                try:
                    report = sss.run()
                finally:
                    sss.close()
            else:
                from sstore.workloads.tpcdi.spark_pipeline import run_spark
                report = run_spark(data_dir, url, schema, progress)
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    return report


@tpcdi.command(name="demo", context_settings=CONTEXT)
@postgres_option
@click.option("--scale-factor", type=click.FloatRange(min=0.01), default=0.03,
              show_default=True, help="TPC-DI scale factor (1 = 130,000 trades).")
@click.option("--batch-size", type=click.IntRange(min=1), default=500, show_default=True,
              help="Trade events per engine batch.")
@click.option("--schema", default="tpcdi_demo", show_default=True,
              help="Warehouse schema (dropped and built anew).")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Where the data, the engine state and the catalog go (default: a new "
                   "temporary directory).")
@serve_options
def demo_command(url: str | None, scale_factor: float, batch_size: int, schema: str,
                 workdir: str | None, serve: int | None, serve_host: str) -> None:
    """A whole TPC-DI DimTrade run, streaming, then queries across the engine and PostgreSQL.

    Generates the data, builds the dimensions (Spark), streams Batch1 and Batch2 through the
    five stored procedures into PostgreSQL, streams Batch3 but keeps it in the engine, asks
    two cross-island queries (a UNION over a split object, a join across engines), migrates
    Batch3 and runs the TPC-DI audit. A few minutes at the default scale factor.

    Ctrl-C (SIGINT) or SIGTERM stops it cleanly (exit status 130 or 143).
    """
    import warnings

    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    from sstore.base.errors import SStoreError
    from sstore.cli.format import arrow_table
    from sstore.cli.tpcdi_audit import report_table
    from sstore.workloads.tpcdi.demo import QueryShown, run_demo
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    console = Console(highlight=False)
    if not console.is_terminal:     # logs and pipes: wide enough for the audit's rows
        console.width = 120

    def show(q: QueryShown) -> None:
        console.print(Panel(q.sql, title=q.title, title_align="left", expand=False))
        console.print(f"  plan: {q.plan}; answered in {q.seconds * 1000:.0f} ms")
        console.print(arrow_table(q.rows))

    url = warehouse(url)
    with command_stops() as stop:
        stop.on_stop(_cancel_spark_jobs)
        try:
            with _phase_bar(console) as bar:
                progress = _phase_progress(bar, stop)

                def say(message: str) -> None:
                    stop.check()
                    bar.console.print(f"[bold cyan]>[/] {message}")

                def show_below_bar(q: QueryShown) -> None:
                    bar.console.print()
                    show(q)

                report = run_demo(url, workdir, scale_factor, batch_size, schema, progress,
                                  say, show=show_below_bar,
                                  on_engine=lambda engine: start_serving(engine, serve,
                                                                         serve_host, say))
        except SStoreError as exc:
            raise click.ClickException(str(exc)) from None
    console.print(report_table(report.audit))  # type: ignore[arg-type]
    table = Table(title="where the time went")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    for phase, seconds in report.phases.items():
        table.add_row(phase, f"{seconds:.1f}")
    console.print(table)
    ok = report.audit is not None and report.audit.ok  # type: ignore[attr-defined]
    console.print("[bold green]audit: all checks pass[/]" if ok else
                  "[bold red]audit: some checks failed[/]")
    if not ok:
        click.get_current_context().exit(1)


def _phase_bar(console: Console) -> Progress:
    """One bar per phase of a run, with counts and the time taken."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from sstore.cli.logs import progress_bars

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                    TextColumn("{task.completed:,}/{task.total:,}"), TimeElapsedColumn(),
                    console=console, transient=False, disable=not progress_bars())


def _phase_progress(bar: Progress, stop: StopSignal) -> Callable[[str, int, int], None]:
    """The ``progress(phase, done, total)`` callback of a run: moves ``bar``, and ends the
    run there (``Stopped``) once a stop was requested."""
    tasks: dict[str, TaskID] = {}

    def progress(phase: str, done: int, total: int) -> None:
        stop.check()
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total)
        bar.update(tasks[phase], completed=done, total=total)

    return progress


def _cancel_spark_jobs() -> None:
    """On a stop: end the process's Spark, if it was started at all. Cancelling the running
    jobs is not enough: a dimension build runs one job after another, and the next one would
    start. The driver's call raises and the load rolls back: the dimension and trade loads
    write PostgreSQL in one transaction each."""
    import sys

    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is not None:
        context.cancelAllJobs()
        context.stop()
