"""The polystore's connector to a Spark session (temporary views; JDBC from PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sstore.base.readonly import check_query
from sstore.polystore.catalog import EngineKind
from sstore.polystore.connector_base import Growth
from sstore.polystore.scratch import CastExistsError, check_owned


class SparkConnector:
    """A Spark session: stored tables are temporary views; PostgreSQL fragments are read by
    Spark over JDBC (see the executor), the rest arrives as Arrow."""

    kind = EngineKind.SPARK

    def __init__(self, name: str, master: str | None = None) -> None:
        self.name = name
        self.master = master or None

    @property
    def spark(self) -> Any:
        from migrators.spark_session import get_spark
        return get_spark(self.master)

    def fetch(self, sql: str, time_zone: str | None = None) -> pa.Table:
        """Spark has no read-only mode: the check on the SQL is the guard. ``time_zone``:
        the session's for this query (PostgreSQL's, from a plan), restored after."""
        check_query(sql, "spark")
        if not time_zone:
            return self.spark.sql(sql).toArrow()
        conf = self.spark.conf
        before = conf.get("spark.sql.session.timeZone")
        conf.set("spark.sql.session.timeZone", time_zone)
        try:
            return self.spark.sql(sql).toArrow()
        finally:
            conf.set("spark.sql.session.timeZone", before)

    def store(self, table: str, rows: pa.Table, mode: str = "replace",
              note: str | None = None, delete_below: tuple[str, Any] | None = None,
              expect_note: str | None = None) -> int:
        from migrators.spark import arrow_to_spark
        self._creatable(table, mode)
        arrow_to_spark(self.spark, rows).createOrReplaceTempView(table)
        return int(rows.num_rows)

    def store_from_postgres(self, table: str, url: str, sql: str) -> None:
        from migrators.spark import postgres_to_dataframe
        self._creatable(table, "replace")
        check_query(sql, "postgres")
        postgres_to_dataframe(url, query=sql, spark=self.spark).createOrReplaceTempView(table)

    def _creatable(self, table: str, mode: str) -> None:
        check_owned(self.kind, self.name, table)
        if mode == "create" and self.exists(table):
            raise CastExistsError(f"{table} already exists in engine {self.name!r}")

    def exists(self, table: str) -> bool:
        return bool(self.spark.catalog.tableExists(table))

    def drop(self, table: str) -> None:
        check_owned(self.kind, self.name, table)
        self.spark.catalog.dropTempView(table)

    def row_count(self, physical: str) -> int:
        return int(self.spark.table(physical).count())

    def is_empty(self, physical: str) -> bool:
        return not self.spark.table(physical).take(1)

    def columns(self, physical: str) -> list[str]:
        return list(self.spark.table(physical).columns)

    def discover(self) -> list[tuple[str, str, dict[str, str]]]:
        found = []
        for table in self.spark.catalog.listTables():
            cols = {c.name: c.dataType for c in self.spark.catalog.listColumns(table.name)}
            found.append((table.name, table.name, cols))
        return found

    def fingerprint(self, sql: str) -> str:
        return str(self.spark.sql(sql).count())  # never a cache source that needs more

    def growth_since(self, sql: str, column: str, after: Any) -> Growth | None:
        return None  # never a cache source that grows by batch

    def cache_note(self, table: str) -> str | None:
        return None  # temporary views do not outlive the session: never a cache

    def cache_notes(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        return None
