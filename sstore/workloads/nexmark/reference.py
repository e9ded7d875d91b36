"""Nexmark q0-q8 over all the events at once, in plain DuckDB SQL: the yardstick every system's
result is compared with (the tests, and ``benchmarks.nexmark``'s ``results_equal``).

Written from the nexmark project's Flink SQL, not from the dataflows in ``queries``: the
views ``person``, ``auction``, ``bid`` over the one event table, the windowing TVFs spelled out
(a hopping window of 10 s every 2 s is the five 2 s-aligned windows a row falls in). The
result of a windowed query is the windows that closed by the end of the input, i.e. whose end
is at or before the newest event time of the rows it windows (what a watermark of delay 0 has
reached; a bounded Flink run also flushes the rest, which ``closed`` drops). Flink's AVG of a
BIGINT is a BIGINT (the sum divided by the count, truncated): ``//`` here.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

VIEWS = """
CREATE OR REPLACE TEMP VIEW person AS SELECT p_id AS id, p_name AS name, p_email AS emailAddress,
    p_credit_card AS creditCard, p_city AS city, p_state AS state, date_time AS dateTime,
    p_extra AS extra FROM events WHERE event_type = 0;
CREATE OR REPLACE TEMP VIEW auction AS SELECT a_id AS id, a_item_name AS itemName,
    a_description AS description, a_initial_bid AS initialBid, a_reserve AS reserve,
    date_time AS dateTime, a_expires AS expires, a_seller AS seller, a_category AS category,
    a_extra AS extra FROM events WHERE event_type = 1;
CREATE OR REPLACE TEMP VIEW bid AS SELECT b_auction AS auction, b_bidder AS bidder,
    b_price AS price, b_channel AS channel, b_url AS url, date_time AS dateTime,
    b_extra AS extra FROM events WHERE event_type = 2;
"""

REFERENCE: dict[str, str] = {
    "q0": "SELECT auction, bidder, price, dateTime AS date_time, extra FROM bid",
    "q1": "SELECT auction, bidder, CAST(0.908 * price AS DECIMAL(23, 3)) AS price, "
          "dateTime AS date_time, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    "q3": """SELECT P.name, P.city, P.state, A.id FROM auction AS A
             JOIN person AS P ON A.seller = P.id
             WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
    "q4": """SELECT Q.category, CAST(sum(Q.final) // count(*) AS BIGINT) AS final FROM (
                SELECT max(B.price) AS final, A.category FROM auction AS A, bid AS B
                WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
                GROUP BY A.id, A.category) AS Q
             GROUP BY Q.category""",
    "q5": """WITH hop AS (
                SELECT b.auction, s AS starttime, s + INTERVAL 10 SECOND AS endtime
                FROM bid AS b, (SELECT unnest(generate_series(0, 4)) AS k) AS ks,
                     LATERAL (SELECT time_bucket(INTERVAL 2 SECOND, b.dateTime)
                                     - k * INTERVAL 2 SECOND AS s)
                WHERE s + INTERVAL 10 SECOND <= (SELECT max(dateTime) FROM bid)),
             AuctionBids AS (SELECT auction, count(*) AS num, starttime, endtime FROM hop
                             GROUP BY auction, starttime, endtime),
             MaxBids AS (SELECT max(num) AS maxn, starttime, endtime FROM AuctionBids
                         GROUP BY starttime, endtime)
             SELECT A.auction, A.num, A.starttime FROM AuctionBids AS A JOIN MaxBids AS M
             ON A.starttime = M.starttime AND A.endtime = M.endtime AND A.num >= M.maxn""",
    "q6": """WITH won AS (
                SELECT A.id AS auction, A.seller, A.expires, max(B.price) AS price
                FROM auction AS A JOIN bid AS B ON A.id = B.auction
                    AND B.dateTime BETWEEN A.dateTime AND A.expires
                WHERE A.expires < (SELECT max(date_time) FROM events)
                GROUP BY A.id, A.seller, A.expires)
             SELECT seller, CAST(sum(price) OVER w // count(*) OVER w AS BIGINT) AS avg_price,
                    expires AS closed, auction FROM won
             WINDOW w AS (PARTITION BY seller ORDER BY expires, auction
                          ROWS BETWEEN 10 PRECEDING AND CURRENT ROW)""",
    "q7": """SELECT B.auction, B.bidder, B.price, B.dateTime AS date_time, B.extra,
                    B1.dateTime AS window_end
             FROM bid AS B JOIN (
                SELECT max(price) AS maxprice, time_bucket(INTERVAL 10 SECOND, dateTime)
                       + INTERVAL 10 SECOND AS dateTime
                FROM bid GROUP BY time_bucket(INTERVAL 10 SECOND, dateTime)) AS B1
             ON B.price = B1.maxprice
             WHERE B.dateTime BETWEEN B1.dateTime - INTERVAL 10 SECOND AND B1.dateTime
               AND B1.dateTime <= (SELECT max(dateTime) FROM bid)""",
    "q8": """WITH P AS (SELECT id, name, time_bucket(INTERVAL 10 SECOND, dateTime) AS starttime
                        FROM person GROUP BY ALL),
                  A AS (SELECT seller, time_bucket(INTERVAL 10 SECOND, dateTime) AS starttime
                        FROM auction GROUP BY ALL)
             SELECT P.id, P.name, P.starttime FROM P JOIN A
             ON P.id = A.seller AND P.starttime = A.starttime
             WHERE P.starttime + INTERVAL 10 SECOND <= (SELECT max(date_time) FROM events
                                                        WHERE event_type IN (0, 1))""",
}


