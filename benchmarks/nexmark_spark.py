"""Spark Structured Streaming's side of ``benchmarks.nexmark``: the same SQL, a file source, a
noop sink, closed loop.

- **Input**: the event files (``generator.write_files``, CSV), each dropped into a watched
  directory (written beside it, renamed in) and read with ``maxFilesPerTrigger=1``: one file,
  one micro-batch. ``dateTime`` is ``timestamp_millis(date_time)`` with a watermark of 0 s (the
  events are in event-time order; Spark emits a window once the watermark passes its end).
- **Timed run**: the query's SQL (the nexmark text in Spark's dialect: ``window(...)`` in the
  GROUP BY for the window TVFs) written to the ``noop`` sink (append mode; update mode where
  the query aggregates without a window). The next file is dropped once Spark's progress says
  the last one was read (``lastProgress``, polled every 2 ms: a Python
  ``StreamingQueryListener`` was not called back reliably); latency is from dropping a file to
  that progress report, i.e. the micro-batch that read it committed.
- **Check run**: the same query over all files at once into the ``memory`` sink, then
  collected as Arrow for the comparison. A query Spark refuses (an ``AnalysisException`` when
  it starts, or an ``UNSUPPORTED_...`` error that stops it at its first micro-batch: Spark
  does not run every streaming plan, e.g. an aggregation over an aggregation without windows)
  is reported as such, with Spark's message.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pyarrow as pa

from sstore.base.files import write_atomically

SCHEMA = ("event_type TINYINT, date_time BIGINT, p_id BIGINT, p_name STRING, p_email STRING, "
          "p_credit_card STRING, p_city STRING, p_state STRING, p_extra STRING, a_id BIGINT, "
          "a_item_name STRING, a_description STRING, a_initial_bid BIGINT, a_reserve BIGINT, "
          "a_expires BIGINT, a_seller BIGINT, a_category BIGINT, a_extra STRING, "
          "b_auction BIGINT, b_bidder BIGINT, b_price BIGINT, b_channel STRING, "
          "b_url STRING, b_extra STRING")

VIEWS = {
    "person": "SELECT p_id AS id, p_name AS name, p_email AS emailAddress, p_credit_card AS "
              "creditCard, p_city AS city, p_state AS state, dateTime, p_extra AS extra "
              "FROM events WHERE event_type = 0",
    "auction": "SELECT a_id AS id, a_item_name AS itemName, a_description AS description, "
               "a_initial_bid AS initialBid, a_reserve AS reserve, dateTime, "
               "timestamp_millis(a_expires) AS expires, a_seller AS seller, "
               "a_category AS category, a_extra AS extra FROM events WHERE event_type = 1",
    "bid": "SELECT b_auction AS auction, b_bidder AS bidder, b_price AS price, b_channel AS "
           "channel, b_url AS url, dateTime, b_extra AS extra FROM events WHERE event_type = 2",
}

_AUCTION_BIDS = ("SELECT auction, count(*) AS num, window.start AS starttime, window.end AS "
                 "endtime FROM bid GROUP BY auction, window(dateTime, '10 seconds', "
                 "'2 seconds')")
SQL = {
    "q0": "SELECT auction, bidder, price, dateTime AS date_time, extra FROM bid",
    "q1": "SELECT auction, bidder, CAST(0.908 * price AS DECIMAL(23, 3)) AS price, "
          "dateTime AS date_time, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    "q3": """SELECT P.name, P.city, P.state, A.id FROM auction AS A
             JOIN person AS P ON A.seller = P.id
             WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
    "q4": """SELECT Q.category, CAST(sum(Q.final) DIV count(*) AS BIGINT) AS final FROM (
                SELECT max(B.price) AS final, A.category FROM auction AS A, bid AS B
                WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
                GROUP BY A.id, A.category) AS Q GROUP BY Q.category""",
    "q5": f"""SELECT A.auction, A.num, A.starttime FROM ({_AUCTION_BIDS}) AS A JOIN (
                SELECT max(num) AS maxn, starttime, endtime FROM ({_AUCTION_BIDS})
                GROUP BY starttime, endtime) AS M
              ON A.starttime = M.starttime AND A.endtime = M.endtime AND A.num >= M.maxn""",
    "q7": """SELECT B.auction, B.bidder, B.price, B.dateTime AS date_time, B.extra,
                    B1.dateTime AS window_end
             FROM bid AS B JOIN (
                SELECT max(price) AS maxprice, window.end AS dateTime FROM bid
                GROUP BY window(dateTime, '10 seconds')) AS B1
             ON B.price = B1.maxprice
             AND B.dateTime BETWEEN B1.dateTime - INTERVAL 10 SECONDS AND B1.dateTime""",
    "q8": """SELECT P.id, P.name, P.starttime FROM (
                SELECT id, name, window.start AS starttime, window.end AS endtime FROM person
                GROUP BY id, name, window(dateTime, '10 seconds')) AS P
             JOIN (
                SELECT seller, window.start AS starttime, window.end AS endtime FROM auction
                GROUP BY seller, window(dateTime, '10 seconds')) AS A
             ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime""",
}
UPDATING = {"q4"}  # aggregates without windows: update mode (append is refused)
WAIT_SECONDS = 180.0


