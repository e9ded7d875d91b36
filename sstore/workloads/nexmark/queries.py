"""Nexmark q0-q8 as sstore dataflows, with the semantics of the nexmark project's Flink SQL.

Every query reads the one event stream ``nexmark_events`` (``generator.EVENT_COLUMNS``; the
Flink views ``person``, ``auction``, ``bid`` are ``event_type`` 0, 1, 2) and writes its results
to the stream ``nexmark_<q>`` (kept: ``retain="all"``, so the results stay in the engine and a
sink can deliver them). Each procedure runs once per input batch as one transaction:

- **q0** pass-through of the bids, **q1** price in euros (``0.908 * price``, DECIMAL(23, 3)),
  **q2** bids of every 123rd auction: one SQL procedure each (set-oriented, chained into the
  batch's statement).
- **q3** persons of OR/ID/CA joined with the category-10 auctions they sell: an incremental
  inner join over two state tables (only the rows that can ever match are kept); each pair is
  emitted once, in the batch where its second side arrives.
- **q4** average winning price per category: auctions in state, each bid joined with its
  auction when ``auction.date_time <= bid.date_time <= expires``, per-auction maximum and
  per-category sum and count kept; a batch emits the categories whose average changed (an
  upsert stream: the last row per category is the result; Flink's AVG of BIGINT, integer
  division). Auctions past their expiry are dropped from state (no later bid can match: event
  time never goes back); bids whose auction has not arrived yet are kept while an auction
  of the same millisecond could still come.
- **q5** hot items: the engine's sliding event-time window (10 s every 2 s) counts bids per
  auction; each closed window emits the auctions with the most bids.
- **q6** average selling price per seller over its last closed auctions (the nexmark SQL that
  Flink cannot run): auctions close when event time passes their expiry; the winning bid is
  the highest in ``[date_time, expires]``; each close emits the seller's average (integer, as
  Flink's AVG of BIGINT) over this and the 10 auctions closed before it (``ROWS BETWEEN 10
  PRECEDING AND CURRENT ROW``), in closing order (expiry, then auction id; the SQL's order by
  the winning bid's time would let a later close land between earlier ones).
- **q7** highest bid per 10 s tumbling window: the engine's window gives each window's maximum
  price; the bids with that price and ``window_end - 10 s <= date_time <= window_end`` (both
  ends included, as the SQL says) are emitted, also a bid at exactly ``window_end`` that comes
  in a later batch.
- **q8** new users: persons and auctions share one 10 s tumbling window keyed by the person
  id (a seller id for an auction), so both sides close together on one watermark; a window
  with a person and an auction of theirs emits ``(id, name, window_start)``.

Windows use a watermark delay of 0: the events are in event-time order (the generator's time
is monotonic), so no row is ever late; a window closes in the batch whose newest event reaches
its end. At the end of the input the windows not yet closed stay open: ``closed_before``
says which results a bounded run of another system (Flink flushes every window at the end)
shares with the engine.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from sstore.engine import Engine
from sstore.execution.transaction import Transaction
from sstore.workloads.nexmark.generator import EVENT_COLUMNS

EVENTS = "nexmark_events"
STATES_Q3 = ("OR", "ID", "CA")
WINDOW_Q5, SLIDE_Q5 = datetime.timedelta(seconds=10), datetime.timedelta(seconds=2)
WINDOW_Q7 = WINDOW_Q8 = datetime.timedelta(seconds=10)
Q6_PRECEDING = 10


def output(query: str) -> str:
    """The stream a query writes its results to."""
    return f"nexmark_{query}"


_BID = "b_auction AS auction, b_bidder AS bidder, b_price AS price, date_time, b_extra AS extra"
SQL_QUERIES = {
    "q0": f"SELECT {_BID} FROM batch WHERE event_type = 2",
    "q1": ("SELECT b_auction AS auction, b_bidder AS bidder, "
           "CAST(0.908 * b_price AS DECIMAL(23, 3)) AS price, date_time, b_extra AS extra "
           "FROM batch WHERE event_type = 2"),
    "q2": "SELECT b_auction AS auction, b_price AS price FROM batch "
          "WHERE event_type = 2 AND b_auction % 123 = 0",
}


def _sql_query(name: str) -> Callable[[Engine], None]:
    def declare(engine: Engine) -> None:
        engine.stream(output(name), retain="all")
        engine.sql_procedure(name, SQL_QUERIES[name], input=EVENTS, output=output(name))
    return declare


def declare_q3(engine: Engine) -> None:
    engine.stream(output("q3"), {"name": "VARCHAR", "city": "VARCHAR", "state": "VARCHAR",
                                 "id": "BIGINT"}, retain="all")
    engine.execute("CREATE TABLE IF NOT EXISTS q3_person (id BIGINT PRIMARY KEY, "
                   "name VARCHAR, city VARCHAR, state VARCHAR)")
    engine.execute("CREATE TABLE IF NOT EXISTS q3_auction (id BIGINT, seller BIGINT)")
    states = ", ".join(f"'{s}'" for s in STATES_Q3)

    @engine.procedure(input=EVENTS, output=output("q3"))
    def q3(tx: Transaction, batch: pa.Table) -> pa.Table:
        """Persons of OR/ID/CA selling in category 10: incremental join over state."""
        tx.execute(f"CREATE OR REPLACE TEMP TABLE q3_np AS SELECT p_id AS id, p_name AS name, "
                   f"p_city AS city, p_state AS state FROM batch "
                   f"WHERE event_type = 0 AND p_state IN ({states})")
        tx.execute("CREATE OR REPLACE TEMP TABLE q3_na AS SELECT a_id AS id, a_seller AS seller "
                   "FROM batch WHERE event_type = 1 AND a_category = 10")
        out = tx.sql("""
            SELECT p.name, p.city, p.state, a.id FROM q3_na AS a
              JOIN (SELECT * FROM q3_person UNION ALL SELECT * FROM q3_np) AS p
              ON a.seller = p.id
            UNION ALL
            SELECT p.name, p.city, p.state, a.id FROM q3_auction AS a
              JOIN q3_np AS p ON a.seller = p.id""")
        tx.execute("INSERT INTO q3_person SELECT * FROM q3_np")
        tx.execute("INSERT INTO q3_auction SELECT * FROM q3_na")
        return out


def declare_q4(engine: Engine) -> None:
    engine.stream(output("q4"), {"category": "BIGINT", "final": "BIGINT"}, retain="all")
    for ddl in (("q4_auction (id BIGINT PRIMARY KEY, category BIGINT, date_time TIMESTAMP, "
                 "expires TIMESTAMP)"),
                "q4_pending (auction BIGINT, price BIGINT, date_time TIMESTAMP)",
                "q4_max (id BIGINT PRIMARY KEY, category BIGINT, final BIGINT)",
                "q4_category (category BIGINT PRIMARY KEY, total HUGEINT, n BIGINT)"):
        engine.execute(f"CREATE TABLE IF NOT EXISTS {ddl}")

    @engine.procedure(input=EVENTS, output=output("q4"))
    def q4(tx: Transaction, batch: pa.Table) -> pa.Table:
        """Average winning bid per category, as an upsert stream of changed categories."""
        tx.execute("INSERT INTO q4_auction SELECT a_id, a_category, date_time, a_expires "
                   "FROM batch WHERE event_type = 1")
        tx.execute("""CREATE OR REPLACE TEMP TABLE q4_bids AS
            SELECT b_auction AS auction, b_price AS price, date_time FROM batch
            WHERE event_type = 2 UNION ALL SELECT * FROM q4_pending""")
        tx.execute("""CREATE OR REPLACE TEMP TABLE q4_win AS
            SELECT a.id, a.category, max(b.price) AS price FROM q4_bids AS b
            JOIN q4_auction AS a ON a.id = b.auction
                AND b.date_time BETWEEN a.date_time AND a.expires
            GROUP BY a.id, a.category""")
        tx.execute("""CREATE OR REPLACE TEMP TABLE q4_delta AS
            SELECT w.category, sum(CASE WHEN m.id IS NULL THEN w.price
                                        ELSE greatest(w.price - m.final, 0) END) AS total,
                   count(*) FILTER (WHERE m.id IS NULL) AS n
            FROM q4_win AS w LEFT JOIN q4_max AS m ON m.id = w.id
            WHERE m.id IS NULL OR w.price > m.final GROUP BY w.category""")
        tx.execute("""INSERT INTO q4_max SELECT id, category, price FROM q4_win
            ON CONFLICT (id) DO UPDATE SET final = greatest(q4_max.final, excluded.final)""")
        tx.execute("""INSERT INTO q4_category SELECT category, total, n FROM q4_delta
            ON CONFLICT (category) DO UPDATE SET total = q4_category.total + excluded.total,
                                                 n = q4_category.n + excluded.n""")
        newest = tx.fetchone("SELECT max(date_time) FROM batch")[0]  # type: ignore[index]
        # a pending bid can only match an auction of its own millisecond or earlier
        tx.execute("DELETE FROM q4_pending")
        tx.execute("""INSERT INTO q4_pending SELECT b.* FROM q4_bids AS b
            WHERE b.date_time >= ? AND NOT EXISTS
                (SELECT 1 FROM q4_auction AS a WHERE a.id = b.auction)""", newest)
        tx.execute("DELETE FROM q4_max WHERE id IN (SELECT id FROM q4_auction "
                   "WHERE expires < ?)", newest)
        tx.execute("DELETE FROM q4_auction WHERE expires < ?", newest)
        return tx.sql("""SELECT c.category, CAST(c.total // c.n AS BIGINT) AS final
            FROM q4_category AS c SEMI JOIN q4_delta AS d ON d.category = c.category
            ORDER BY c.category""")


def declare_q5(engine: Engine) -> None:
    engine.stream("nexmark_q5_bids", {"auction": "BIGINT", "date_time": "TIMESTAMP"})
    engine.sql_procedure("q5_bids", "SELECT b_auction AS auction, date_time FROM batch "
                         "WHERE event_type = 2", input=EVENTS, output="nexmark_q5_bids")
    engine.event_window("nexmark_q5_windows", "nexmark_q5_bids", time="date_time",
                        size=WINDOW_Q5, slide=SLIDE_Q5, key="auction",
                        aggregates={"num": "count(*)"})
    engine.stream(output("q5"), {"auction": "BIGINT", "num": "BIGINT",
                                 "starttime": "TIMESTAMP"}, retain="all")
    engine.sql_procedure("q5", """SELECT auction, num, starttime FROM (
            SELECT auction, num, window_start AS starttime,
                   max(num) OVER (PARTITION BY window_start) AS maxn FROM batch)
        WHERE num >= maxn""", input="nexmark_q5_windows", output=output("q5"))


def declare_q6(engine: Engine) -> None:
    engine.stream(output("q6"), {"seller": "BIGINT", "avg_price": "BIGINT",
                                 "closed": "TIMESTAMP", "auction": "BIGINT"}, retain="all")
    for ddl in (("q6_open (id BIGINT PRIMARY KEY, seller BIGINT, date_time TIMESTAMP, "
                 "expires TIMESTAMP, price BIGINT)"),
                "q6_pending (auction BIGINT, price BIGINT, date_time TIMESTAMP)",
                "q6_closed (seller BIGINT, auction BIGINT, price BIGINT, expires TIMESTAMP)"):
        engine.execute(f"CREATE TABLE IF NOT EXISTS {ddl}")

    @engine.procedure(input=EVENTS, output=output("q6"))
    def q6(tx: Transaction, batch: pa.Table) -> pa.Table:
        """Average selling price of a seller's last 11 closed auctions, at each close."""
        tx.execute("INSERT INTO q6_open SELECT a_id, a_seller, date_time, a_expires, NULL "
                   "FROM batch WHERE event_type = 1")
        tx.execute("""CREATE OR REPLACE TEMP TABLE q6_bids AS
            SELECT b_auction AS auction, b_price AS price, date_time FROM batch
            WHERE event_type = 2 UNION ALL SELECT * FROM q6_pending""")
        tx.execute("""UPDATE q6_open AS o SET price = w.price FROM (
                SELECT a.id, max(b.price) AS price FROM q6_bids AS b
                JOIN q6_open AS a ON a.id = b.auction
                    AND b.date_time BETWEEN a.date_time AND a.expires
                GROUP BY a.id) AS w
            WHERE o.id = w.id AND (o.price IS NULL OR w.price > o.price)""")
        newest = tx.fetchone("SELECT max(date_time) FROM batch")[0]  # type: ignore[index]
        tx.execute("DELETE FROM q6_pending")
        tx.execute("""INSERT INTO q6_pending SELECT b.* FROM q6_bids AS b
            WHERE b.date_time >= ? AND NOT EXISTS
                (SELECT 1 FROM q6_open AS a WHERE a.id = b.auction)""", newest)
        # closed: event time passed the expiry (no later bid can fall inside it); closes come
        # in expiry order, batch after batch
        tx.execute("CREATE OR REPLACE TEMP TABLE q6_now AS SELECT seller, id AS auction, price, "
                   "expires FROM q6_open WHERE expires < ? AND price IS NOT NULL", newest)
        tx.execute("DELETE FROM q6_open WHERE expires < ?", newest)
        tx.execute("INSERT INTO q6_closed SELECT * FROM q6_now")
        out = tx.sql(f"""SELECT seller, avg_price, expires AS closed, auction FROM (
                SELECT seller, auction, expires,
                       CAST(sum(price) OVER w // count(*) OVER w AS BIGINT) AS avg_price
                FROM q6_closed WHERE seller IN (SELECT seller FROM q6_now)
                WINDOW w AS (PARTITION BY seller ORDER BY expires, auction
                             ROWS BETWEEN {Q6_PRECEDING} PRECEDING AND CURRENT ROW))
            WHERE auction IN (SELECT auction FROM q6_now)""")
        tx.execute(f"""DELETE FROM q6_closed WHERE (seller, auction) IN (
                SELECT seller, auction FROM (SELECT seller, auction, row_number() OVER (
                    PARTITION BY seller ORDER BY expires DESC, auction DESC) AS back
                    FROM q6_closed) WHERE back > {Q6_PRECEDING})""")
        return out


def declare_q7(engine: Engine) -> None:
    engine.stream("nexmark_q7_bids", {"auction": "BIGINT", "bidder": "BIGINT",
                                      "price": "BIGINT", "date_time": "TIMESTAMP",
                                      "extra": "VARCHAR"})
    engine.sql_procedure("q7_bids", f"SELECT {_BID} FROM batch WHERE event_type = 2",
                         input=EVENTS, output="nexmark_q7_bids")
    engine.event_window("nexmark_q7_windows", "nexmark_q7_bids", time="date_time",
                        size=WINDOW_Q7, aggregates={"maxprice": "max(price)"})
    engine.stream(output("q7"), {"auction": "BIGINT", "bidder": "BIGINT", "price": "BIGINT",
                                 "date_time": "TIMESTAMP", "extra": "VARCHAR",
                                 "window_end": "TIMESTAMP"}, retain="all")
    engine.execute("CREATE TABLE IF NOT EXISTS q7_recent (auction BIGINT, bidder BIGINT, "
                   "price BIGINT, date_time TIMESTAMP, extra VARCHAR, fresh BOOLEAN)")
    engine.execute("CREATE TABLE IF NOT EXISTS q7_fired (window_start TIMESTAMP, "
                   "window_end TIMESTAMP, maxprice BIGINT, fresh BOOLEAN)")

    @engine.procedure(input=("nexmark_q7_bids", "nexmark_q7_windows"), output=output("q7"))
    def q7(tx: Transaction, batches: dict[str, pa.Table]) -> pa.Table:
        """The bids at each closed window's highest price, both window ends included."""
        tx.execute("INSERT INTO q7_recent SELECT *, true FROM nexmark_q7_bids_batch")
        tx.execute("INSERT INTO q7_fired SELECT window_start, window_end, maxprice, true "
                   "FROM nexmark_q7_windows_batch")
        out = tx.sql("""SELECT r.auction, r.bidder, r.price, r.date_time, r.extra, f.window_end
            FROM q7_recent AS r JOIN q7_fired AS f ON r.price = f.maxprice
                AND r.date_time BETWEEN f.window_start AND f.window_end
            WHERE r.fresh OR f.fresh""")
        newest = tx.fetchone("SELECT max(date_time) FROM q7_recent")[0]  # type: ignore[index]
        # open windows start at the last fired end; a fired window still matches a bid of
        # exactly its end, and no bid is older than the newest one seen
        tx.execute("DELETE FROM q7_recent WHERE date_time < coalesce((SELECT max(window_end) "
                   "FROM q7_fired), TIMESTAMP '-infinity')")
        tx.execute("DELETE FROM q7_fired WHERE window_end < ?", newest)
        tx.execute("UPDATE q7_recent SET fresh = false WHERE fresh")
        tx.execute("UPDATE q7_fired SET fresh = false WHERE fresh")
        return out


def declare_q8(engine: Engine) -> None:
    engine.stream("nexmark_q8_people", {"id": "BIGINT", "name": "VARCHAR",
                                        "date_time": "TIMESTAMP", "kind": "TINYINT"})
    engine.sql_procedure("q8_people", """SELECT coalesce(p_id, a_seller) AS id, p_name AS name,
            date_time, event_type AS kind FROM batch WHERE event_type IN (0, 1)""",
                         input=EVENTS, output="nexmark_q8_people")
    engine.event_window("nexmark_q8_windows", "nexmark_q8_people", time="date_time",
                        size=WINDOW_Q8, key="id",
                        aggregates={"name": "max(name)",
                                    "persons": "count(*) FILTER (WHERE kind = 0)",
                                    "auctions": "count(*) FILTER (WHERE kind = 1)"})
    engine.stream(output("q8"), {"id": "BIGINT", "name": "VARCHAR", "starttime": "TIMESTAMP"},
                  retain="all")
    engine.sql_procedure("q8", "SELECT id, name, window_start AS starttime FROM batch "
                         "WHERE persons > 0 AND auctions > 0",
                         input="nexmark_q8_windows", output=output("q8"))


@dataclass(frozen=True)
class Query:
    """One Nexmark query: how to declare it, what its result is."""

    name: str
    declare: Callable[[Engine], None]
    #: True: the result is the last row per ``key`` of the output stream (an upsert stream)
    key: tuple[str, ...] = ()


QUERIES: dict[str, Query] = {
    "q0": Query("q0", _sql_query("q0")),
    "q1": Query("q1", _sql_query("q1")),
    "q2": Query("q2", _sql_query("q2")),
    "q3": Query("q3", declare_q3),
    "q4": Query("q4", declare_q4, key=("category",)),
    "q5": Query("q5", declare_q5),
    "q6": Query("q6", declare_q6),
    "q7": Query("q7", declare_q7),
    "q8": Query("q8", declare_q8),
}


def declare(engine: Engine, query: str) -> None:
    """Declare the event stream and ``query``'s dataflow on ``engine``."""
    engine.stream(EVENTS, EVENT_COLUMNS)
    QUERIES[query].declare(engine)


def result(engine: Engine, query: str) -> pa.Table:
    """The query's result as the engine holds it: every row of its output stream, or, for an
    upsert stream, the last row per key (without the engine's batch-id column)."""
    stream = output(query)
    names = [n for n in engine.query(f"SELECT * FROM {stream} LIMIT 0").column_names
             if n != "_batch_id"]
    cols = ", ".join(names)
    key = QUERIES[query].key
    if not key:
        return engine.query(f"SELECT {cols} FROM {stream}")
    return engine.query(f"SELECT {cols} FROM {stream} QUALIFY row_number() OVER "
                        f"(PARTITION BY {', '.join(key)} ORDER BY _batch_id DESC) = 1")
