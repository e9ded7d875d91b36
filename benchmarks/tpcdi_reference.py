"""DimTrade as a competent engineer writes it by hand: the floor the sstore dataflow is held to.

``benchmarks.tpcdi`` compares the engine's five-procedure streaming DimTrade with, among
others, this hand-written loop. It does the same five steps with the same rules, reusing the
streaming procedures' SQL text (``streaming.parse.PARSE_SQL``, ``streaming.procedures``'
``TIMED_SQL``, ``SECURED_SQL``, ``KEYED_SQL``, ``APPEND_SQL``, ``ALERTS_SQL``), but with
none of the engine's machinery: no streams between the steps, no
commit records, no scheduler, no sink threads. Per chunk (a batch of trade events):

1. **One DuckDB transaction**: the chunk is registered as an Arrow relation; ONE query runs
   steps 1-4 as chained CTEs (parse -> status/type and date/time keys -> security/company
   keys -> account/customer/broker keys); SP5's ``APPEND_SQL`` appends the new versions of
   the trades they change to the DuckDB copy of DimTrade (kept as versions, as the engine
   keeps it: the faster storage at every scale, docs/tpcdi.md) and returns them (a row was
   applied exactly when its trade came back), and the alerts are read only when a row may raise one
   (``procedures.may_alert``), as SP5 does. Two statements, three with alerts.
2. **One PostgreSQL transaction** (``migrators.delivery.deliver``, the protocol every
   exactly-once writer of the project uses): lock the watermark row of (``SOURCE``,
   ``chunks``, ``<schema>.dimtrade``), skip the chunk if the watermark is at or past it,
   else binary COPY the changed rows into a stage table and ``INSERT ... ON CONFLICT
   (tradeid) DO UPDATE`` (``migrators.postgres.merge_rows``), COPY the alerts and the
   rejects, advance the watermark, COMMIT.
3. COMMIT the DuckDB transaction (rolled back if PostgreSQL failed or skipped the chunk).

Exactly once on re-run: a chunk's id is ``streaming.batch_ids.engine_batch_id(tpcdi_batch,
last line)``, so ids grow with the data whatever the chunk size; ``resume`` rebuilds the
DuckDB DimTrade from PostgreSQL (the source of truth: the DuckDB copy is a cache, kept in
memory) and ``lines_done`` says which lines the warehouse already has. A crash between the
PostgreSQL COMMIT and the DuckDB COMMIT loses only the cache, which ``resume`` rebuilds.

The dimension lookups read DuckDB copies of the warehouse dimensions (``LOOKUPS``), read from
PostgreSQL once per TPC-DI batch (``load_dimensions``), as the engine's ``refresh_lookups``.
"""

from __future__ import annotations

import re
import time
from typing import Any

import duckdb
import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.tpcdi_runs import Budget, Phase, Run, Tick, feed_phase, phase_service
from benchmarks.tpcdi_setup import (
    TPCDI_BATCHES,
    DataSet,
    fingerprint,
    fresh_warehouse,
    install_dimensions,
)
from migrators import delivery, watermarks
from migrators.postgres import Session, copy_arrow, merge_rows
from migrators.postgres_to_engine import read_postgres
from sstore.base.duck import LARGE_ROWS, arrow
from sstore.base.sql import ident, qualified
from sstore.workloads.tpcdi.dimtrade_spark_rules import DIMESSAGES as DIMESSAGES_ARROW
from sstore.workloads.tpcdi.dimtrade_spark_rules import DIMTRADE as DIMTRADE_ARROW
from sstore.workloads.tpcdi.sources import REJECT_SCHEMA
from sstore.workloads.tpcdi.streaming.batch_ids import ID_STRIDE, engine_batch_id
from sstore.workloads.tpcdi.streaming.events import BatchEvents
from sstore.workloads.tpcdi.streaming.parse import PARSE_SQL
from sstore.workloads.tpcdi.streaming.procedures import (
    ALERTS_SQL,
    APPEND_SQL,
    DIMTRADE,
    DIMTRADE_VERSIONS_DDL,
    DIMTRADE_VIEW_DDL,
    KEYED_SQL,
    LOOKUPS,
    SECURED_SQL,
    TIMED_SQL,
    merge_outcome,
)

SOURCE = "tpcdi DimTrade (hand-written reference)"
CHUNKS = "chunks"  # the watermark's stream: chunk ids (engine_batch_id of their last line)
_FROM_BATCH = re.compile(r"\bFROM batch\b")


