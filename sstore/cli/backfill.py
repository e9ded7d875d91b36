"""``sstore backfill ...``: rebuild streamed intervals of the warehouse with Spark.

A thin group over ``sstore.workloads.tpcdi.backfill`` (the TPC-DI DimTrade) and
``migrators.backfill`` (the versions); both are imported only when a command runs.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from typing import Any

import click

from sstore.cli.options import CONTEXT, json_option, postgres_option, warehouse


@click.group(context_settings=CONTEXT,
             short_help="Rebuild streamed TPC-DI intervals with Spark; swap them in atomically.")
def backfill() -> None:
    """Rebuild an interval the stream loaded, with Spark, and swap it in atomically.

    The streaming DimTrade (`sstore tpcdi run`) loads the warehouse batch by batch and seals
    each TPC-DI batch once all of it is in PostgreSQL. A backfill rebuilds a sealed batch
    from the source files with the Spark rules and replaces the batch's rows (DimTrade rows
    whose batchid is the batch, and its DimTrade alerts) in ONE transaction: readers see the
    batch all old or all new, and the stream keeps loading later batches meanwhile. Each
    replace bumps the batch's version in sstore.intervals.

    \b
    Try it:
      sstore tpcdi run --input /tmp/tpcdi
      sstore backfill run --input /tmp/tpcdi --batch 2
      sstore backfill run --input /tmp/tpcdi --batches 2-3
      sstore backfill run --input /tmp/tpcdi --from-date 2017-07-07 --to-date 2017-07-08
      sstore backfill status

    A batch the stream has not finished is refused (nothing changes); running the same
    backfill again writes the same rows and bumps the version. See docs/tpcdi.md, "Backfill".
    """


@backfill.command(name="run", context_settings=CONTEXT,
                  short_help="Rebuild TPC-DI batches or a date range with Spark; swap it in.")
@click.option("--input", "data_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="The TPC-DI data set the stream loaded (Batch1, Batch2, ...).")
@click.option("--batch", "batches", type=click.IntRange(min=1), multiple=True,
              help="TPC-DI batch to rebuild; repeat for several (each is its own "
                   "transaction, in the order given).")
@click.option("--batches", "batch_range", metavar="FIRST-LAST", default=None,
              help="A range of TPC-DI batch ids, e.g. 2-3: rebuilt in one replay and replaced "
                   "in ONE transaction (each batch's version bumped).")
@click.option("--from-date", type=click.DateTime(["%Y-%m-%d"]), default=None,
              help="First day (YYYY-MM-DD) of a date range: the DimTrade rows of trades "
                   "created on those days and the alerts of events on them.")
@click.option("--to-date", type=click.DateTime(["%Y-%m-%d"]), default=None,
              help="Last day of the date range (inclusive); needs --from-date.")
@click.option("--schema", default="tpcdi", show_default=True, help="Warehouse schema.")
@postgres_option
@json_option
def run_command(data_dir: str, batches: tuple[int, ...], batch_range: str | None,
                from_date: dt.datetime | None, to_date: dt.datetime | None, schema: str,
                url: str | None, as_json: bool) -> None:
    """Rebuild an interval of the streamed DimTrade with Spark and replace its rows.

    Name the interval one way: --batch N (repeatable), --batches FIRST-LAST, or
    --from-date D --to-date D. Spark replays the interval's trades from the source files
    (their events of the earlier batches too, for the state before it), with the dimensions
    as they were after each batch; the result is staged into PostgreSQL by binary COPY, then
    swapped in: delete the interval's rows, insert the rebuilt ones, bump its version, one
    COMMIT. A trade that a later batch has updated since keeps its later row. A date range
    is rebuilt from every batch the stream has sealed, and is recorded as its own interval
    ("dates D1..D2"); an interval that overlaps a recorded one with other bounds is refused.
    Spark's master: $SSTORE_SPARK_MASTER, else local[*].
    """
    from sstore.base.errors import SStoreError
    from sstore.workloads.tpcdi import backfill as tpcdi

    first, last = _choose(batches, batch_range, from_date, to_date)
    url = warehouse(url)
    reports: list[dict[str, Any]] = []
    try:
        jobs: list[Callable[[], tpcdi.BackfillReport]]
        if isinstance(first, dt.date) and isinstance(last, dt.date):
            jobs = [functools.partial(tpcdi.backfill_dates, None, data_dir, url, schema, first,
                                      last)]
        elif isinstance(first, int) and isinstance(last, int) and batch_range is not None:
            jobs = [functools.partial(tpcdi.backfill_batches, None, data_dir, url, schema, first,
                                      last)]
        else:
            jobs = [functools.partial(tpcdi.backfill_batch, None, data_dir, url, schema, b)
                    for b in batches]
        for job in jobs:  # Spark starts only once an interval passes the seal check
            reports.append(job().to_dict())
            if not as_json:
                _say(reports[-1])
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        from sstore.cli.format import to_json
        click.echo(to_json(reports))


def _choose(batches: tuple[int, ...], batch_range: str | None, from_date: dt.datetime | None,
            to_date: dt.datetime | None) -> tuple[int | dt.date, int | dt.date]:
    """The interval's bounds from exactly one of --batch, --batches, --from-date/--to-date."""
    dates = from_date is not None or to_date is not None
    given = [name for name, used in (("--batch", bool(batches)),
                                     ("--batches", batch_range is not None),
                                     ("--from-date/--to-date", dates)) if used]
    if len(given) != 1:
        raise click.UsageError(
            "name the interval exactly one way: --batch N (repeatable), --batches FIRST-LAST "
            "or --from-date D --to-date D" + (f" (got {' and '.join(given)})" if given else ""))
    if dates:
        if from_date is None or to_date is None:
            raise click.UsageError("a date range needs both --from-date and --to-date "
                                   "(inclusive; one day: the same date twice)")
        if to_date < from_date:
            raise click.BadParameter(f"{to_date:%Y-%m-%d} is before --from-date "
                                     f"{from_date:%Y-%m-%d}", param_hint="--to-date")
        return from_date.date(), to_date.date()
    if batch_range is not None:
        from sstore.workloads.tpcdi.backfill import parse_batch_range
        try:
            return parse_batch_range(batch_range)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--batches") from None
    return batches[0], batches[-1]


