"""``sstore backfill ...``: rebuild streamed intervals of the warehouse with Spark.

A thin group over ``sstore.workloads.tpcdi.backfill`` (the TPC-DI DimTrade) and
``migrators.backfill`` (the versions); both are imported only when a command runs.
"""

from __future__ import annotations

from typing import Any

import click

from sstore.cli.options import CONTEXT, json_option, postgres_option, warehouse


@click.group(context_settings=CONTEXT,
             short_help="Rebuild a streamed TPC-DI batch with Spark; swap it in atomically.")
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
      sstore backfill status

    A batch the stream has not finished is refused (nothing changes); running the same
    backfill again writes the same rows and bumps the version. See docs/tpcdi.md, "Backfill".
    """


@backfill.command(name="run", context_settings=CONTEXT,
                  short_help="Rebuild TPC-DI batches with Spark and replace their rows.")
@click.option("--input", "data_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="The TPC-DI data set the stream loaded (Batch1, Batch2, ...).")
@click.option("--batch", "batches", type=click.IntRange(min=1), multiple=True, required=True,
              help="TPC-DI batch to rebuild; repeat for several (each is its own "
                   "transaction, in the order given).")
@click.option("--schema", default="tpcdi", show_default=True, help="Warehouse schema.")
@postgres_option
@json_option
def run_command(data_dir: str, batches: tuple[int, ...], schema: str, url: str | None,
                as_json: bool) -> None:
    """Rebuild TPC-DI batches of DimTrade with Spark and replace the streamed rows.

    Spark replays the batch's trades from the source files (their events of the earlier
    batches too, for the state before it), with the dimensions as they were after that
    batch; the result is staged into PostgreSQL by binary COPY, then swapped in: delete the
    batch's rows, insert the rebuilt ones, bump the version, one COMMIT. A trade that a later
    batch has updated since keeps its later row. Spark's master: $SSTORE_SPARK_MASTER, else
    local[*].
    """
    from sstore.errors import SStoreError
    from sstore.workloads.tpcdi.backfill import backfill_batch

    url = warehouse(url)
    reports: list[dict[str, Any]] = []
    try:
        for batch in batches:  # Spark starts only once a batch passes the seal check
            reports.append(backfill_batch(None, data_dir, url, schema, batch).to_dict())
            if not as_json:
                _say(reports[-1])
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        from sstore.cli.format import to_json
        click.echo(to_json(reports))


def _say(report: dict[str, Any]) -> None:
    click.echo(f"Batch{report['batch']} of {report['schema']}: now version "
               f"{report['version']} ({sum(report['seconds'].values()):.1f} s)")
    for t in report["tables"]:
        click.echo(f"  {t['table']}: {t['rows_deleted']:,} rows out, {t['rows_inserted']:,} "
                   f"in, {t['rows_kept_newer']:,} kept (a later batch updated them), "
                   f"{t['rows_after']:,} in the batch now")


@backfill.command(name="status", context_settings=CONTEXT,
                  short_help="The intervals' versions (sstore.intervals).")
@click.option("--schema", default=None, help="Only this warehouse schema (default: all).")
@postgres_option
@json_option
def status_command(schema: str | None, url: str | None, as_json: bool) -> None:
    """The intervals recorded in sstore.intervals: version, who wrote it last, rows."""
    from migrators import backfill as intervals
    from migrators.postgres import connect
    from sstore.errors import SStoreError

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
    for name in ("target", "interval", "version", "source", "rows", "replaced_at"):
        table.add_column(name, justify="right" if name in ("version", "rows") else "left")
    for r in rows:
        table.add_row(str(r["target"]), str(r["interval"]), str(r["version"]),
                      str(r["source"]), f"{r['rows']:,}", f"{r['replaced_at']:%Y-%m-%d %H:%M:%S}")
    Console(highlight=False).print(table)
