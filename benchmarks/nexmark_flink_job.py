"""One Nexmark query on Flink SQL (PyFlink), run by ``benchmarks.nexmark_flink`` in Flink's own
virtual environment: standard library and PyFlink only, no project imports.

    python nexmark_flink_job.py EVENTS_DIR QUERIES PARALLELISM CHECK_DIR

Streaming mode, a local mini-cluster of ``PARALLELISM`` slots, the events read by the
``filesystem`` connector from the CSV files of ``EVENTS_DIR`` (bounded: at the end of the input
every window is flushed), the event time ``dateTime`` with the nexmark project's watermark of
4 s. For each query of the comma-separated ``QUERIES``, two runs of its SQL (the nexmark
project's text, in ``SQL``), one job after the other in the same JVM:

1. **timed**: ``INSERT INTO`` a ``blackhole`` sink, as the nexmark project measures Flink; the
   seconds from submitting the job to its end, and the peak RSS of the JVM meanwhile;
2. **check**: the same SELECT into a ``filesystem`` sink (CSV files; debezium-json for q4's
   updating result, its changelog applied here), gathered into ``CHECK_DIR/<query>.csv`` for
   the comparison with the other systems (``check``).

Prints one JSON line per query: ``{"query", "seconds", "startup_s", "peak_rss_mb", "rows",
"check_s"}`` (``startup_s``: the JVM and table environment, once for all queries).
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import time
from collections import Counter

COLUMNS = [  # the event files' columns (generator.FILE_SCHEMA), times as epoch ms
    ("event_type", "TINYINT"), ("date_time", "BIGINT"),
    ("p_id", "BIGINT"), ("p_name", "STRING"), ("p_email", "STRING"),
    ("p_credit_card", "STRING"), ("p_city", "STRING"), ("p_state", "STRING"),
    ("p_extra", "STRING"),
    ("a_id", "BIGINT"), ("a_item_name", "STRING"), ("a_description", "STRING"),
    ("a_initial_bid", "BIGINT"), ("a_reserve", "BIGINT"), ("a_expires", "BIGINT"),
    ("a_seller", "BIGINT"), ("a_category", "BIGINT"), ("a_extra", "STRING"),
    ("b_auction", "BIGINT"), ("b_bidder", "BIGINT"), ("b_price", "BIGINT"),
    ("b_channel", "STRING"), ("b_url", "STRING"), ("b_extra", "STRING"),
]

VIEWS = [
    """CREATE TEMPORARY VIEW person AS SELECT p_id AS id, p_name AS name,
        p_email AS emailAddress, p_credit_card AS creditCard, p_city AS city, p_state AS state,
        dateTime, p_extra AS extra{more} FROM events WHERE event_type = 0""",
    """CREATE TEMPORARY VIEW auction AS SELECT a_id AS id, a_item_name AS itemName,
        a_description AS description, a_initial_bid AS initialBid, a_reserve AS reserve,
        dateTime, CAST(TO_TIMESTAMP_LTZ(a_expires, 3) AS TIMESTAMP(3)) AS expires,
        a_seller AS seller, a_category AS category, a_extra AS extra{more}
        FROM events WHERE event_type = 1""",
    """CREATE TEMPORARY VIEW bid AS SELECT b_auction AS auction, b_bidder AS bidder,
        b_price AS price, b_channel AS channel, b_url AS url, dateTime, b_extra AS extra{more}
        FROM events WHERE event_type = 2""",
]

# The nexmark project's queries (nexmark-flink/src/main/resources/queries), the SELECT of each
# INSERT; q5 and q7 also return the window (starttime, window_end) so that a bounded run's
# flushed last windows can be told apart when the results are compared.
SQL = {
    "q0": "SELECT auction, bidder, price, dateTime, extra FROM bid",
    "q1": "SELECT auction, bidder, CAST(0.908 * price AS DECIMAL(23, 3)) AS price, dateTime, "
          "extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0",
    "q3": """SELECT P.name, P.city, P.state, A.id FROM auction AS A
             INNER JOIN person AS P on A.seller = P.id
             WHERE A.category = 10 and (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
    "q4": """SELECT Q.category, AVG(Q.final) FROM (
                SELECT MAX(B.price) AS final, A.category FROM auction A, bid B
                WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
                GROUP BY A.id, A.category) Q
             GROUP BY Q.category""",
    "q5": """SELECT AuctionBids.auction, AuctionBids.num, AuctionBids.starttime FROM (
               SELECT auction, count(*) AS num, window_start AS starttime,
                      window_end AS endtime
               FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND,
                              INTERVAL '10' SECOND))
               GROUP BY auction, window_start, window_end) AS AuctionBids
             JOIN (
               SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
               FROM (SELECT count(*) AS num, window_start AS starttime, window_end AS endtime
                     FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND,
                                    INTERVAL '10' SECOND))
                     GROUP BY auction, window_start, window_end) AS CountBids
               GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids
             ON AuctionBids.starttime = MaxBids.starttime AND
                AuctionBids.endtime = MaxBids.endtime AND AuctionBids.num >= MaxBids.maxn""",
    "q7": """SELECT B.auction, B.bidder, B.price, B.dateTime, B.extra, B1.dateTime AS window_end
             FROM bid B JOIN (
               SELECT MAX(price) AS maxprice, window_end AS dateTime
               FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
               GROUP BY window_start, window_end) B1
             ON B.price = B1.maxprice
             WHERE B.dateTime BETWEEN B1.dateTime - INTERVAL '10' SECOND AND B1.dateTime""",
    "q8": """SELECT P.id, P.name, P.starttime FROM (
               SELECT id, name, window_start AS starttime, window_end AS endtime
               FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
               GROUP BY id, name, window_start, window_end) P
             JOIN (
               SELECT seller, window_start AS starttime, window_end AS endtime
               FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
               GROUP BY seller, window_start, window_end) A
             ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime""",
}


