"""Connectors: the polystore's hands in each engine, all with the same anatomy.

Each connector runs a query in its engine's own dialect and returns Arrow (``fetch``), stores
Arrow rows as a table (``store``), and answers the planner's questions about a physical table
(``row_count``, ``columns``, ``discover``) and about cached copies (``cache_note``,
``growth_since``). Data moves
through the migrators' fast paths: DuckDB's Arrow export, ADBC binary COPY out of PostgreSQL,
pgpq binary COPY into it, Arrow into Spark and JDBC from PostgreSQL to Spark.

Reads cannot write: every ``fetch`` checks its SQL (``sstore.base.readonly.check_query``) and runs
it read-only where the engine can (a READ ONLY transaction in the engine or PostgreSQL, a state
file opened read-only with external access off); ``store`` and ``drop`` touch only the
polystore's own schemas (``scratch.check_owned``).

The connectors live one per module (``connector_streaming``, ``connector_postgres``,
``connector_spark``); what they share is in ``connector_base``. This module gathers them, so
callers import every connector from one place.
"""

from sstore.polystore.connector_base import (
    CACHE_NOTE,
    PROBE,
    CacheMoved,
    Connector,
    Growth,
    Probed,
    single_table,
)
from sstore.polystore.connector_postgres import PostgresConnector
from sstore.polystore.connector_spark import SparkConnector
from sstore.polystore.connector_streaming import StreamingConnector

__all__ = ["CACHE_NOTE", "PROBE", "CacheMoved", "Connector", "Growth", "Probed",
           "PostgresConnector", "SparkConnector", "StreamingConnector", "single_table"]
