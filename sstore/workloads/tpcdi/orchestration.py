"""The TPC-DI ETL as steps for a scheduler: the Airflow DAGs in ``dags/`` call one per task.

Every step takes a ``Settings`` (where the data, the warehouse, the state file and Spark are),
returns a small JSON-able dict (Airflow keeps it as the task's XCom) and may run again:

- historical (``tpcdi_historical``): ``prepare_source`` (generate the data set if the input
  directory has none) -> ``create_warehouse`` -> ``build_dimensions`` (Spark) ->
  ``load_historical_trades`` (Spark DimTrade of Batch1, skipped once loaded) -> ``audit``.
- incremental (``tpcdi_incremental``): ``incremental_batches`` -> ``stream_batches`` (per
  batch: its dimension changes, then its trades through the engine's DimTrade dataflow; the
  engine's state file and the sink watermarks make a re-run change nothing) -> ``migrate``
  (catch-up of the engine's output streams) -> ``audit``.
- backfill (``tpcdi_backfill``): ``backfill_batches_to_run`` (sealed batches only) ->
  ``backfill`` (Spark rebuild, one swap transaction per batch) -> ``audit``.

``Settings.from_params`` reads the DAG parameters (``PARAMS``); the PostgreSQL URL comes from
the Airflow connection ``postgres_conn_id`` when Airflow has it, else ``SSTORE_POSTGRES_URL``,
else the local server (``warehouse_url``). Nothing here needs Airflow installed.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from migrators.urls import DEFAULT_URL
from sstore.base.errors import TerminalError
from sstore.maintenance import StreamTarget, migrate_streams

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The Airflow connection the DAGs read the warehouse from, by default.
CONN_ID = "sstore_warehouse"
#: Where the DAGs look for (or generate) the data set, unless told otherwise.
DEFAULT_DATA_DIR = os.environ.get("SSTORE_TPCDI_DIR", "/tmp/sstore/tpcdi")
STATE_FILE = "STATE.duckdb"  # in the data directory, as ``sstore tpcdi run`` does
_BATCH_DIR = re.compile(r"^Batch(\d+)$")

#: The DAG parameters: name -> keyword arguments of ``airflow.sdk.Param``.
PARAMS: dict[str, dict[str, Any]] = {
    "data_dir": {"default": DEFAULT_DATA_DIR, "type": "string",
                 "description": "TPC-DI data set: Batch1/, Batch2/, ... (generated here if "
                                "Batch1/ is missing). Default: $SSTORE_TPCDI_DIR."},
    "scale_factor": {"default": 0.01, "type": "number", "minimum": 0.01,
                     "description": "Scale factor when the data set is generated."},
    "seed": {"default": 0, "type": "integer", "minimum": 0,
             "description": "Generator seed (same seed, same files)."},
    "schema": {"default": "tpcdi", "type": "string",
               "description": "Warehouse schema in PostgreSQL."},
    "postgres_conn_id": {"default": CONN_ID, "type": "string",
                         "description": "Airflow connection of the warehouse; without it "
                                        "$SSTORE_POSTGRES_URL, else " + DEFAULT_URL + "."},
    "spark_master": {"default": "", "type": "string",
                     "description": "Spark master URL, e.g. spark://spark-master:7077; empty: "
                                    "$SSTORE_SPARK_MASTER, else local[*]."},
    "state_path": {"default": "", "type": "string",
                   "description": "The engine's state file; empty: STATE.duckdb in data_dir."},
    "batch_size": {"default": 1000, "type": "integer", "minimum": 1,
                   "description": "Trade events per engine batch."},
    "batches": {"default": [], "type": "array", "items": {"type": "integer", "minimum": 1},
                "description": "Backfill: the TPC-DI batches to rebuild; empty: every batch "
                               "the stream has sealed."},
    "batch_range": {"default": "", "type": "string",
                    "description": "Backfill: a range of batch ids FIRST-LAST (e.g. 2-3), "
                                   "replaced in ONE transaction; instead of batches."},
    "from_date": {"default": "", "type": "string",
                  "description": "Backfill: first day (YYYY-MM-DD) of a date range (trades "
                                 "created, alerts raised on those days); with to_date, "
                                 "instead of batches."},
    "to_date": {"default": "", "type": "string",
                "description": "Backfill: last day (YYYY-MM-DD, inclusive) of the date range."},
    "rebuild": {"default": False, "type": "boolean",
                "description": "Start over: drop the schema, its watermarks and the state "
                               "file before loading."},
}


class AuditFailed(TerminalError):
    """The warehouse does not pass the TPC-DI audit."""


class ProcedureHalted(TerminalError):
    """A stored procedure of the DimTrade dataflow halted on an error: its batches wait in the
    state file until it is resumed (``sstore resume``). Terminal: retrying the task changes
    nothing until someone fixes the cause."""


@dataclass(frozen=True)
class Settings:
    """Everything a step needs to know. ``state_path`` "" is ``<data_dir>/STATE.duckdb``;
    ``spark_master`` "" is ``$SSTORE_SPARK_MASTER``, else ``local[*]``."""

    data_dir: str = DEFAULT_DATA_DIR
    url: str = field(default=DEFAULT_URL, repr=False)  # no password in a log or traceback
    schema: str = "tpcdi"
    state_path: str = ""
    batch_size: int = 1000
    scale_factor: float = 0.01
    seed: int = 0
    spark_master: str = ""

    @property
    def state(self) -> str:
        return self.state_path or os.path.join(self.data_dir, STATE_FILE)

    @classmethod
    def from_params(cls, params: Mapping[str, Any],
                    lookup: Callable[[str], str | None] | None = None) -> Settings:
        """From DAG parameters (names of ``PARAMS``; missing ones take their defaults).
        ``lookup(conn_id)`` finds a connection's URL (default: Airflow's, if installed)."""
        def get(name: str) -> Any:
            value = params.get(name)
            return PARAMS[name]["default"] if value is None else value

        return cls(data_dir=str(get("data_dir")),
                   url=warehouse_url(str(get("postgres_conn_id")), lookup),
                   schema=str(get("schema")), state_path=str(get("state_path")),
                   batch_size=int(get("batch_size")), scale_factor=float(get("scale_factor")),
                   seed=int(get("seed")), spark_master=str(get("spark_master")))

    def redacted(self) -> dict[str, Any]:
        """For logs and results: the settings without the URL's password."""
        from migrators.urls import parse

        return {**asdict(self), "url": parse(self.url).redacted()}


