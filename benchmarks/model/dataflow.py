"""The model's dataflow, declared the same way by the state machine and by its crash child, and
what each output must hold for one border batch (pure functions of the batch's rows).

    orders (border; rec, k, amt DECIMAL(10,2), ts)
      -> enrich (Python): reads its own batch back from the ``orders`` table by ``_batch_id``
         (issue 34 item 1), adds to the state table ``totals``, writes ``enriched`` (+ seen)
      -> enriched (retain "all"; held by the sink ``migrator:<target>`` and read into PostgreSQL)
      -> double (SQL) -> doubled -> flag (SQL) -> flagged (retain "all"; the chain runs fused)

plus the ad hoc tables ``archive`` (what a transaction copied from ``orders``) and ``notes``
(padded rows written by ``execute`` and ``transaction``: the WAL check), and the external
consumer ``reader`` of ``enriched`` (reads with ``read_batches``, acknowledges).

Every record has a unique ``rec`` (1, 2, 3... in the order a source produces them) and every
batch's id is the ``rec`` of its last record, as a polling source's offset would be: so that
``ingest``, ``ingest_and_run`` and the Coalescer (``batch_id_of``) number batches alike.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, NamedTuple

from sstore import Engine
from sstore.base.faults import crash_point

ORDERS = {"rec": "BIGINT", "k": "INTEGER", "amt": "DECIMAL(10,2)", "ts": "TIMESTAMP"}
#: redeclarations of ``orders`` with other column types (issue 34 item 3): each must be refused
OTHER_TYPES = {
    "k_varchar": {**ORDERS, "k": "VARCHAR"},
    "amt_double": {**ORDERS, "amt": "DOUBLE"},
    "ts_date": {**ORDERS, "ts": "DATE"},
}
ENRICHED = {**ORDERS, "seen": "BIGINT"}
#: the dataflow after the model's ``evolve`` step (issue 38): ``k`` widened to BIGINT in
#: ``orders`` and ``enriched`` (every value stays the same value; the target follows)
EVOLVED_ORDERS = {**ORDERS, "k": "BIGINT"}
EVOLVED_ENRICHED = {**EVOLVED_ORDERS, "seen": "BIGINT"}
#: the columns the model's ``append_columns`` step appends to ``orders`` and ``enriched``
#: (issue 38): the rows stored before it read ``note`` NULL and ``channel`` its declared
#: default; later batches carry both (a record's own values, NULL too)
DEFAULT_CHANNEL = "web"
APPENDED = {"note": "VARCHAR", "channel": f"VARCHAR DEFAULT '{DEFAULT_CHANNEL}'"}
DOUBLED = {"rec": "BIGINT", "amt2": "DECIMAL(12,2)"}
FLAGGED = {"rec": "BIGINT", "big": "BOOLEAN"}
READER = "reader"
#: names the enrich procedure may have: a "rename" restarts with the other one and retires
#: the old (``Engine.retire``, issue 34 item 9)
ENRICH_NAMES = ("enrich", "enrich_v2")
BASE_TS = datetime.datetime(2024, 12, 31, 23, 59, 58)


class Record(NamedTuple):
    """One row of ``orders`` as the model knows it: exact values."""

    rec: int
    k: int
    amt: Decimal
    ts: datetime.datetime
    #: the appended columns (``APPENDED``): None in a record sent before them
    note: str | None = None
    channel: str | None = None


def make_record(rec: int, k: int, cents: int, micros: int, appended: bool = False) -> Record:
    """A record whose amount has at most two decimals (so it fits DECIMAL(10,2) exactly, as a
    user would type it) and whose time has a fraction of a second (so that a target of lower
    precision would round it: issue 34 item 4). ``appended``: with values (some NULL, some
    the default's) in the appended columns, made from its number."""
    note, channel = ((None if rec % 2 else f"n{rec}", (None, "shop", DEFAULT_CHANNEL)[rec % 3])
                     if appended else (None, None))
    return Record(rec, k, Decimal(cents).scaleb(-2), BASE_TS + datetime.timedelta(
        microseconds=micros), note, channel)


def values(record: Record, appended: bool) -> tuple[Any, ...]:
    """The values a program sends for ``record``: the appended columns only once they are
    declared (``appended``)."""
    return tuple(record) if appended else tuple(record)[:4]


def declare(engine: Engine, *, sink_consumer: str, enrich_name: str = "enrich",
            retire: Sequence[str] = (), orders_types: dict[str, str] | None = None,
            evolved: bool = False, enrich_version: int = 1, appended: bool = False) -> None:
    """Declare the dataflow (module docstring) on ``engine``; ``sink_consumer`` is the
    consumer name of the PostgreSQL sink (``migrator:<table>``), declared with the dataflow
    so that ``enriched`` is kept for it from the first batch on. ``evolved``: with the
    widened columns (``EVOLVED_ORDERS``); ``enrich_version``: the version the enrich
    procedure is declared with (``sstore.storage.upgrades``; each version computes the same rows);
    ``appended``: ``orders`` and ``enriched`` with the ``APPENDED`` columns at their end."""
    more = APPENDED if appended else {}
    engine.stream("orders", orders_types or {**(EVOLVED_ORDERS if evolved else ORDERS), **more})
    engine.stream("enriched", {**(EVOLVED_ENRICHED if evolved else ENRICHED), **more},
                  retain="all")
    passed = "".join(f", {c}" for c in more)
    engine.stream("doubled", DOUBLED)
    engine.stream("flagged", FLAGGED, retain="all")
    engine.consumer("enriched", sink_consumer)
    engine.consumer("enriched", READER)
    engine.execute("CREATE TABLE IF NOT EXISTS totals (k INTEGER PRIMARY KEY, n BIGINT, "
                   "s DECIMAL(18,2))")
    engine.execute("CREATE TABLE IF NOT EXISTS archive (rec BIGINT, tag INTEGER)")
    engine.execute("CREATE TABLE IF NOT EXISTS notes (id INTEGER, payload VARCHAR)")
    for name in retire:
        engine.retire(name)

    @engine.procedure(input="orders", output="enriched", name=enrich_name,
                      version=enrich_version)
    def enrich(tx: Any, batch: Any) -> Any:
        # read the batch back from the border stream's table (issue 34 item 1): the engine
        # promises the same answer whichever ingest path brought the batch
        seen = tx.fetchone("SELECT count(*) FROM orders WHERE _batch_id = ?", tx.batch_id)[0]
        tx.execute("INSERT INTO totals SELECT k, count(*), sum(amt) FROM batch GROUP BY k "
                   "ON CONFLICT (k) DO UPDATE SET n = totals.n + excluded.n, "
                   "s = totals.s + excluded.s")
        crash_point("procedure.body")  # a crash or a stop inside user code, mid-transaction
        return tx.sql(f"SELECT rec, k, amt, ts, ?::BIGINT AS seen{passed} FROM batch", seen)

    engine.sql_procedure("double", "SELECT rec, amt * 2 AS amt2 FROM batch",
                         input="enriched", output="doubled")
    engine.sql_procedure("flag", "SELECT rec, amt2 > 100 AS big FROM batch",
                         input="doubled", output="flagged")


# ------------------------------------------------------------------ what each output holds
def enriched_rows(batch: Sequence[Record]) -> list[tuple[Any, ...]]:
    """``enriched``'s batch for this ``orders`` batch: every record (its appended columns
    too: None before they were) with ``seen``, the number of rows ``enrich`` found in
    ``orders`` under its batch-id (the whole batch)."""
    return [(*r, len(batch)) for r in batch]


def flagged_rows(batch: Sequence[Record]) -> list[tuple[Any, ...]]:
    return [(r.rec, r.amt * 2 > 100) for r in batch]


def add_totals(totals: dict[int, tuple[int, Decimal]], batch: Sequence[Record]) -> None:
    for r in batch:
        n, s = totals.get(r.k, (0, Decimal(0)))
        totals[r.k] = (n + 1, s + r.amt)