def _say(report: dict[str, Any]) -> None:
    versions = ", ".join(f"{k} v{v}" for k, v in report["versions"].items())
    click.echo(f"{report['interval']} of {report['schema']}: now {versions} "
               f"({sum(report['seconds'].values()):.1f} s)")
    for t in report["tables"]:
        click.echo(f"  {t['table']}: {t['rows_deleted']:,} rows out, {t['rows_inserted']:,} "
                   f"in, {t['rows_kept_newer']:,} kept (a later batch updated them), "
                   f"{t['rows_after']:,} in the interval now")


@backfill.command(name="status", context_settings=CONTEXT,
                  short_help="The intervals' versions (sstore.intervals).")
@click.option("--schema", default=None, help="Only this warehouse schema (default: all).")
@postgres_option
@json_option
def status_command(schema: str | None, url: str | None, as_json: bool) -> None:
    """The intervals recorded in sstore.intervals: version, who wrote it last, rows."""
    from migrators import backfill as intervals
    from migrators.postgres import connect
    from sstore.base.errors import SStoreError

    try:
        with connect(warehouse(url)) as con:
            rows = intervals.versions(con)
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    if schema is not None:
        rows = [r for r in rows if str(r["target"]).startswith(f"{schema}.")]
    if as_json:
        from sstore.cli.format import to_json
        click.echo(to_json(rows))
        return
    if not rows:
        click.echo("No intervals recorded (the stream seals each batch it has delivered).")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="sstore.intervals")
    for name in ("target", "interval", "bounds", "version", "source", "rows", "replaced_at"):
        table.add_column(name, justify="right" if name in ("version", "rows") else "left")
    for r in rows:
        bounds = f"{r['column']} {r['low']}..{r['high']}" if r["column"] else ""
        table.add_row(str(r["target"]), str(r["interval"]), bounds, str(r["version"]),
                      str(r["source"]), f"{r['rows']:,}", f"{r['replaced_at']:%Y-%m-%d %H:%M:%S}")
    Console(highlight=False).print(table)