# -- where the warehouse is ------------------------------------------------------------------
def connection_url(host: str | None, port: int | None, login: str | None,
                   password: str | None, database: str | None) -> str:
    """A ``postgresql://`` URL from a connection's fields (quoted; defaults: local, 5432,
    database postgres)."""
    auth = ""
    if login:
        auth = quote(login, safe="") + (f":{quote(password, safe='')}" if password else "") + "@"
    return f"postgresql://{auth}{host or '127.0.0.1'}:{port or 5432}/{database or 'postgres'}"


def airflow_connection_url(conn_id: str) -> str | None:
    """The URL of Airflow connection ``conn_id`` (e.g. ``AIRFLOW_CONN_SSTORE_WAREHOUSE``, or one
    made in the UI); None when Airflow is not installed or has no such connection."""
    try:
        from airflow.sdk import Connection
        from airflow.sdk.exceptions import AirflowNotFoundException
    except ImportError:
        return None
    try:
        conn = Connection.get(conn_id)
    except AirflowNotFoundException:
        return None
    return connection_url(conn.host, conn.port, conn.login, conn.password, conn.schema)


def warehouse_url(conn_id: str | None = CONN_ID,
                  lookup: Callable[[str], str | None] | None = None) -> str:
    """The connection ``conn_id`` (found by ``lookup``, default Airflow's), else the one rule
    of every command (``migrators.warehouse_url``): ``SSTORE_POSTGRES_URL``, else the server at
    the default address, else a private PostgreSQL started for it."""
    found = (lookup or airflow_connection_url)(conn_id) if conn_id else None
    if found:
        return found
    from migrators.warehouse_url import resolve_warehouse

    return resolve_warehouse().url


def spark_session(settings: Settings) -> SparkSession:
    """The process's Spark session: ``settings.spark_master`` if given, else whatever
    ``get_spark`` chooses (a running session, ``SSTORE_SPARK_MASTER``, ``local[*]``)."""
    from migrators.spark_session import get_spark

    return get_spark(settings.spark_master or None)


