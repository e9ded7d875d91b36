"""``sstore tpcdi audit``: run the DimTrade audit and show it as a table.

Only parses options and formats the report; the checks live in ``audit``. Exit status 0 when no
check failed, 1 when one did (the failed checks are named on the last line, for logs and CI),
and 1 with a one-line ``Error: ...`` when the audit cannot run at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sstore.base.errors import SStoreError
from sstore.cli.format import TABLE_STYLE
from sstore.cli.options import CONTEXT, json_option, postgres_option, warehouse

if TYPE_CHECKING:
    from sstore.workloads.tpcdi.audit import AuditReport

_OUTCOME = {"pass": Text("OK", "green"), "fail": Text("FAIL", "bold red"),
            "skip": Text("skipped", "yellow")}


def report_table(report: AuditReport) -> Table:
    """One row per check: result, observed and expected numbers, what it checks."""
    table = Table(title=f"TPC-DI audit of DimTrade, schema {report.schema}",
                  caption=f"expected numbers from {report.expectations}",
                  caption_justify="left", **TABLE_STYLE)  # type: ignore[arg-type]
    table.add_column("check", no_wrap=True)
    table.add_column("batch", justify="right")
    table.add_column("result", no_wrap=True)
    table.add_column("observed", justify="right")
    table.add_column("expected", justify="right")
    table.add_column("what it checks")
    for c in report.checks:
        table.add_row(c.name, "" if c.batch is None else str(c.batch), _OUTCOME[c.outcome],
                      "" if c.observed is None else f"{c.observed:,}",
                      "" if c.expected is None else f"{c.expected:,}", c.description)
    return table


@click.command("audit", context_settings=CONTEXT)
@postgres_option
@click.option("--schema", default="tpcdi", show_default=True, help="Schema of the warehouse.")
@click.option("--input", "data_dir", type=click.Path(exists=True, file_okay=False),
              default=None, metavar="DIR",
              help="Generator output (Batch1/, Batch2/, ... with *_audit.csv) for the expected "
                   "numbers. Default: the warehouse's audit table.")
@json_option
def audit_command(url: str | None, schema: str, data_dir: str | None, as_json: bool) -> None:
    """Check a TPC-DI warehouse's DimTrade the way TPC-DI Appendix A does.

    Row, canceled and alert counts against the generator's audit numbers; unique TradeIDs;
    every surrogate key joined to a dimension version valid on the create date; close dates
    inside the batch window; Status and Type names; alerts per batch in DImessages.
    """
    import psycopg

    from migrators.urls import parse
    from sstore.workloads.tpcdi.audit import run_audit

    url = warehouse(url)
    try:
        report = run_audit(url, schema, data_dir)
    except (SStoreError, psycopg.Error, ValueError) as exc:
        raise click.ClickException(f"{exc} (PostgreSQL {parse(url).redacted()})") from exc
    if as_json:
        from dataclasses import asdict

        from sstore.cli.format import to_json
        click.echo(to_json({**asdict(report), "ok": report.ok}))
        if not report.ok:
            click.get_current_context().exit(1)
        return
    console = Console(highlight=False)
    if not console.is_terminal:     # logs and pipes: wide enough for one line per check
        console.width = 120
    console.print(report_table(report))
    counts = {k: sum(c.outcome == k for c in report.checks) for k in _OUTCOME}
    console.print(f"{len(report.checks)} checks: {counts['pass']} passed, {counts['fail']} "
                  f"failed, {counts['skip']} skipped.")
    if not report.ok:
        names = sorted({c.name + ("" if c.batch is None else f" (batch {c.batch})")
                        for c in report.failed})
        console.print(Text("Failed: " + "; ".join(names), "bold red"), soft_wrap=True)
        click.get_current_context().exit(1)
