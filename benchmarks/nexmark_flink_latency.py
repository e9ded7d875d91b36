"""Flink's latency in ``benchmarks.nexmark``: event files dropped one by one into a folder that
a running (unbounded) Flink job watches, and each result row timed at Flink's sink.

The timed Flink run reads one bounded file, all of it at once: it has no arrival. For the
latency, the job (``nexmark_flink_job.latency_run``) reads a watched folder instead
(``source.monitor-interval`` 100 ms), and this side drops the 10,000-event files into it at a
steady pace (``PACE_S`` apart: an open loop at a rate Flink keeps up with, unlike sstore's and
Spark's closed loops at their full speed), each line carrying its file's ``arrival`` (epoch ms
taken just before the file is written; the write, fsync'd and renamed in by
``write_atomically``, is inside the latency, as it is for Spark). Each result row carries
``emitted``: ``CURRENT_ROW_TIMESTAMP()`` evaluated as the row reaches the sink (Flink's
end: a row handed to the sink, no commit; sstore's figure ends at a durable commit).

A row is owed to one file: for q0-q4 the file of the newest event it was made from (the
``arrival`` the query carries: a join's later side, an aggregate's MAX); for the windowed q5,
q7, q8 the file whose events closed its window (the first with an event at or past the
window's end plus the watermark's 4 s, less the 1 ms by which Flink fires a window). A file's
latency is from its arrival to the last row owed to it (the same span as sstore's "batch in ->
every result it caused committed" and Spark's "file dropped -> its micro-batch done"); files
that caused no row have none.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import time
from typing import Any

from sstore.base.files import write_atomically

PACE_S = 0.5          # one file of 10,000 events every half second: 20,000 events/s, 10,000/core
SETTLE_S = 3.0        # after the last file, before the job is stopped
WATERMARK_MS = 4_000  # the nexmark DDL's watermark delay (nexmark_flink_job.declare)
WINDOW_END = {"q5": ("starttime", 10_000), "q7": ("window_end", 0), "q8": ("starttime", 10_000)}
_EPOCH = datetime.datetime(1970, 1, 1)


def _ms(text: str) -> int:
    """Epoch ms of a timestamp Flink wrote (UTC, ``YYYY-MM-DD HH:MM:SS[.fff]``)."""
    return (datetime.datetime.fromisoformat(text) - _EPOCH) // datetime.timedelta(milliseconds=1)


def last_event_ms(path: str) -> int:
    """The newest event time (epoch ms, the file's second column) of an event file."""
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - 65_536))
        last = f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
    return int(last.split(b",", 2)[1])


def drop(files: list[str], inbox: str, pace_s: float = PACE_S) -> list[int]:
    """Drop ``files`` into ``inbox`` ``pace_s`` apart, each line with its file's arrival
    appended; return the arrivals (epoch ms)."""
    staging = os.path.join(os.path.dirname(inbox), "staging")
    os.makedirs(staging, exist_ok=True)
    arrivals = []
    start = time.monotonic()
    for i, path in enumerate(files):
        wait = start + i * pace_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        with open(path, "rb") as f:
            lines = f.read().rstrip(b"\n").split(b"\n")
        arrival = int(time.time() * 1000)
        tail = b"," + str(arrival).encode() + b"\n"
        write_atomically(os.path.join(inbox, f"events-{i:08d}.csv"), tail.join(lines) + tail,
                         staging_dir=staging)
        arrivals.append(arrival)
    return arrivals


def _rows(folder: str, updating: bool, columns: list[str]) -> list[dict[str, str]]:
    """The rows the job's sink wrote (for an updating result, every row it emitted): its
    committed files and those it left in progress. The savepoint that stopped the job
    flushed them all (the sources stopped at it), but q4's debezium-json files stay in
    progress after it (the CSV ones are committed): their rows are as complete."""
    parts = sorted(os.path.join(root, name) for root, _, names in os.walk(folder)
                   for name in names if name.startswith(("part-", ".part-")))
    rows: list[dict[str, str]] = []
    for part in parts:
        with open(part, encoding="utf-8", newline="") as f:
            if updating:
                rows += [{k: str(v) for k, v in json.loads(line)["after"].items()}
                         for line in f if json.loads(line).get("after") is not None]
            else:
                rows += [dict(zip(columns, row, strict=True)) for row in csv.reader(f)]
    return rows


def latencies(query: str, rows: list[dict[str, str]], arrivals: list[int],
              last_ms: list[int]) -> list[float]:
    """Per file that caused a row: ms from its arrival to its last row's ``emitted``."""
    done: dict[int, int] = {}
    for row in rows:
        if query in WINDOW_END:
            column, plus = WINDOW_END[query]
            closes = _ms(row[column]) + plus + WATERMARK_MS - 1
            owed = next((i for i, t in enumerate(last_ms) if t >= closes), None)
            if owed is None:
                continue
            arrival = arrivals[owed]
        else:
            arrival = int(row["arrival"])
        done[arrival] = max(done.get(arrival, 0), _ms(row["emitted"]))
    return [float(end - arrival) for arrival, end in sorted(done.items())]


def measure(message: dict[str, Any], files: list[str], send_stop: Any,
            read_message: Any, pace_s: float = PACE_S) -> dict[str, Any]:
    """Drive one latency run: ``message`` is the job's ``ready`` line; drop the files, let
    the job settle, stop it (``send_stop``), read its ``latency`` line (``read_message``)
    and its rows; returns ``latencies_ms`` and ``files`` (how many files caused a row)."""
    query = message["ready"]
    arrivals = drop(files, message["inbox"], pace_s)
    time.sleep(SETTLE_S)
    send_stop()
    done = read_message()
    if done.get("latency") != query:
        raise RuntimeError(f"the Flink latency run of {query} did not stop as expected: {done}")
    rows = _rows(done["files"], query == "q4", done["columns"])
    lat = latencies(query, rows, arrivals, [last_event_ms(f) for f in files])
    return {"latencies_ms": lat, "latency_rows": len(rows)}
