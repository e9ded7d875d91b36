"""Periodic upkeep of an engine's state file: move its output streams into PostgreSQL, report.

The ``sstore_maintenance`` Airflow DAG runs these every few minutes; they are plain functions
(no Airflow needed), and each returns a small JSON-able dict, the task's result.

- ``migrate_streams``: for each ``StreamTarget``, ``StreamToPostgres.run_once`` (what
  ``sstore migrate`` does): every committed batch not yet in PostgreSQL goes there, exactly
  once (binary COPY + watermark row per PostgreSQL transaction). A program whose sinks are
  attached keeps its targets current itself; this catches up after it stopped or crashed.
- ``status_report``: the state file's status (``sstore.storage.status``) next to the PostgreSQL
side:
  per target, the stream's last batch, the watermark, whether the target lags, its rows.

DuckDB lets one process open a state file for writing and nobody else read it meanwhile: while
the program that owns the file runs, both steps answer ``"busy"`` instead of failing (the owner
migrates its own streams). A state file that does not exist yet is ``"missing"``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb

from sstore.base.errors import DeclarationError

BUSY_MARKERS = ("Conflicting lock", "Could not set lock", "already open")


@dataclass(frozen=True)
class StreamTarget:
    """One stream of a state file and the PostgreSQL table (``schema.table``) it feeds.
    ``mode``: "append" new rows, or "merge" rows by the ``key`` columns."""

    stream: str
    table: str
    mode: str = "append"
    key: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in ("append", "merge"):
            raise DeclarationError(f"mode must be 'append' or 'merge', not {self.mode!r}")
        if self.mode == "merge" and not self.key:
            raise DeclarationError(f"{self.stream} -> {self.table}: merge needs key columns")
        object.__setattr__(self, "key", tuple(self.key))

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any]) -> StreamTarget:
        """From ``{"stream": ..., "table": ..., "mode": ..., "key": [...]}`` (JSON, params)."""
        key = spec.get("key") or ()
        return cls(str(spec["stream"]), str(spec["table"]), str(spec.get("mode", "append")),
                   tuple([key] if isinstance(key, str) else key))

    def to_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "table": self.table, "mode": self.mode,
                "key": list(self.key)}


@dataclass
class StreamMigration:
    """What ``migrate_streams`` did for one target."""

    stream: str
    table: str
    rows: int
    batches: int
    chunks: int
    watermark: int
    seconds: float


@dataclass
class MigrationRun:
    """The result of one ``migrate_streams``: ``status`` is "migrated", "busy" or "missing"."""

    state: str
    status: str
    detail: str = ""
    streams: list[StreamMigration] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.streams)

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "status": self.status, "detail": self.detail,
                "rows": self.rows, "streams": [asdict(s) for s in self.streams]}


def is_busy(exc: BaseException) -> bool:
    """Whether a DuckDB error means that another engine has the state file open."""
    return isinstance(exc, duckdb.Error) and any(m in str(exc) for m in BUSY_MARKERS)


def migrate_streams(state_path: str, url: str, targets: Sequence[StreamTarget],
                    chunk_rows: int = 10_000) -> MigrationRun:
    """Move every committed batch of each target stream that PostgreSQL lacks; then return.

    Run it again at any time: it continues from the watermarks. The consumer and watermark of
    a target are those of a ``StreamToPostgres`` sink with the same stream and table, so a
    program's own sinks and this job share their progress."""
    from migrators.engine_to_postgres import StreamToPostgres
    from sstore.engine import Engine

    if not os.path.exists(state_path):
        return MigrationRun(state_path, "missing", f"no state file at {state_path} yet")
    try:
        engine = Engine.open_existing(state_path)
    except duckdb.Error as exc:
        if is_busy(exc):
            return MigrationRun(state_path, "busy", _first_line(exc))
        raise
    run = MigrationRun(state_path, "migrated")
    try:
        for target in targets:
            if target.stream not in engine.graph.streams:
                raise DeclarationError(f"{state_path} has no stream {target.stream!r}; "
                                       f"streams: {sorted(engine.graph.streams)}")
            began = time.perf_counter()
            report = StreamToPostgres(engine, target.stream, url, target.table, target.mode,
                                      target.key, chunk_rows).run_once()
            run.streams.append(StreamMigration(target.stream, target.table, report.rows,
                                               report.batches, report.chunks, report.watermark,
                                               round(time.perf_counter() - began, 3)))
    except duckdb.Error as exc:
        if not is_busy(exc):
            raise
        run.status, run.detail = "busy", _first_line(exc)
    finally:
        engine.close()
    return run


