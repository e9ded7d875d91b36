"""``cast(source, target, ...)``: one entry point that finds the migrator for a pair of engines.

Engines are recognised by what they are: an ``sstore.Engine`` (DuckDB), a PostgreSQL URL
(``postgresql://...``), a Spark ``DataFrame`` (as a source) or ``SparkSession`` (as a target).
The table of pairs below is the whole dispatch; adding a direction is adding a row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from migrators.errors import MigrationError
from sstore.engine import Engine


def kind_of(obj: object) -> str:
    if isinstance(obj, Engine):
        return "sstore"
    if isinstance(obj, str) and obj.split("://", 1)[0] in ("postgresql", "postgres"):
        return "postgres"
    cls = type(obj)
    if cls.__module__.startswith("pyspark") and cls.__name__ in ("DataFrame", "SparkSession"):
        return "spark"
    raise MigrationError(f"cannot cast from or to a {cls.__name__}: expected an sstore Engine, "
                         f"a postgresql:// URL, a Spark DataFrame or SparkSession")


def _engine_to_postgres(source: Engine, target: str, /, **options: Any) -> Any:
    if "stream" in options:
        from migrators.engine_to_postgres import migrate_stream
        return migrate_stream(source, target, **options)
    from migrators.table_to_postgres import copy_table_to_postgres
    options["source_table"] = options.pop("source")
    return copy_table_to_postgres(source, target, **options)


def _postgres_to_engine(source: str, target: Engine, /, **options: Any) -> Any:
    from migrators.postgres_to_engine import copy_into_engine
    return copy_into_engine(source, target, **options)


def _spark_to_postgres(source: Any, target: str, /, **options: Any) -> Any:
    from migrators.spark import dataframe_to_postgres
    return dataframe_to_postgres(source, target, **options)


def _postgres_to_spark(source: str, target: Any, /, **options: Any) -> Any:
    from migrators.spark import postgres_to_dataframe
    return postgres_to_dataframe(source, spark=target, **options)


def _spark_to_engine(source: Any, target: Engine, /, **options: Any) -> Any:
    from migrators.spark import dataframe_to_engine
    return dataframe_to_engine(source, target, **options)


def _engine_to_spark(source: Engine, target: Any, /, **options: Any) -> Any:
    from migrators.spark import engine_to_dataframe
    return engine_to_dataframe(source, spark=target, **options)


MIGRATORS: dict[tuple[str, str], Callable[..., Any]] = {
    ("sstore", "postgres"): _engine_to_postgres,   # stream= | source= (a table), table=, ...
    ("postgres", "sstore"): _postgres_to_engine,   # table= | query=, into=, mode=, key=, ...
    ("spark", "postgres"): _spark_to_postgres,     # table=, mode=
    ("postgres", "spark"): _postgres_to_spark,     # table= | query=, partition_column=, ...
    ("spark", "sstore"): _spark_to_engine,         # table=, mode=
    ("sstore", "spark"): _engine_to_spark,         # sql_or_table=
}


def cast(source: object, target: object, /, **options: Any) -> Any:
    """Move data from ``source`` to ``target`` with the migrator registered for the pair."""
    pair = (kind_of(source), kind_of(target))
    migrator = MIGRATORS.get(pair)
    if migrator is None:
        raise MigrationError(f"no migrator from {pair[0]} to {pair[1]}; pairs: "
                             f"{sorted(MIGRATORS)}")
    return migrator(source, target, **options)