def reference(events: pa.Table, query: str) -> pa.Table:
    """``query``'s result over ``events`` (``generator.EVENT_SCHEMA``), all at once."""
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("events", events)
        con.execute(VIEWS)
        return con.execute(REFERENCE[query]).to_arrow_table()
    finally:
        con.close()


def same_rows(a: pa.Table, b: pa.Table) -> bool:
    """The same multiset of rows (column order and names from ``a``; values compared as
    DuckDB compares them, so DECIMAL 1.500 equals 1.5 and TIMESTAMP precisions agree)."""
    if a.num_rows != b.num_rows or a.num_columns != b.num_columns:
        return False
    con = duckdb.connect()
    try:
        con.register("a", a)
        con.register("b", b.rename_columns(a.column_names))
        cols = ", ".join(f'"{c}"' for c in a.column_names)
        diff = con.execute(f"SELECT count(*) FROM ((SELECT {cols} FROM a EXCEPT ALL "
                           f"SELECT {cols} FROM b) UNION ALL (SELECT {cols} FROM b EXCEPT ALL "
                           f"SELECT {cols} FROM a))").fetchone()
        return diff is not None and diff[0] == 0
    finally:
        con.close()


#: The windows a bounded run of another system flushed at the end of its input although no
#: watermark of the input closed them: kept only if they closed (the reference's rule).
CLOSED: dict[str, str] = {
    "q5": "starttime + INTERVAL 10 SECOND <= (SELECT max(date_time) FROM events "
          "WHERE event_type = 2)",
    "q7": "window_end <= (SELECT max(date_time) FROM events WHERE event_type = 2)",
    "q8": "starttime + INTERVAL 10 SECOND <= (SELECT max(date_time) FROM events "
          "WHERE event_type IN (0, 1))",
}


def closed(events: pa.Table, query: str, rows: pa.Table) -> pa.Table:
    """``rows`` (a result with the reference's columns) without the windows that the events
    did not close."""
    if query not in CLOSED:
        return rows
    con = duckdb.connect()
    try:
        con.register("events", events)
        con.register("found", rows)
        return con.execute(f"SELECT * FROM found WHERE {CLOSED[query]}").to_arrow_table()
    finally:
        con.close()