def _wait_for_file(query: Any, index: int) -> float:
    """When the query had read file ``index`` (0-based: the file source's log offset), polled
    every 2 ms (perf_counter)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        progress = query.lastProgress
        if progress and progress["sources"]:
            end = progress["sources"][0].get("endOffset") or "{}"
            end = json.loads(end) if isinstance(end, str) else end
            # a progress report may carry no offset yet ("null"): poll on
            if isinstance(end, dict) and int(end.get("logOffset", -1)) >= index:
                return time.perf_counter()
        if not query.isActive:
            raise RuntimeError(f"the Spark query stopped: {query.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no progress to file {index} in {WAIT_SECONDS:.0f} s: "
                               f"{query.status}")
        time.sleep(0.002)


class SparkNexmark:
    """The run's SparkSession and progress listener; ``run`` measures one query."""

    def __init__(self, master: str = "local[2]") -> None:
        from migrators.spark_session import get_spark
        self.spark = get_spark(master)
        self.version = self.spark.version

    def _stream(self, inbox: str, max_files: int) -> None:
        from pyspark.sql import functions as F
        events = (self.spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", max_files)
                  .csv(inbox).withColumn("dateTime", F.timestamp_millis("date_time"))
                  .withWatermark("dateTime", "0 seconds"))
        events.createOrReplaceTempView("events")
        for name, sql in VIEWS.items():
            self.spark.sql(sql).createOrReplaceTempView(name)

    def run(self, query: str, files: list[str], workdir: str) -> dict[str, Any]:
        """Time ``query`` over ``files`` fed one by one, then collect its result from a check
        run; returns seconds, per-file latencies (ms), the result, or ``unsupported``."""
        from pyspark.errors import AnalysisException
        inbox, staging = os.path.join(workdir, "inbox"), os.path.join(workdir, "staging")
        for d in (inbox, staging):
            os.makedirs(d, exist_ok=True)
        name = f"nexmark_{query}_{os.getpid()}_{int(time.time() * 1000)}"
        self._stream(inbox, 1)
        try:
            frame = self.spark.sql(SQL[query])
            stream = (frame.writeStream.format("noop").queryName(name)
                      .outputMode("update" if query in UPDATING else "append")
                      .option("checkpointLocation", os.path.join(workdir, "checkpoint"))
                      .start())
        except AnalysisException as exc:
            return {"unsupported": str(exc).split("\n")[0][:300]}
        latencies = []
        began = time.perf_counter()
        try:
            for i, path in enumerate(files):
                dropped = time.perf_counter()
                with open(path, "rb") as source:
                    write_atomically(os.path.join(inbox, f"{i:08d}.csv"), source.read(),
                                     staging_dir=staging)
                latencies.append((_wait_for_file(stream, i) - dropped) * 1000)
            seconds = time.perf_counter() - began
        except RuntimeError:
            refused = stream.exception()
            if refused is not None and "UNSUPPORTED" in str(refused):  # found when it ran
                return {"unsupported": str(refused).split("\n")[0][:300]}
            raise
        finally:
            stream.stop()
        return {"seconds": seconds, "latencies_ms": latencies,
                "result": self._check(query, inbox, os.path.join(workdir, "check"))}

    def _check(self, query: str, inbox: str, checkpoint: str) -> pa.Table:
        self._stream(inbox, 1_000_000)
        name = f"check_{query}_{int(time.time() * 1000)}"
        stream = (self.spark.sql(SQL[query]).writeStream.format("memory").queryName(name)
                  .outputMode("update" if query in UPDATING else "append")
                  .option("checkpointLocation", checkpoint).start())
        try:
            stream.processAllAvailable()
        finally:
            stream.stop()
        return self.spark.sql(f"SELECT * FROM {name}").toArrow()

    def close(self) -> None:
        from migrators.spark_session import stop_spark
        stop_spark()
