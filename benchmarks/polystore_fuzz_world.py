"""The world the polystore's differential test runs in: a split object and its oracle.

``ev`` is split as a running system splits it: an engine stream (``ev_in``, fresh batches) and
the PostgreSQL table a sink delivers that stream into (``public.ev_old``). ``dim`` lives in
PostgreSQL only. The oracle is PostgreSQL alone over all the rows: schema ``oracle`` holds
``ev`` (every row ever ingested, whatever fragment holds it now) and a view ``dim``, so the
same query text, run with ``search_path = oracle``, is PostgreSQL's answer.

Between queries the world moves (``step``): a batch arrives, the sink delivers, garbage
collection runs, each at random, so the queries see batches in the stream only, in both
fragments (delivered, not yet collected) and in PostgreSQL only.
"""

from __future__ import annotations

import datetime
import decimal
import random
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pyarrow as pa

from migrators.engine_to_postgres import StreamToPostgres
from sstore import Engine
from sstore.base.sql import ident as quote_identifier
from sstore.base.sql import literal as quote_literal
from sstore.polystore import Polystore
from sstore.polystore.cost import CostModel

EV_COLUMNS = {"id": "INTEGER", "k": "INTEGER", "amt": "DECIMAL(8,2)", "name": "VARCHAR",
              "d": "DATE", "flag": "BOOLEAN", "ts": "TIMESTAMPTZ"}
#: the oracle's ``ev``: the split object's columns in its order (the stream's batch-id first,
#: which the sink's table keeps too), so ``SELECT *`` and alias lists mean the same
EV_PG = ("_batch_id bigint, id integer, k integer, amt numeric(8,2), name text, d date, "
         "flag boolean, ts timestamptz")
#: dim: a char(3) (PostgreSQL pads it and ignores the padding when comparing) and an
#: unconstrained numeric (more digits than any fixed DECIMAL of DuckDB's: 18 before the point
#: and 19 after; past 38 in all, Arrow's decimal128 holds none and every plan, PostgreSQL's
#: own included, answers text, as ``migrators`` reads it: docs/polystore.md)
DIM_ROWS = [(0, "zero", "a_b", "ab", decimal.Decimal("0.1234567890123456789")),
            (1, "one", "ab", "x", decimal.Decimal("123456789012345678.5")),
            (2, "two", None, "ab ", None), (3, None, "A%b", None, decimal.Decimal("-2.5")),
            (4, "four", "abc", "q", decimal.Decimal(1))]
#: PostgreSQL's time zone for the world's database: not the machine's (UTC), and not a whole
#: number of hours, so a timestamptz shown, cut or cast to a date in another zone differs
TIME_ZONE = "Asia/Kolkata"
NAMES = ["a_b", "ab", "abc", "A%b", "b", "", " ab", "Ab"]

Row = tuple[object, ...]


def random_row(rng: random.Random, ident: int) -> Row:
    """One ``ev`` row: every column but ``id`` may be NULL."""
    def maybe(value: object) -> object:
        return None if rng.random() < 0.15 else value
    amt = decimal.Decimal(rng.randint(-50000, 50000)) / 100
    day = datetime.date(2024, 1, 1) + datetime.timedelta(days=rng.randint(0, 800))
    moment = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(
        minutes=rng.randint(0, 800 * 24 * 60))
    return (ident, maybe(rng.randint(0, 6)), maybe(amt), maybe(rng.choice(NAMES)),
            maybe(day), maybe(rng.random() < 0.5), maybe(moment))