# -- the data set ----------------------------------------------------------------------------
def batches_in(data_dir: str | os.PathLike[str]) -> list[int]:
    """The TPC-DI batch numbers that have a directory (``Batch1``, ``Batch2``, ...), sorted."""
    root = Path(data_dir)
    if not root.is_dir():
        return []
    found = (_BATCH_DIR.match(p.name) for p in root.iterdir() if p.is_dir())
    return sorted(int(m.group(1)) for m in found if m)


class NotADataSet(TerminalError):
    """``data_dir`` holds files but no TPC-DI data set: nothing is generated over them."""


def prepare_source(settings: Settings) -> dict[str, Any]:
    """Find the data set, or generate it (``scale_factor``, ``seed``) when ``data_dir`` does
    not exist or is empty. A directory with files but no ``Batch1/Trade.txt`` (a data set laid
    out or named differently: ``batch1/``, ``Trade.TXT``) is refused: generating a synthetic
    data set there would load it in place of the user's, and the run would succeed."""
    from sstore.workloads.tpcdi.generator import generate

    root = Path(settings.data_dir)
    generated = not (root / "Batch1" / "Trade.txt").is_file()
    if generated and root.is_dir() and any(root.iterdir()):
        found = sorted(p.name for p in root.iterdir())[:8]
        raise NotADataSet(f"{root} has files ({', '.join(found)}) but no Batch1/Trade.txt: "
                          f"not a TPC-DI data set as DIGen writes it (names are case-"
                          f"sensitive). Point data_dir at the data set, or at a new or empty "
                          f"directory to generate one there")
    if generated:
        generate(settings.scale_factor, root, seed=settings.seed)
    return {"data_dir": str(root), "generated": generated, "batches": batches_in(root)}


def incremental_batches(settings: Settings) -> list[int]:
    """The incremental batches of the data set (2, 3, ...), in order; they must follow one
    another from 2, and Batch1 must be there."""
    found = batches_in(settings.data_dir)
    if 1 not in found:
        raise FileNotFoundError(f"no TPC-DI data set in {settings.data_dir} (no Batch1/): run "
                                f"tpcdi_historical first, or point data_dir at one")
    later = [b for b in found if b > 1]
    if later != list(range(2, len(later) + 2)):
        raise FileNotFoundError(f"incremental batches in {settings.data_dir} must be Batch2, "
                                f"Batch3, ... without gaps; found {later}")
    return later


# -- the historical load ---------------------------------------------------------------------
def create_warehouse(settings: Settings, rebuild: bool = False) -> dict[str, Any]:
    """Create the warehouse schema and its missing tables. ``rebuild``: first drop the schema,
    the watermark rows of its tables and the engine's state file (the warehouse starts over;
    the engine's batches would otherwise count as delivered)."""
    from sstore.workloads.tpcdi.warehouse import create_warehouse as create
    from sstore.workloads.tpcdi.warehouse import drop_warehouse

    removed: list[str] = []
    if rebuild:
        drop_warehouse(settings.url, settings.schema)  # and the watermarks of its tables
        for path in (settings.state, settings.state + ".wal"):
            if os.path.exists(path):
                os.remove(path)
                removed.append(path)
    tables = create(settings.url, settings.schema)
    return {"schema": settings.schema, "tables": list(tables), "rebuilt": rebuild,
            "removed": removed}


def build_dimensions(settings: Settings) -> dict[str, Any]:
    """Reference tables and the Batch1 dimensions, in PySpark (``dimensions.build_historical``:
    one transaction, deterministic, so a re-run gives the same rows and keys)."""
    from sstore.workloads.tpcdi import dimensions

    report = dimensions.build_historical(spark_session(settings), settings.data_dir,
                                         settings.url, settings.schema)
    return {"rows": dict(report.rows), "seconds": report.seconds}


def load_historical_trades(settings: Settings) -> dict[str, Any]:
    """Batch1's DimTrade and DImessages in PySpark (``dimtrade_spark.load_historical``; its
    watermark skips a batch already loaded)."""
    from sstore.workloads.tpcdi import dimtrade_spark

    report = dimtrade_spark.load_historical(spark_session(settings), settings.data_dir,
                                            settings.url, settings.schema)
    return asdict(report)