def status_report(state_path: str, url: str, targets: Sequence[StreamTarget] = ()
                  ) -> dict[str, Any]:
    """The state file's status and, per target, how far PostgreSQL is: the stream's last
    committed batch, the watermark, ``behind`` (batches the target lacks), the table's rows.

    ``status``: "ok", "busy" (the state file is open elsewhere: the PostgreSQL side is still
    reported) or "missing"."""
    from sstore.storage.status import status_of_file

    report: dict[str, Any] = {"state": state_path, "status": "ok", "detail": "",
                              "engine": None, "targets": []}
    last_batch: dict[str, int] = {}
    engine_id: str | None = None
    if not os.path.exists(state_path):
        report.update(status="missing", detail=f"no state file at {state_path} yet")
    else:
        try:
            status = status_of_file(state_path)
        except duckdb.Error as exc:
            if not is_busy(exc):
                raise
            report.update(status="busy", detail=_first_line(exc))
        else:
            report["engine"] = status.to_dict()
            last_batch = {s.name: s.last_batch for s in status.streams}
            engine_id = status.engine_id
    marks = _watermarks(url, targets, engine_id)
    for target in targets:
        watermark, rows = marks.get((target.stream, target.table), (0, None))
        last = last_batch.get(target.stream)
        report["targets"].append({
            **target.to_dict(), "last_batch": last, "watermark": watermark,
            "behind": None if last is None else last > watermark, "rows": rows})
    return report


def format_report(report: Mapping[str, Any]) -> str:
    """``status_report``'s result as a few lines for a log."""
    lines = [f"state file {report['state']}: {report['status']}"
             + (f" ({report['detail']})" if report.get("detail") else "")]
    engine = report.get("engine")
    if engine:
        for p in engine["procedures"]:
            halted = f", HALTED: {p['halted']}" if p.get("halted") else ""
            lines.append(f"  procedure {p['name']}: last batch {p['last_batch']}, "
                         f"{p['pending']} pending{halted}")
        if engine["errors"]:
            lines.append(f"  {len(engine['errors'])} recent errors, latest: "
                         f"{engine['errors'][0]['error']}")
    for t in report.get("targets", ()):
        lag = {None: "unknown", True: "BEHIND", False: "up to date"}[t["behind"]]
        rows = "?" if t["rows"] is None else f"{t['rows']:,}"
        lines.append(f"  {t['stream']} -> {t['table']}: stream at batch {t['last_batch']}, "
                     f"watermark {t['watermark']}, {lag}, {rows} rows")
    return "\n".join(lines)


def _watermarks(url: str, targets: Sequence[StreamTarget], engine_id: str | None
                ) -> dict[tuple[str, str], tuple[int, int | None]]:
    """(stream, target) -> (watermark, rows in the target table) from PostgreSQL. The
    watermark is this engine's (``engine_id``); when the state file could not be read (busy),
    the most recently advanced one of that stream and target."""
    if not targets:
        return {}
    from migrators import watermarks
    from migrators.postgres import connect
    from sstore.base.sql import one_value, qualified

    out: dict[tuple[str, str], tuple[int, int | None]] = {}
    with connect(url) as con:
        for target in targets:  # by the name given, or by the table (any spelling)
            mark = watermarks.watermark_of(con, target.stream, target.table, engine_id) or 0
            rows = None
            if one_value(con.execute("SELECT to_regclass(%s) IS NOT NULL",
                                     (qualified(target.table),)).fetchone()):
                rows = int(one_value(con.execute(f"SELECT count(*) FROM {qualified(target.table)}"
                                                 ).fetchone()))
            out[(target.stream, target.table)] = (mark, rows)
    return out


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
