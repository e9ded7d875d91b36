"""``sstore icu ...``: the ICU monitoring workload (docs/icu.md) from the command line."""

from __future__ import annotations

from typing import Any

import click

from sstore.cli.options import CONTEXT, postgres_option, warehouse
from sstore.execution.stopping import command_stops
from sstore.observe.options import serve_options, start_serving

KIND_STYLE = {"low_pap": "bold magenta", "tachycardia": "bold red",
              "bradycardia": "bold blue", "irregular_rhythm": "bold yellow"}


@click.group(context_settings=CONTEXT)
def icu() -> None:
    """ICU monitoring: vital signs of N patients, per-patient event-time windows, one alert
    per episode (low mean pulmonary arterial pressure, abnormal heart rate, irregular rhythm).

    \b
    Try it:
      sstore icu demo --patients 50 --seconds 900

    demo uses --postgres URL, else $SSTORE_POSTGRES_URL, else the local server or a private
    one (`sstore postgres --help`).
    """


@icu.command(name="demo", context_settings=CONTEXT)
@postgres_option
@click.option("--patients", type=click.IntRange(min=1), default=40, show_default=True,
              help="How many patients to monitor.")
@click.option("--seconds", type=click.IntRange(min=300), default=900, show_default=True,
              help="Seconds of event time (one reading per patient per second).")
@click.option("--speed", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Replay speed: event-time seconds per wall second (0: as fast as it goes).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the generator (same seed, same readings and episodes).")
@click.option("--schema", default="icu_demo", show_default=True,
              help="Warehouse schema (dropped and built anew unless --state is given).")
@click.option("--state", type=click.Path(dir_okay=False), default=None,
              help="State file to use and keep (default: a temporary one). Running again "
                   "with the same file resumes; nothing is sent or alerted twice.")
@serve_options
def demo_command(url: str | None, patients: int, seconds: int, speed: float, seed: int,
                 schema: str, state: str | None, serve: int | None, serve_host: str) -> None:
    """Stream generated vital signs with injected episodes and noise; show alerts live.

    Each alert is printed when the transaction that raised it commits (a subscriber); alerts,
    per-patient window aggregates, rejected and too-late readings go into PostgreSQL. At the
    end the alerts are checked against the episodes the generator injected.
    """
    from rich.console import Console
    from rich.table import Table

    from sstore.base.errors import SStoreError
    from sstore.workloads.icu.demo import run_demo

    console = Console(highlight=False)
    url = warehouse(url)
    console.print(f"[bold]ICU demo[/]: {patients} patients, {seconds} s of event time at "
                  f"{'full speed' if speed <= 0 else f'{speed:g}x'}; warehouse schema "
                  f"{schema}")

    def alert(row: dict[str, Any]) -> None:
        style = KIND_STYLE.get(row["kind"], "bold")
        console.print(f"[{style}]ALERT[/] #{row['alert_id']} patient {row['patient']} "
                      f"[{style}]{row['kind']}[/] {row['window_start']:%H:%M:%S}-"
                      f"{row['window_end']:%H:%M:%S} {row['value']:.2f} "
                      f"(limit {row['threshold']:g})")

    with command_stops():
        try:
            report = run_demo(url, patients, seconds, seed=seed, speed=speed, schema=schema,
                              state=state, on_alert=alert,
                              on_engine=lambda engine: start_serving(
                                  engine, serve, serve_host, console.print))
        except SStoreError as exc:
            raise click.ClickException(str(exc)) from None
    c, gen = report.counts, report.generated
    table = Table(title="readings")
    for column in ("in", "clean", "rejected", "duplicates", "windowed", "too late"):
        table.add_column(column, justify="right")
    table.add_row(*(f"{c[k]:,}" for k in ("rows_in", "clean", "rejected", "duplicates",
                                          "windowed", "late")))
    console.print(table)
    where = Table(title="in PostgreSQL")
    where.add_column("table")
    where.add_column("rows", justify="right")
    for name, n in report.warehouse_rows.items():
        where.add_row(name, f"{n:,}")
    console.print(where)
    ok = report.verdict.ok
    verdict = ("[bold green]each episode alerted exactly once, no false alert[/]" if ok else
               f"[bold red]{report.verdict.describe(gen.episodes)}[/]")
    console.print(f"{len(report.alerts)} alerts for {len(gen.episodes)} injected episodes in "
                  f"{report.seconds:.1f} s: " + verdict)
    if not ok:
        click.get_current_context().exit(1)
