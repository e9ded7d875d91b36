"""``sstore polystore ...``: build the catalog, calibrate the cost model, explain queries.

Queries themselves run with ``sstore query SQL``; this group sets up what they need.
"""

from __future__ import annotations

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table

from sstore.base.errors import SStoreError
from sstore.base.extras import require
from sstore.cli.logs import progress_bars
from sstore.cli.options import CONTEXT, json_option, postgres_option, warehouse
from sstore.cli.options import catalog_option as CATALOG


@click.group(context_settings=CONTEXT)
def polystore() -> None:
    """One SQL entry point over the streaming engine, PostgreSQL and Spark.

    \b
    Set up a catalog, then query it with `sstore query`:
      sstore polystore add-postgres pg            (--postgres URL; default: see below)
      sstore polystore add-engine stream state.duckdb
      sstore polystore split orders stream=orders_recent pg=public.orders
      sstore polystore calibrate
      sstore query --explain "SELECT count(*) FROM orders"

    add-postgres and calibrate use --postgres URL, else $SSTORE_POSTGRES_URL, else the local
    server or a private one (`sstore postgres --help`).
    """


def _run(work: object) -> None:
    try:
        work()  # type: ignore[operator]
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None


@polystore.command(name="add-postgres", context_settings=CONTEXT)
@click.argument("name")
@click.argument("location", metavar="[URL]", required=False)
@postgres_option
@click.option("--schema", default="public", show_default=True,
              help="Register this schema's tables as objects.")
@CATALOG
def add_postgres(name: str, location: str | None, url: str | None, schema: str,
                 catalog: str) -> None:
    """Add a PostgreSQL database and register its tables.

    URL (or --postgres) is stored in the catalog as given; env:VAR stores the variable's
    name instead, read at each query (keeps a password out of the catalog file)."""
    from sstore.polystore import Polystore

    given_twice = click.get_current_context().get_parameter_source("url") \
        is ParameterSource.COMMANDLINE
    if location and url and given_twice:
        raise click.UsageError("give the URL once: as URL or as --postgres")
    chosen = location or warehouse(url)

    def work() -> None:
        with Polystore(catalog) as ps:
            names = ps.add_postgres(name, chosen, schema)
        click.echo(f"{name}: {len(names)} tables registered ({', '.join(names[:8])}"
                   f"{', ...' if len(names) > 8 else ''})")
    _run(work)


@polystore.command(name="add-engine", context_settings=CONTEXT)
@click.argument("name")
@click.argument("state", type=click.Path(dir_okay=False, exists=True))
@CATALOG
def add_engine(name: str, state: str, catalog: str) -> None:
    """Add a streaming engine by its state file and register its tables and streams.

    The file is only read (read-only, external access off), here and by later queries."""
    from sstore.polystore import Polystore

    def work() -> None:
        with Polystore(catalog) as ps:
            names = ps.add_state_file(name, state)
        click.echo(f"{name}: {len(names)} tables and streams registered")
    _run(work)


@polystore.command(name="add-spark", context_settings=CONTEXT)
@click.argument("name", default="spark")
@click.option("--master", default="", help="Spark master URL (default: $SSTORE_SPARK_MASTER "
                                           "or local[*]).")
@CATALOG
def add_spark(name: str, master: str, catalog: str) -> None:
    """Let plans use Spark (for inputs too large for one process)."""
    from sstore.polystore import Polystore

    with Polystore(catalog) as ps:
        ps.add_spark(name, master)
    click.echo(f"{name}: Spark added")


@polystore.command(context_settings=CONTEXT)
@click.argument("name")
@click.argument("parts", nargs=-1, required=True, metavar="ENGINE=TABLE...")
@click.option("--disjoint", is_flag=True,
              help="No rows ever move between the parts (no sink delivers an engine stream "
                   "into a PostgreSQL part): needed for a stream and a table no sink links.")
@CATALOG
def split(name: str, parts: tuple[str, ...], disjoint: bool, catalog: str) -> None:
    """Declare NAME as the UNION ALL of tables in several engines, each row counted once (an
    engine stream a sink delivers into a PostgreSQL part is read past the sink's watermark)."""
    from sstore.polystore import Polystore

    fragments = {}
    for part in parts:
        engine, sep, table = part.partition("=")
        if not sep or not engine or not table:
            raise click.UsageError(f"expected ENGINE=TABLE, got {part!r}")
        fragments[engine] = table

    def work() -> None:
        with Polystore(catalog) as ps:
            ps.split(name, fragments, disjoint=disjoint)
        click.echo(f"{name}: split over {', '.join(fragments)}")
    _run(work)