# -- the incremental batches -----------------------------------------------------------------
def stream_batches(settings: Settings, batches: Sequence[int]) -> list[dict[str, Any]]:
    """Each incremental batch in order through ``StreamingDimTrade.run_incremental``: its
    dimension changes (unless the warehouse has them), then its trades through the engine's
    DimTrade dataflow into the warehouse. Safe to run again (exactly once). A procedure that
    halted raises ``ProcedureHalted`` (a halt lasts until ``sstore resume``)."""
    from sstore.workloads.tpcdi.streaming.pipeline import StreamingDimTrade

    results = []
    pipeline = StreamingDimTrade(settings.data_dir, settings.url, settings.state,
                                 settings.schema, settings.batch_size)
    spark: SparkSession | None = None
    try:
        for batch in batches:
            if spark is None and not pipeline.dimensions_applied(batch):
                spark = spark_session(settings)
            events, engine_batches = pipeline.report.events, pipeline.report.engine_batches
            report = pipeline.run_incremental(batch, spark)
            status = pipeline.engine.status()
            if status.halted():  # the sinks moved what committed; the rest waits: say so
                raise ProcedureHalted(f"TPC-DI Batch{batch}: {status.halt_report()}")
            results.append({
                "batch": batch, "events": report.events - events,
                "engine_batches": report.engine_batches - engine_batches,
                "seconds": {k: round(v, 3) for k, v in report.phases.items()
                            if k.endswith((f"Batch{batch}", f"Batch{batch})"))}})
    finally:
        pipeline.close()
    return results


def migrate(settings: Settings) -> dict[str, Any]:
    """Move whatever the engine's output streams hold that the warehouse lacks (normally
    nothing: the run's sinks did it; after a crash, the rest)."""
    from sstore.workloads.tpcdi.streaming.pipeline import sinks

    return migrate_streams(settings.state, settings.url, sinks(settings.schema)).to_dict()


def maintenance_targets(settings: Settings, given: Sequence[Mapping[str, Any]] | None = None
                        ) -> list[StreamTarget]:
    """What ``sstore_maintenance`` moves: the targets ``given`` (``StreamTarget`` mappings), or
    else the TPC-DI DimTrade sinks of ``settings.schema``."""
    if given:
        return [StreamTarget.from_mapping(t) for t in given]
    from sstore.workloads.tpcdi.streaming.pipeline import sinks

    return list(sinks(settings.schema))


# -- backfill --------------------------------------------------------------------------------
@dataclass(frozen=True)
class BackfillPlan:
    """What a backfill run rebuilds: ``batches`` one transaction each, or the batch range
    ``first``..``last`` in one, or the days ``from_date``..``to_date`` in one."""

    batches: tuple[int, ...] = ()
    batch_range: tuple[int, int] | None = None
    dates: tuple[dt.date, dt.date] | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> BackfillPlan:
        """From the DAG parameters ``batches``, ``batch_range``, ``from_date``/``to_date``:
        at most one of the three (``BadBackfillParams``, terminal, otherwise)."""
        from sstore.workloads.tpcdi.backfill import parse_batch_range, parse_date_range

        batches = tuple(int(b) for b in params.get("batches") or ())
        text = str(params.get("batch_range") or "").strip()
        days = (str(params.get("from_date") or "").strip(),
                str(params.get("to_date") or "").strip())
        given = [n for n, used in (("batches", bool(batches)), ("batch_range", bool(text)),
                                   ("from_date/to_date", any(days))) if used]
        if len(given) > 1:
            raise BadBackfillParams(f"give one of batches, batch_range, from_date/to_date; "
                                    f"got {' and '.join(given)}")
        try:
            if text:
                return cls(batch_range=parse_batch_range(text))
            if any(days):
                return cls(dates=parse_date_range(*days))
        except ValueError as exc:
            raise BadBackfillParams(str(exc)) from None
        return cls(batches=batches)

    def to_dict(self) -> dict[str, Any]:
        return {"batches": list(self.batches),
                "batch_range": list(self.batch_range) if self.batch_range else None,
                "dates": [d.isoformat() for d in self.dates] if self.dates else None}


class BadBackfillParams(TerminalError):
    """The backfill DAG's parameters name no interval, or more than one way."""