# The latency run's queries: the same, each result row also carrying ``arrival``, the newest
# arrival among the events it was made from (a join: the later side; an aggregate: MAX). The
# windowed queries (q5, q7, q8) run as they are: their rows are timed from the file whose
# events closed their window (``benchmarks.nexmark_flink_latency``).
_BIDS_ARRIVAL = "SELECT auction, bidder, {price}, dateTime, extra, arrival FROM bid"
LATENCY_SQL = {
    "q0": _BIDS_ARRIVAL.format(price="price"),
    "q1": _BIDS_ARRIVAL.format(price="CAST(0.908 * price AS DECIMAL(23, 3)) AS price"),
    "q2": "SELECT auction, price, arrival FROM bid WHERE MOD(auction, 123) = 0",
    "q3": """SELECT P.name, P.city, P.state, A.id, GREATEST(A.arrival, P.arrival) AS arrival
             FROM auction AS A INNER JOIN person AS P on A.seller = P.id
             WHERE A.category = 10 and (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
    "q4": """SELECT Q.category, AVG(Q.final), MAX(Q.arrival) AS arrival FROM (
                SELECT MAX(B.price) AS final, A.category,
                       MAX(GREATEST(A.arrival, B.arrival)) AS arrival
                FROM auction A, bid B
                WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
                GROUP BY A.id, A.category) Q
             GROUP BY Q.category""",
}


def quoted(sql: str) -> str:
    """``dateTime`` is a keyword of Flink's SQL parser: quote it (the nexmark text did not
    need to with the Flink it was written for)."""
    return re.sub(r"\bdateTime\b", "`dateTime`", sql)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _jvm_hwm(reset: bool) -> float:
    """Reset (``reset``) or read the peak RSS in MB of this process's children (the JVM)."""
    total = 0.0
    for child in _children(os.getpid()):
        try:
            if reset:
                with open(f"/proc/{child}/clear_refs", "w", encoding="ascii") as f:
                    f.write("5")
                continue
            with open(f"/proc/{child}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


def environment(parallelism: int):  # type: ignore[no-untyped-def]
    from pyflink.table import EnvironmentSettings, TableEnvironment
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    conf.set("parallelism.default", str(parallelism))
    conf.set("table.local-time-zone", "UTC")
    conf.set("pipeline.name", "nexmark")
    return env


def declare(env, events_dir: str, live: bool = False) -> None:  # type: ignore[no-untyped-def]
    """The ``events`` table and the nexmark views over it. ``live``: the latency run's source,
    which watches ``events_dir`` for new files (unbounded) and whose rows have one more
    column, ``arrival`` (epoch ms when their file was dropped in), kept by the views."""
    extra = [("arrival", "BIGINT")] if live else []
    cols = ",\n  ".join(f"`{name}` {kind}" for name, kind in COLUMNS + extra)
    watch = ", 'source.monitor-interval' = '100 ms'" if live else ""
    env.execute_sql(f"""CREATE TEMPORARY TABLE events (
  {cols},
  `dateTime` AS CAST(TO_TIMESTAMP_LTZ(`date_time`, 3) AS TIMESTAMP(3)),
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{events_dir}', 'format' = 'csv',
        'csv.null-literal' = ''{watch})""")
    for view in VIEWS:
        env.execute_sql(quoted(view.format(more=", arrival" if live else "")))


def _text(value: object) -> str:
    if value is None:
        return ""
    if hasattr(value, "isoformat"):
        return value.isoformat(sep=" ")  # type: ignore[attr-defined]
    return str(value)


CHANGELOG = {"q4"}  # queries whose result is an updating table (the others only append)


def run_query(env, query: str, check_dir: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The timed run into the blackhole, then the check run into files of ``check_dir``."""
    select = env.sql_query(quoted(SQL[query]))
    names = select.get_schema().get_field_names()
    kinds = [str(t) for t in select.get_schema().get_field_data_types()]
    cols = ", ".join(f"`{n}` {k.replace(' NOT NULL', '')}" for n, k in zip(names, kinds))
    sink = f"sink_{query}"
    env.execute_sql(f"CREATE TEMPORARY TABLE {sink} ({cols}) WITH ('connector' = 'blackhole')")
    _jvm_hwm(reset=True)
    started = time.perf_counter()
    select.execute_insert(sink).wait()
    seconds = time.perf_counter() - started
    peak = _jvm_hwm(reset=False)
    began = time.perf_counter()
    rows = check(env, query, names, kinds, check_dir)
    return {"query": query, "seconds": seconds, "peak_rss_mb": round(peak, 1), "rows": rows,
            "check_s": round(time.perf_counter() - began, 1)}


def check(env, query: str, names: list[str], kinds: list[str], check_dir: str) -> int:  # type: ignore[no-untyped-def]
    """The check run: the same SELECT into a ``filesystem`` sink (CSV; debezium-json for an
    updating result, whose changelog is applied here: ``-U``/``-D`` retract a row), then
    ``CHECK_DIR/<query>.csv`` written from its files; returns the result's rows.

    Collecting through PyFlink (``execute().collect()``) took minutes for the 276,000 rows
    of q0 at 300,000 events: every row crosses from the JVM one by one. The files take
    seconds. In streaming mode the sink finishes its files when the bounded input ends.

    DECIMAL columns go through the files as text: Flink's CSV format writes a DECIMAL(23, 3)
    rounded to an integer and in scientific notation (q1's 49490.540 as 49491, 1019.684 as
    1.02E+3); ``CAST(... AS STRING)`` keeps every digit."""
    folder = os.path.join(check_dir, f"{query}-files")
    text = [k.startswith("DECIMAL") for k in kinds]
    cols = ", ".join(f"`{n}` {'STRING' if t else k.replace(' NOT NULL', '')}"
                     for n, k, t in zip(names, kinds, text))
    select = ", ".join(f"CAST(`{n}` AS STRING) AS `{n}`" if t else f"`{n}`"
                       for n, t in zip(names, text))
    updating = query in CHANGELOG
    fmt = ("'format' = 'debezium-json'" if updating
           else "'format' = 'csv', 'csv.null-literal' = ''")
    env.execute_sql(f"CREATE TEMPORARY TABLE check_{query} ({cols}) WITH ("
                    f"'connector' = 'filesystem', 'path' = '{folder}', {fmt})")
    env.sql_query(f"SELECT {select} FROM ({quoted(SQL[query])}) AS Q").execute_insert(
        f"check_{query}").wait()
    parts = sorted(os.path.join(root, name) for root, _, files in os.walk(folder)
                   for name in files if not name.startswith("."))
    out_path = os.path.join(check_dir, f"{query}.csv")
    if not updating:
        count = 0
        with open(out_path, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    data = f.read()
                count += data.count(b"\n")
                out.write(data)
        return count
    rows: Counter[tuple[str, ...]] = Counter()
    for part in parts:
        with open(part, encoding="utf-8") as f:
            for line in f:
                change = json.loads(line)
                for side, sign in (("before", -1), ("after", 1)):
                    if change.get(side) is not None:
                        rows[tuple(_text(change[side][n]) for n in names)] += sign
    with open(out_path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        for key, count in rows.items():
            for _ in range(count):
                out.writerow(key)
    return sum(rows.values())


def latency_run(parallelism: int, query: str, live_dir: str) -> None:  # type: ignore[no-untyped-def]
    """The latency run of ``query``: an unbounded job over a watched folder, each result row
    stamped with ``emitted`` (``CURRENT_ROW_TIMESTAMP()``, evaluated as the row reaches the
    sink) into CSV files (debezium-json for q4). Prints ``{"ready": query, "inbox": ...}``;
    the parent drops the event files into the inbox, then writes a line to this process's
    stdin; the job is then stopped with a savepoint (no drain: windows still open stay
    unfired), which commits the sink's files, and ``{"latency": query, "files": ...,
    "columns": [...]}`` is printed."""
    base = os.path.join(live_dir, query)
    inbox, out = os.path.join(base, "inbox"), os.path.join(base, "out")
    os.makedirs(inbox, exist_ok=True)
    env = environment(parallelism)
    # a reader waiting for the next file must not hold the watermark back (the files come
    # one by one, in event-time order, so a reader that resumes is never behind it)
    env.get_config().set("table.exec.source.idle-timeout", "500 ms")
    # the savepoint that stops it holds the join states: in files, not in the JobManager
    env.get_config().set("execution.checkpointing.storage", "filesystem")
    env.get_config().set("execution.checkpointing.dir", "file://" + os.path.join(base, "cp"))
    declare(env, inbox, live=True)
    stamped = ("SELECT Q.*, DATE_FORMAT(CAST(CURRENT_ROW_TIMESTAMP() AS TIMESTAMP(3)), "
               f"'yyyy-MM-dd HH:mm:ss.SSS') AS emitted FROM ({LATENCY_SQL.get(query, SQL[query])}"
               ") AS Q")
    select = env.sql_query(quoted(stamped))
    names = list(select.get_schema().get_field_names())
    kinds = [str(t) for t in select.get_schema().get_field_data_types()]
    cols = ", ".join(f"`{n}` {k.replace(' NOT NULL', '')}" for n, k in zip(names, kinds))
    fmt = ("'format' = 'debezium-json'" if query in CHANGELOG
           else "'format' = 'csv', 'csv.null-literal' = ''")
    env.execute_sql(f"CREATE TEMPORARY TABLE live_{query} ({cols}) WITH ("
                    f"'connector' = 'filesystem', 'path' = '{out}', {fmt})")
    job = select.execute_insert(f"live_{query}").get_job_client()
    print(json.dumps({"ready": query, "inbox": inbox}), flush=True)
    sys.stdin.readline()
    # PyFlink 2.3's ``stop_with_savepoint`` calls a Java signature that no longer exists
    # (it lacks the format type): the Java client is called with it directly
    from pyflink.java_gateway import get_gateway
    canonical = get_gateway().jvm.org.apache.flink.core.execution.SavepointFormatType.CANONICAL
    job._j_job_client.stopWithSavepoint(False, "file://" + os.path.join(base, "savepoint"),
                                        canonical).get()
    job.get_job_execution_result().result()  # ended: the sink's files are committed
    print(json.dumps({"latency": query, "files": out, "columns": names}), flush=True)


def main(argv: list[str]) -> None:
    events_dir, queries, parallelism, check_dir = argv[0], argv[1], int(argv[2]), argv[3]
    live_dir = argv[4] if len(argv) > 4 else None
    began = time.perf_counter()
    env = environment(parallelism)
    declare(env, events_dir)
    startup = time.perf_counter() - began
    for query in queries.split(","):
        record = run_query(env, query, check_dir)
        print(json.dumps(record | {"startup_s": startup}), flush=True)
        if live_dir is not None:
            latency_run(parallelism, query, live_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
