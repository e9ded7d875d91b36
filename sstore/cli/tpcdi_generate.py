"""``sstore tpcdi generate``: the generator from the command line, with a progress bar.

Only option parsing and presentation live here; ``generate`` does the work, so tests and
benchmarks call the same code. Registered in ``sstore.cli.tpcdi`` as a subcommand of ``tpcdi``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from sstore.cli.logs import progress_bars
from sstore.cli.options import CONTEXT

if TYPE_CHECKING:
    from sstore.workloads.tpcdi.generator.report import GenerationReport


def _files(report: GenerationReport) -> Table:
    """Rows and sizes of the data files (the 203 FINWIRE files as one line, audits left out)."""
    table = Table(title=f"TPC-DI source data, SF {report.scale_factor:g}, seed {report.seed}: "
                        f"{report.total_bytes / 1e6:,.1f} MB in {report.seconds:.1f} s")
    table.add_column("file")
    table.add_column("rows", justify="right")
    table.add_column("MB", justify="right")
    finwire = [f for f in report.files if f.path.startswith("Batch1/FINWIRE")
               and not f.path.endswith(".csv")]
    for f in report.files:
        if f.path.endswith("_audit.csv") or f in finwire:
            continue
        table.add_row(f.path, f"{f.rows:,}", f"{f.bytes / 1e6:,.2f}")
    table.add_row(f"Batch1/FINWIRE* ({len(finwire)} files)", f"{sum(f.rows for f in finwire):,}",
                  f"{sum(f.bytes for f in finwire) / 1e6:,.2f}")
    return table


def _trades(report: GenerationReport) -> Table:
    """The DimTrade audit counts per batch."""
    table = Table(title="Trade.txt per batch")
    for name in ("batch", "rows", "new trades", "canceled", "commission alerts", "fee alerts"):
        table.add_column(name, justify="right")
    for batch, c in sorted(report.trades.items()):
        table.add_row(str(batch), f"{c.records:,}", f"{c.new:,}", f"{c.canceled:,}",
                      f"{c.invalid_commission:,}", f"{c.invalid_charge:,}")
    return table


@click.command("generate", context_settings=CONTEXT)
@click.option("--scale-factor", "-s", "scale_factor", type=float, default=1.0,
              show_default=True, help="TPC-DI scale factor: 130,000 x SF Batch1 trades.")
@click.option("--output", "-o", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Directory to write Batch1/, Batch2/, Batch3/ into.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Random seed (same seed, byte-identical files).")
@click.option("--bad-rows", type=click.IntRange(min=0), default=0, show_default=True,
              help="Malformed rows to inject into Batch2/3 Trade.txt (listed in bad_rows.json).")
def generate_command(scale_factor: float, output: Path, seed: int, bad_rows: int) -> None:
    """Write TPC-DI source files for DimTrade in DIGen's layouts.

    Batch1 (history up to 2017-07-07), Batch2 and Batch3 (incremental CDC for 2017-07-08 and
    2017-07-09): reference files, HR.csv, FINWIRE, CustomerMgmt.xml, Customer.txt,
    Account.txt, Trade.txt, TradeHistory.txt and the audit CSVs.
    """
    from sstore.workloads.tpcdi.generator.build import STEPS, generate
    from sstore.workloads.tpcdi.generator.scale import MIN_SCALE_FACTOR

    if not scale_factor >= MIN_SCALE_FACTOR:
        raise click.BadParameter(f"{scale_factor:g} is below the smallest scale factor, "
                                 f"{MIN_SCALE_FACTOR:g}", param_hint="'--scale-factor'")
    console = Console(highlight=False)
    columns = (TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, disable=not progress_bars()) as bar:
            task = bar.add_task("starting", total=len(STEPS))
            report = generate(scale_factor, output, seed=seed, bad_rows=bad_rows,
                              progress=lambda step, done, total: bar.update(
                                  task, description=step, completed=done, total=total))
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    console.print(_files(report))
    console.print(_trades(report))
    console.print(f"Written to {report.output}")