def over(query: str, relation: str) -> str:
    """A procedure's SQL reading ``relation`` instead of its input batch ``batch``."""
    out, n = _FROM_BATCH.subn(f"FROM {relation}", query)
    if n == 0:
        raise ValueError("the procedure SQL no longer reads FROM batch: update over()")
    return out


#: Steps 1-4 in one query, over the chunk's lines (``chunk``).
JUDGE_SQL = f"""
WITH parsed AS ({over(PARSE_SQL, "chunk")}),
     timed AS ({over(TIMED_SQL, "parsed")}),
     secured AS ({over(SECURED_SQL, "timed")})
{over(KEYED_SQL, "secured")}
"""
#: SP5's append over the keyed rows (``keyed``): returns the changed DimTrade rows.
APPLY_SQL = over(APPEND_SQL, "keyed")


class ReferenceDimTrade:
    """The hand-written loop over one warehouse ``schema`` (see the module docstring)."""

    def __init__(self, url: str, schema: str) -> None:
        self.url, self.schema = url, schema
        self.target = f"{schema}.dimtrade"
        self.key = delivery.SinkKey(SOURCE, CHUNKS, self.target)
        self.con = duckdb.connect(":memory:")
        self.con.execute(DIMTRADE_VERSIONS_DDL)
        self.con.execute(DIMTRADE_VIEW_DDL)
        self.session = Session(url)
        self.session.run(_create_watermarks, "create the watermark table")
        self.chunks = self.skipped = 0

    # -- setup -----------------------------------------------------------------------------------
    def load_dimensions(self) -> None:
        """Copy the dimension rows the lookups need from PostgreSQL (after each TPC-DI
        batch's dimension changes)."""
        for table, columns in LOOKUPS.items():
            rows = read_postgres(self.url, f"SELECT {columns} FROM "
                                           f"{qualified(self.schema + '.' + table)}")
            self.con.register("dimension_rows", rows)
            self.con.execute(f"CREATE OR REPLACE TABLE {ident(table)} AS "
                             f"SELECT * FROM dimension_rows")
            self.con.unregister("dimension_rows")

    def resume(self) -> int:
        """Rebuild the DuckDB DimTrade from the warehouse (a re-run after a crash or on
        purpose); returns the rows read."""
        rows = read_postgres(self.url, f"SELECT {', '.join(DIMTRADE)} FROM "
                                       f"{qualified(self.target)}")
        self.con.execute("DELETE FROM dimtrade_versions")
        if rows.num_rows:
            self.con.register("warehouse_rows", rows)
            self.con.execute(f"INSERT INTO dimtrade_versions ({', '.join(DIMTRADE)}) "
                             f"SELECT * FROM warehouse_rows")
            self.con.unregister("warehouse_rows")
        return rows.num_rows

    def lines_done(self, tpcdi_batch: int) -> int:
        """The last event line of ``tpcdi_batch`` the warehouse has (0: none)."""
        def read(con: psycopg.Connection) -> int | None:
            try:
                return delivery.read(con, self.key)
            finally:
                con.rollback()

        mark = self.session.run(read, "read the watermark") or 0
        low = tpcdi_batch * ID_STRIDE
        return max(0, min(mark - low, ID_STRIDE))

    def pending(self, events: BatchEvents) -> pa.Table:
        """The lines of ``events`` the warehouse does not have yet: feed only these on a
        re-run (a chunk that straddled the watermark would otherwise apply lines twice)."""
        done = self.lines_done(events.tpcdi_batch)
        lines = events.lines
        return lines.filter(pc.greater(lines["line_no"], done)) if done else lines

    def store_file_rejects(self, events: BatchEvents) -> None:
        """The rows the file readers refused (Batch1), once, as the other systems do."""
        if events.rejects.num_rows == 0:
            return
        rows = events.rejects.select(REJECT_SCHEMA.names)
        key = delivery.SinkKey(SOURCE, "file rejects", f"{self.schema}.rejects")
        batch = events.tpcdi_batch
        self.session.run(lambda con: delivery.deliver(
            con, key, batch, batch, lambda cur, _w: copy_arrow(cur, key.target, rows),
            after=None), "store file rejects")

    # -- the loop --------------------------------------------------------------------------------
    def process(self, chunk: pa.Table) -> bool:
        """One chunk of event lines (``streaming.events.LINE_SCHEMA``, one TPC-DI batch):
        one DuckDB transaction, one PostgreSQL transaction. False: the warehouse had it."""
        tpcdi_batch = int(chunk["tpcdi_batch"][0].as_py())
        chunk_id = engine_batch_id(tpcdi_batch, int(chunk["line_no"][-1].as_py()))
        con = self.con
        con.begin()
        try:
            con.register("chunk", chunk)
            large = chunk.num_rows >= LARGE_ROWS  # sstore's rule for planning once or streaming
            judged = arrow(con, JUDGE_SQL, large=large)
            con.register("keyed", judged)
            changed = arrow(con, APPLY_SQL, [chunk_id], large=large)

            def alerts_of(applied: pa.Table) -> pa.Table:
                con.register("applied", applied)
                return arrow(con, ALERTS_SQL, large=large)

            alerts, rejects = merge_outcome(judged, changed, alerts_of)
            rejects = rejects.cast(REJECT_SCHEMA)
            rows = changed.select(DIMTRADE_ARROW.names).cast(DIMTRADE_ARROW)
            messages = alerts.select(DIMESSAGES_ARROW.names).cast(DIMESSAGES_ARROW)

            def write(cur: psycopg.Cursor, _watermark: int) -> int:
                merge_rows(cur, self.target, rows, ["tradeid"])
                copy_arrow(cur, f"{self.schema}.dimessages", messages)
                copy_arrow(cur, f"{self.schema}.rejects", rejects)
                return rows.num_rows

            done = self.session.run(lambda pg: delivery.deliver(pg, self.key, chunk_id,
                                                                 chunk_id, write, after=None),
                                    f"write chunk {chunk_id}")
        except BaseException:
            con.rollback()
            raise
        if done.skipped:
            con.rollback()
            self.skipped += 1
            return False
        con.commit()
        self.chunks += 1
        return True

    def close(self) -> None:
        try:
            self.session.close()
        finally:
            self.con.close()