class World:
    """The split object ``ev``, the PostgreSQL table ``dim`` and the oracle, in ``directory``
    and the (empty) PostgreSQL database at ``pg_url``. ``spark``: add a Spark engine (its
    plans are proposed too)."""

    def __init__(self, directory: Path, pg_url: str, rng: random.Random, *,
                 spark: bool = False) -> None:
        self.rng = rng
        self.pg_url = pg_url
        self.next_id = 1
        self.next_batch = 1
        self.engine = Engine(str(directory / "fuzz.duckdb"))
        self.engine.stream("ev_in", dict(EV_COLUMNS))
        self.sink = StreamToPostgres(self.engine, "ev_in", pg_url, "public.ev_old",
                                     batch_column="_batch_id")
        with psycopg.connect(pg_url, autocommit=True) as con:
            database = con.info.dbname
            con.execute(f"ALTER DATABASE {quote_identifier(database)} SET timezone = "
                        f"{quote_literal(TIME_ZONE)}")
        self.oracle = psycopg.connect(pg_url, autocommit=True)
        self.oracle.execute("CREATE TABLE public.dim (k integer, cat text, name text, "
                            "code char(3), ratio numeric)")
        with self.oracle.cursor() as cur:
            cur.executemany("INSERT INTO public.dim VALUES (%s, %s, %s, %s, %s)", DIM_ROWS)
        self.oracle.execute("CREATE SCHEMA oracle")
        self.oracle.execute(f"CREATE TABLE oracle.ev ({EV_PG})")
        self.oracle.execute("CREATE VIEW oracle.dim AS SELECT * FROM public.dim")
        for _ in range(3):
            self.ingest()
        self.sink.run_once()          # batches 1-3 in both fragments
        self.ingest()                 # batch 4 in the stream only
        self.ps = Polystore(str(directory / "catalog.json"), costs=CostModel())
        self.ps.attach_engine("stream", self.engine)
        self.ps.add_postgres("pg", pg_url)
        if spark:
            self.ps.add_spark("spark")
        self.ps.split("ev", {"stream": "ev_in", "pg": "public.ev_old"})

    def ingest(self) -> None:
        """One batch of 0-6 random rows, into the stream and the oracle."""
        rows = [random_row(self.rng, self.next_id + i) for i in range(self.rng.randint(0, 6))]
        self.next_id += len(rows)
        table = pa.table({c: [r[i] for r in rows] for i, c in enumerate(EV_COLUMNS)})
        self.engine.ingest("ev_in", table, batch_id=self.next_batch)
        self.next_batch += 1
        with self.oracle.cursor() as cur:
            cur.executemany("INSERT INTO oracle.ev VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                            [(self.next_batch - 1, *row) for row in rows])

    def step(self) -> None:
        """Between queries: a batch may arrive, the sink may deliver, GC may run."""
        if self.rng.random() < 0.5:
            self.ingest()
        if self.rng.random() < 0.4:
            self.sink.run_once()
        if self.rng.random() < 0.3:
            self.engine.collect_garbage()

    def expected(self, sql: str) -> tuple[list[str], list[Row]]:
        """PostgreSQL's answer over all the rows: column names and rows."""
        with self.oracle.cursor() as cur:
            cur.execute("SET search_path = oracle")
            try:
                cur.execute(sql)
                names = [d.name for d in cur.description or ()]
                return names, list(cur.fetchall())
            finally:
                cur.execute("RESET search_path")

    def close(self) -> None:
        self.ps.close()
        self.sink.close()
        self.engine.close()
        self.oracle.close()


def columns_of(table: pa.Table) -> tuple[list[str], list[Row]]:
    """An Arrow answer as (column names, rows)."""
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return list(table.column_names), list(zip(*columns)) if columns else []


def normalised(rows: Sequence[Row]) -> list[tuple[str, ...]]:
    """Rows as a sorted multiset of comparable values: numbers of any type as one text form
    (a numeric 3.50, a double 3.5 and an integer are compared by value, to 6 places), times
    and dates by their ISO text."""
    def value(v: object) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, bool):
            return f"b:{v}"
        if isinstance(v, (int, float, decimal.Decimal)):
            number = float(v)  # 12 significant digits: a double's rounding passes, a numeric
            return f"n:{0.0 if number == 0 else number:.12g}"  # cut to 3 places does not
        if isinstance(v, datetime.datetime) and v.tzinfo is not None:
            return f"t:{v.astimezone(datetime.UTC).isoformat()}"  # the same instant
        if isinstance(v, (datetime.date, datetime.datetime, datetime.time)):
            return f"t:{v.isoformat()}"
        if isinstance(v, datetime.timedelta):
            return f"i:{v.total_seconds()}"
        return f"s:{v}"
    return sorted(tuple(value(v) for v in row) for row in rows)
