"""The real system the model is compared with: one engine on a state file (full durability) or
in memory with an input log (weak durability), the dataflow of ``dataflow`` declared on it, and
one PostgreSQL table its sink (``migrators.StreamToPostgres``, ``sstore migrate``) fills.

Everything here is plain plumbing: open, close, read what is held (``observe``), and the
user's own hands on the target (truncate, drop, delete a row, create it with columns of lower
precision).
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.model.dataflow import APPENDED, ENRICH_NAMES, declare
from benchmarks.model.expected import Observed, by_batch
from sstore import Engine
from sstore.base.sql import ident

#: the engine's checkpoint bound in the model (small, so that a few ad hoc writes pass it)
WAL_LIMIT = 64 << 10
#: what one step may add to the WAL beyond the bound before the engine's next checkpoint
WAL_SLACK = 96 << 10
#: a note's payload: big enough that a handful of them pass ``WAL_LIMIT``
NOTE_BYTES = 24 << 10


@dataclass
class Program:
    """What the program opening the engine declares: the enrich procedure's name, the names
    it retires, the column types of ``orders`` (None: the right ones), whether the streams
    evolved (``k`` widened; columns appended) and the enrich procedure's version
    (``benchmarks.model.changes``)."""

    enrich_name: str = ENRICH_NAMES[0]
    retire: tuple[str, ...] = ()
    orders_types: dict[str, str] | None = None
    evolved: bool = False
    enrich_version: int = 1
    appended: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"enrich_name": self.enrich_name, "retire": list(self.retire),
                "orders_types": self.orders_types, "evolved": self.evolved,
                "enrich_version": self.enrich_version, "appended": self.appended}


@dataclass
class System:
    """One program's real system (module docstring)."""

    mode: str  # "full" | "weak"
    workdir: Path
    url: str  # the PostgreSQL database of the target
    table: str = field(default_factory=lambda: f"model_{uuid.uuid4().hex[:12]}")
    engine: Engine | None = None
    #: the continuous sink feeding the target (``StreamToPostgres`` or ``SinkGroup``, attached),
    #: detached before the engine closes, as a program's ``finally`` would
    attached: Any = None
    _pg: psycopg.Connection | None = None

    @property
    def path(self) -> str:
        """The state file (full) or the input log (weak)."""
        return str(self.workdir / ("state.duckdb" if self.mode == "full" else "input.log"))

    @property
    def consumer(self) -> str:
        return f"migrator:{self.table}"

    def new_engine(self) -> Engine:
        if self.mode == "full":
            return Engine(self.path, checkpoint_wal_bytes=WAL_LIMIT, gc_min_seconds=0)
        return Engine(":memory:", input_log=self.path, gc_min_seconds=0)

    def open(self, program: Program) -> Engine:
        """Open and start the engine (a start refuses a bad declaration here, loudly)."""
        assert self.engine is None
        engine = self.new_engine()
        try:
            declare(engine, sink_consumer=self.consumer, enrich_name=program.enrich_name,
                    retire=program.retire, orders_types=program.orders_types,
                    evolved=program.evolved, enrich_version=program.enrich_version,
                    appended=program.appended)
            engine.batches("orders")  # starts it: recovery, replay, the declaration checks
        except BaseException:
            engine.close()
            raise
        self.engine = engine
        return engine

    def close(self) -> None:
        self.detach()
        if self.engine is not None:
            engine, self.engine = self.engine, None
            engine.close()

    def detach(self) -> None:
        """Detach the continuous sink (what has committed is delivered first, for a few
        seconds at most) and forget it in the engine's list of sinks."""
        if self.attached is None:
            return
        attached, self.attached = self.attached, None
        try:
            attached.detach(flush_seconds=10.0)
        finally:
            if self.engine is not None:
                for sink in getattr(attached, "sinks", [attached]):
                    self.engine.unregister_sink(sink)

    @property
    def e(self) -> Engine:
        assert self.engine is not None, "the engine is not open"
        return self.engine

    # ------------------------------------------------------------------ reading
    def observe(self) -> Observed:
        e = self.e

        def rows(sql: str) -> list[tuple[Any, ...]]:
            return e.query_rows(sql)[1]

        def appended(stream: str) -> str:  # NULL for a column not appended (yet)
            schema = e.schema(stream)
            names = set(schema.names) if schema is not None else set()
            return ", ".join(c if c in names else f"NULL AS {c}" for c in APPENDED)

        return Observed(
            orders=by_batch(rows(f"SELECT _batch_id, rec, k, amt, ts, {appended('orders')} "
                                 f"FROM orders")),
            enriched=by_batch(rows(f"SELECT _batch_id, rec, k, amt, ts, "
                                   f"{appended('enriched')}, seen FROM enriched")),
            flagged=by_batch(rows("SELECT _batch_id, rec, big FROM flagged")),
            totals={k: (n, s) for k, n, s in rows("SELECT k, n, s FROM totals")},
            archive=Counter(rows("SELECT rec, tag FROM archive")),
            notes=Counter((i, len(p)) for i, p in rows("SELECT id, payload FROM notes")),
            target=self.target_rows(), sink_acked=e.acknowledged(self.consumer),
            reader_acked=e.acknowledged("reader"), wal_bytes=self.wal_bytes())

    def wal_bytes(self) -> int:
        if self.mode != "full":
            return 0
        try:
            return os.path.getsize(self.path + ".wal")
        except OSError:
            return 0

    # ------------------------------------------------------------------ the target
    def pg(self) -> psycopg.Connection:
        """One autocommit connection for the checks and the user's hands (no lock held
        between statements); a new one once the server restarted (the old one is dead)."""
        if self._pg is not None and not self._pg.closed:
            try:
                self._pg.execute("SELECT 1")
            except psycopg.OperationalError:
                self.close_pg()
        if self._pg is None or self._pg.closed:
            self._pg = psycopg.connect(self.url, autocommit=True)
        return self._pg

    def close_pg(self) -> None:
        if self._pg is not None:
            self._pg.close()
            self._pg = None

    def target_exists(self) -> bool:
        return bool(self.pg().execute("SELECT to_regclass(%s) IS NOT NULL",
                                      [f"public.{self.table}"]).fetchone()[0])

    def target_rows(self) -> Counter[tuple[Any, ...]] | None:
        if not self.target_exists():
            return None
        # not prepared: a widened column (the target following an evolution) would make
        # PostgreSQL refuse a prepared plan ("cached plan must not change result type")
        names = {r[0] for r in self.pg().execute(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass(%s) AND "
            "attnum > 0 AND NOT attisdropped", [f"public.{self.table}"], prepare=False)}
        appended = ", ".join(c if c in names else f"NULL AS {c}" for c in APPENDED)
        return Counter(self.pg().execute(
            f"SELECT rec, k, amt, ts, {appended}, seen FROM {ident(self.table)}",
            prepare=False).fetchall())

    def by_hand(self, sql: str, *params: Any) -> int:
        """A user's statement on the target (``{t}`` is its quoted name); rows it touched."""
        return self.pg().execute(sql.format(t=ident(self.table)), list(params)).rowcount

    def drop_target(self) -> None:
        self.pg().execute(f"DROP TABLE IF EXISTS {ident(self.table)}")
