"""Cast operators: move data between the engine (DuckDB), PostgreSQL and Spark.

``cast(source, target, ...)`` picks the migrator for the pair; the modules hold one direction
each (``engine_to_postgres``, ``postgres_to_engine``, ``spark``), ``access`` holds the three ways
of reaching remote data (cross-system query, replication, migration).
"""

from migrators.engine_to_postgres import StreamToPostgres, migrate_stream
from migrators.errors import (
    IncompatibleSchemaError,
    MigrationError,
    PostgresUnavailable,
    ResetRefused,
    UnsupportedTypeError,
)
from migrators.registry import MIGRATORS, cast
from migrators.sink_runner import MigrationReport, SinkGroup, SinkRunner

__all__ = [
    "MIGRATORS",
    "IncompatibleSchemaError",
    "MigrationError",
    "MigrationReport",
    "PostgresUnavailable",
    "ResetRefused",
    "SinkGroup",
    "SinkRunner",
    "StreamToPostgres",
    "UnsupportedTypeError",
    "cast",
    "migrate_stream",
]