@polystore.command(name="list", context_settings=CONTEXT)
@CATALOG
@json_option
def list_command(catalog: str, as_json: bool) -> None:
    """Show the catalog: engines, objects and where their fragments live."""
    from sstore.polystore import Catalog

    try:
        cat = Catalog(catalog)
    except SStoreError as exc:
        raise click.ClickException(str(exc)) from None
    missing = cat.missing()
    if missing:
        raise click.ClickException(missing)
    from sstore.base.redact import mask_secrets  # a URL stored as given may hold a password

    if as_json:
        from sstore.cli.format import to_json
        click.echo(mask_secrets(to_json(cat.to_dict())))
        return
    engines = Table(title="engines", title_justify="left")
    for column in ("name", "kind", "location"):
        engines.add_column(column)
    for entry in cat.engines.values():
        engines.add_row(entry.name, entry.kind.value, mask_secrets(entry.location))
    objects = Table(title="objects", title_justify="left")
    for column in ("name", "fragments", "columns"):
        objects.add_column(column)
    for obj in sorted(cat.objects.values(), key=lambda o: o.name):
        objects.add_row(obj.name, ", ".join(f"{f.engine}:{f.physical}" for f in obj.fragments),
                        str(len(obj.columns)))
    console = Console(highlight=False)
    console.print(engines)
    console.print(objects)


@polystore.command(context_settings=CONTEXT)
@postgres_option
@click.option("--rows", type=click.IntRange(min=1000), default=200_000, show_default=True,
              help="Rows of the measuring table (TPC-C ORDERS).")
@click.option("--spark", is_flag=True, help="Measure Spark too (starts a JVM; about a minute).")
@click.option("--output", type=click.Path(dir_okay=False), default=None,
              help="Where to store the constants (default: costs.json beside the catalog).")
@CATALOG
@json_option
def calibrate(url: str | None, rows: int, spark: bool, output: str | None, catalog: str,
              as_json: bool) -> None:
    """Measure the cost model's constants on this machine and store them."""
    from sstore.polystore import Polystore
    from sstore.polystore.calibrate import calibrate as measure
    from sstore.workloads.tpcc.orders import create_in_engine, orders_rows

    console = Console(highlight=False, stderr=as_json)

    def work() -> None:
        if spark:
            require("spark")  # before the minute of measuring the other engines
        measured_url = warehouse(url)
        if not progress_bars():
            model = measure(measured_url, orders_rows(rows), spark=spark,
                            create_table=create_in_engine)
        else:
            with console.status("calibrating") as status:
                model = measure(measured_url, orders_rows(rows), spark=spark,
                                progress=lambda step: status.update(f"calibrating: {step}"),
                                create_table=create_in_engine)
        path = output or Polystore(catalog).default_costs_path() or "costs.json"
        model.write(path)
        if as_json:
            from dataclasses import asdict

            from sstore.cli.format import to_json
            click.echo(to_json({"path": path, **asdict(model)}))
            return
        table = Table(title=f"cost constants ({path})", title_justify="left")
        for column in ("engine", "fixed ms", "fetch ns/value", "fetch ns/row", "load ns/value",
                       "process ns/value"):
            table.add_column(column, justify="right" if column != "engine" else "left")
        for kind in model.fixed:
            table.add_row(kind, f"{model.fixed[kind] * 1e3:.2f}",
                          f"{model.fetch[kind] * 1e9:.1f}",
                          f"{model.fetch_row.get(kind, 0.0) * 1e9:.1f}",
                          f"{model.load[kind] * 1e9:.1f}",
                          f"{model.process[kind] * 1e9:.1f}")
        console.print(table)
        console.print(f"parallel overlap {model.parallel_overlap:.2f}; Spark start "
                      f"{model.spark_start:.1f} s, Spark JDBC {model.spark_jdbc * 1e9:.0f} "
                      f"ns/value; {model.measured}")
    _run(work)