def backfill_batches_to_run(settings: Settings, batches: Sequence[int]) -> list[int]:
    """The batches a backfill run rebuilds: ``batches`` (each must be sealed by the stream,
    else ``IntervalNotSealed``, terminal: nothing is rebuilt), or, if empty, every batch
    the stream has sealed in ``settings.schema``."""
    from migrators.postgres import connect
    from sstore.workloads.tpcdi.backfill import IntervalNotSealed, sealed_batches

    with connect(settings.url) as con:
        done = sealed_batches(con, settings.schema)
    if not batches:
        return done
    missing = [b for b in batches if b not in done]
    if missing:
        raise IntervalNotSealed(
            f"refusing to backfill Batch{', Batch'.join(map(str, missing))} of "
            f"{settings.schema}: the stream has not finished loading "
            f"{'them' if len(missing) > 1 else 'it'} (sealed: {done or 'none'}). Nothing was "
            f"changed")
    return sorted(set(batches))


def backfill_plan(settings: Settings, params: Mapping[str, Any]) -> dict[str, Any]:
    """The run's plan (``BackfillPlan``), its batches checked sealed (a batch range's too);
    a date range is checked when it runs (it needs batches 1..N sealed)."""
    plan = BackfillPlan.from_params(params)
    if plan.batch_range is not None:
        first, last = plan.batch_range
        backfill_batches_to_run(settings, list(range(first, last + 1)))
        return plan.to_dict()
    if plan.dates is not None:
        return plan.to_dict()
    return {**plan.to_dict(), "batches": backfill_batches_to_run(settings, plan.batches)}


def backfill(settings: Settings, batches: Sequence[int] | Mapping[str, Any]
             ) -> list[dict[str, Any]]:
    """Rebuild with Spark and replace the streamed rows: each batch of ``batches`` in its own
    transaction, or a plan's (``backfill_plan``) batch range or date range in one
    (``sstore.workloads.tpcdi.backfill``). Safe to run again: the same rows, a new version."""
    from sstore.workloads.tpcdi import backfill as tpcdi

    plan: Mapping[str, Any] = \
        batches if isinstance(batches, Mapping) else {"batches": list(batches)}
    args = (settings.data_dir, settings.url, settings.schema)
    if plan.get("batch_range"):
        first, last = plan["batch_range"]
        return [tpcdi.backfill_batches(spark_session(settings), *args, int(first), int(last)
                                       ).to_dict()]
    if plan.get("dates"):
        first, last = (dt.date.fromisoformat(d) for d in plan["dates"])
        return [tpcdi.backfill_dates(spark_session(settings), *args, first, last).to_dict()]
    chosen = plan.get("batches") or []
    spark = spark_session(settings) if chosen else None
    return [tpcdi.backfill_batch(spark, *args, b).to_dict() for b in chosen]


# -- the audit -------------------------------------------------------------------------------
def loaded_batches(settings: Settings) -> list[int]:
    """Batches 1..N where N is the newest batch in the warehouse's DimTrade ([] if empty)."""
    from migrators.postgres import connect
    from sstore.base.sql import ident

    with connect(settings.url) as con:
        row = con.execute(f"SELECT max(batchid) FROM {ident(settings.schema)}.dimtrade"
                          ).fetchone()
    return list(range(1, int(row[0]) + 1)) if row and row[0] is not None else []


def audit(settings: Settings) -> dict[str, Any]:
    """TPC-DI's DimTrade audit of the batches loaded so far (``loaded_batches``), against the
    data set's audit files; raises ``AuditFailed`` naming the failed checks."""
    from sstore.workloads.tpcdi.audit import run_audit

    batches = loaded_batches(settings)
    report = run_audit(settings.url, settings.schema, settings.data_dir, batches=batches)
    failed = [f"{c.name}{f' (batch {c.batch})' if c.batch else ''}: observed "
              f"{c.observed}, expected {c.expected}" for c in report.failed]
    summary = {"schema": report.schema, "batches": batches, "ok": report.ok,
               "passed": sum(c.passed for c in report.checks), "failed": failed,
               "skipped": sum(c.outcome == "skip" for c in report.checks)}
    if not report.ok:
        raise AuditFailed(f"{len(report.failed)} audit check(s) failed in {settings.schema}: "
                          + "; ".join(failed))
    return summary