def _create_watermarks(con: psycopg.Connection) -> None:
    watermarks.ensure_watermarks(con)
    con.commit()


class ReferenceFeed:
    """Feeds ``ReferenceDimTrade``: each chunk is in PostgreSQL when send returns, so its
    latency is arrival (just before ``process``, or when it was due) -> its PostgreSQL COMMIT."""

    def __init__(self, job: ReferenceDimTrade) -> None:
        self.job = job
        self.latencies: dict[int, list[float]] = {b: [] for b in TPCDI_BATCHES}
        self._tpcdi_batch = 0

    def begin(self, events: BatchEvents) -> None:
        self._tpcdi_batch = events.tpcdi_batch
        self.job.store_file_rejects(events)

    def send(self, chunk: pa.Table, measured: bool, due: float | None = None) -> None:
        t0 = time.perf_counter() if due is None else due
        self.job.process(chunk)
        if measured:
            self.latencies[self._tpcdi_batch].append((time.perf_counter() - t0) * 1000)

    def finish(self) -> None:
        pass  # each chunk is in PostgreSQL when send returns


def run_reference(data: DataSet, url: str, schema: str, batch_trades: int, batch_events: int,
                  budget: Budget, tick: Tick) -> Run:
    """The hand-written system through the three TPC-DI batches, as ``tpcdi_runs`` runs the
    others (dimension copies timed apart)."""
    fresh_warehouse(url, schema)
    dims = {"copy Batch1": install_dimensions(url, schema, 1)}
    job = ReferenceDimTrade(url, schema)
    feed = ReferenceFeed(job)
    phases: list[Phase] = []
    service: dict[int, list[float]] = {}
    try:
        t0 = time.perf_counter()
        job.load_dimensions()
        dims["lookups Batch1"] = time.perf_counter() - t0
        for batch in TPCDI_BATCHES:
            if batch > 1:
                dims[f"copy Batch{batch}"] = install_dimensions(url, schema, batch)
                t0 = time.perf_counter()
                job.load_dimensions()
                dims[f"lookups Batch{batch}"] = time.perf_counter() - t0
            service[batch] = []
            phases.append(feed_phase(feed, data.events[batch], batch_events, budget, tick,
                                     service[batch], batch_trades))
        extra: dict[str, Any] = {"chunks": job.chunks, "skipped_chunks": job.skipped,
                                 **phase_service(service)}
    finally:
        job.close()
    return Run("reference", data.scale_factor, batch_trades, batch_events, phases, dims,
               feed.latencies, fingerprint(url, schema), extra)
