"""The issue's scenario: stream Batch1-3, corrupt Batch2 in PostgreSQL by hand, backfill Batch2
with Spark while Batch3 streams, and the warehouse equals a clean run; a reader polling the
interval never sees it half old, half new; backfilling the batch the stream is still writing is
refused; backfilling again bumps the version and changes no row.

The clean run is the same streaming pipeline into another schema, untouched (the streaming and
Spark warehouses are identical: tests/workloads/tpcdi/test_tpcdi_pipelines.py). The dimensions are
built once by Spark and copied, stage by stage, so both schemas look trades up in the same rows."""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path

import psycopg
import pytest

from sstore.workloads.tpcdi import dimensions
from sstore.workloads.tpcdi.backfill import (
    IntervalNotSealed,
    IntervalOverlap,
    backfill_batch,
    backfill_batches,
    backfill_dates,
    versions,
)
from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.sources import read_trade_incremental
from sstore.workloads.tpcdi.streaming.events import batch1_events
from sstore.workloads.tpcdi.streaming.pipeline import StreamingDimTrade
from sstore.workloads.tpcdi.warehouse import create_warehouse

DIMENSION_TABLES = ("dimdate", "dimtime", "statustype", "tradetype", "industry", "taxrate",
                    "dimbroker", "dimcompany", "dimsecurity", "dimcustomer", "dimaccount")
CORRUPTED, LOST = 4, 2  # of Batch2's 9 trades (SF 0.01 incremental batches are small)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tpcdi")
    generate(0.01, out, seed=11)
    return out


def copy_dimensions(url: str, source: str, target: str) -> None:
    with psycopg.connect(url) as con:
        for t in DIMENSION_TABLES:
            con.execute(f'TRUNCATE "{target}".{t}')
            con.execute(f'INSERT INTO "{target}".{t} SELECT * FROM "{source}".{t}')


def rows(url: str, schema: str) -> dict[str, list[tuple]]:
    with psycopg.connect(url) as con:
        return {"dimtrade": con.execute(f"SELECT * FROM {schema}.dimtrade ORDER BY tradeid"
                                        ).fetchall(),
                "dimessages": sorted(con.execute(f"SELECT * FROM {schema}.dimessages"
                                                 ).fetchall())}


def corrupt_batch2(url: str, data: Path) -> tuple[list[int], list[int]]:
    """By hand: wrong values in some Batch2 rows, some Batch2 rows and alerts deleted, a bogus
    alert added; only trades that Batch3 does not touch (their rows stay in the interval)."""
    batch3 = set(read_trade_incremental(data / "Batch3" / "Trade.txt").table["t_id"]
                 .to_pylist())
    with psycopg.connect(url) as con:
        ids = [r[0] for r in con.execute("SELECT tradeid FROM dw.dimtrade WHERE batchid = 2 "
                                         "ORDER BY tradeid").fetchall() if r[0] not in batch3]
        corrupted, lost = ids[:CORRUPTED], ids[CORRUPTED:CORRUPTED + LOST]
        assert len(lost) == LOST
        con.execute("UPDATE dw.dimtrade SET executedby = 'CORRUPT', quantity = quantity + 1 "
                    "WHERE tradeid = ANY(%s)", (corrupted,))
        con.execute("DELETE FROM dw.dimtrade WHERE tradeid = ANY(%s)", (lost,))
        gone = con.execute("DELETE FROM dw.dimessages WHERE ctid IN (SELECT ctid FROM "
                           "dw.dimessages WHERE messagesource = 'DimTrade' AND batchid = 2 "
                           "LIMIT 1)").rowcount
        assert gone == 1, "Batch2 has no alert to lose"
        con.execute("INSERT INTO dw.dimessages VALUES (now(), 2, 'DimTrade', 'bogus', "
                    "'Alert', 'T_ID = 0')")
    return corrupted, lost


def new_account_version(url: str) -> None:
    """A version of a Batch2 trade's account made by a later batch (as Batch3's changes would
    make it: the old version closed, a new current one with another surrogate key)."""
    with psycopg.connect(url) as con:
        row = con.execute("SELECT a.accountid FROM dw.dimtrade t JOIN dw.dimaccount a ON "
                          "a.sk_accountid = t.sk_accountid WHERE t.batchid = 2 AND "
                          "t.sk_createdateid >= 20170708 AND a.iscurrent LIMIT 1").fetchone()
        assert row is not None, "no trade created in Batch2"
        con.execute("UPDATE dw.dimaccount SET iscurrent = false, enddate = DATE '2017-07-10' "
                    "WHERE accountid = %s AND iscurrent", row)
        con.execute("INSERT INTO dw.dimaccount SELECT (SELECT max(sk_accountid) + 1 FROM "
                    "dw.dimaccount), accountid, sk_brokerid, sk_customerid, status, accountdesc, "
                    "taxstatus, true, 4, DATE '2017-07-10', DATE '9999-12-31' FROM dw.dimaccount "
                    "WHERE accountid = %s AND enddate = DATE '2017-07-10'", row)


class Reader(threading.Thread):
    """Polls interval "batch 2": each look is one statement (one snapshot) of its versions and
    of how much of the corruption it still shows."""

    def __init__(self, url: str, corrupted: list[int], lost: list[int]) -> None:
        super().__init__(daemon=True)
        self.url, self.corrupted, self.lost = url, corrupted, lost
        self.seen: set[tuple] = set()
        self.looks = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as con:
                while not self.stop.is_set():
                    self.seen.add(con.execute(
                        "SELECT (SELECT version FROM sstore.intervals WHERE target = "
                        "'dw.dimtrade' AND interval = 'batch 2'), (SELECT version FROM "
                        "sstore.intervals WHERE target = 'dw.dimessages' AND interval = "
                        "'batch 2'), (SELECT count(*) FROM dw.dimtrade WHERE batchid = 2 AND "
                        "tradeid = ANY(%s) AND executedby = 'CORRUPT'), (SELECT count(*) FROM "
                        "dw.dimtrade WHERE tradeid = ANY(%s)), (SELECT count(*) FROM "
                        "dw.dimessages WHERE messagetext = 'bogus')",
                        (self.corrupted, self.lost)).fetchone())
                    self.looks += 1
                    time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_backfill_of_batch2_while_batch3_streams_equals_a_clean_run(
        spark, data: Path, pg_url: str, tmp_path: Path) -> None:
    url = pg_url
    for schema in ("dw", "clean"):
        create_warehouse(url, schema)
    main = StreamingDimTrade(data, url, str(tmp_path / "dw.duckdb"), "dw", batch_size=40)
    clean = StreamingDimTrade(data, url, str(tmp_path / "clean.duckdb"), "clean",
                              batch_size=40)
    try:
        dimensions.build_historical(spark, data, url, "dw")
        copy_dimensions(url, "dw", "clean")
        for run in (main, clean):
            run.refresh_lookups()
            with run.attached():
                run.stream(batch1_events(data), "historical (Batch1)")
        main.run_incremental(2, spark)
        copy_dimensions(url, "dw", "clean")
        clean.run_incremental(2, spark)
        dimensions.apply_batch(spark, data, url, "dw", 3)  # before Batch3's trades stream
        copy_dimensions(url, "dw", "clean")
        clean.run_incremental(3, spark)
        expected = rows(url, "clean")

        corrupted, lost = corrupt_batch2(url, data)
        assert rows(url, "dw") != rows(url, "clean")
        reader = Reader(url, corrupted, lost)
        reader.start()

        # Batch3 streams in a thread; halfway it waits until the backfill has staged its
        # rows, then goes on while the swap transaction runs
        halfway, go = threading.Event(), threading.Event()
        streamed: list[BaseException | None] = []

        def pause(phase: str, done: int, total: int) -> None:
            if phase == "incremental (Batch3)" and done >= total // 2 and not halfway.is_set():
                halfway.set()
                assert go.wait(120), "the backfill never reached its swap"

        def stream_batch3() -> None:
            try:
                main.run_incremental(3, spark)
                streamed.append(None)
            except BaseException as exc:  # noqa: BLE001 - checked below
                streamed.append(exc)

        main.progress = pause
        main.batch_size = 2  # Batch3's 14 events in 7 engine batches, each its own delivery
        streaming = threading.Thread(target=stream_batch3, daemon=True)
        streaming.start()
        try:
            assert halfway.wait(120)
            with pytest.raises(IntervalNotSealed, match=r"Batch3 of dw.dimtrade: the stream "
                               r"has not finished loading it \(the stream has delivered up to "
                               r"event line \d+ of Batch[23]\)"):
                backfill_batch(spark, data, url, "dw", 3)
            report = backfill_batch(spark, data, url, "dw", 2, before_swap=go.set,
                                    before_commit=lambda _con: time.sleep(0.5))
        finally:
            go.set()
            streaming.join(120)
        assert streamed == [None]
        reader.stop.set()
        reader.join(10)
        assert reader.error is None

        assert rows(url, "dw") == expected
        old, new = (1, 1, CORRUPTED, 0, 1), (2, 2, 0, LOST, 0)
        assert reader.seen == {old, new}, f"a mixed interval was seen: {reader.seen - {old, new}}"
        assert report.version == 2
        trade, alerts = report.replaced
        assert trade.rows_inserted >= trade.rows_deleted + LOST
        assert alerts.rows_deleted == alerts.rows_inserted  # one lost, one bogus
        got = {(v["target"], v["interval"]): (v["version"], v["source"])
               for v in versions(url, "dw")}
        assert got == {("dw.dimtrade", "batch 1"): (1, "stream"),
                       ("dw.dimessages", "batch 1"): (1, "stream"),
                       ("dw.dimtrade", "batch 2"): (2, "backfill"),
                       ("dw.dimessages", "batch 2"): (2, "backfill"),
                       ("dw.dimtrade", "batch 3"): (1, "stream"),
                       ("dw.dimessages", "batch 3"): (1, "stream")}

        # again, now that Batch3 is all in and a later batch has made a new version of an
        # account a Batch2 trade was created with: the same rows (the rebuild looks Batch2's
        # trades up in the dimensions as of Batch2), a new version; the Batch2 trades that
        # Batch3 updated keep their Batch3 rows
        new_account_version(url)
        again = backfill_batch(spark, data, url, "dw", 2)
        assert again.version == 3
        assert rows(url, "dw") == expected
        batch2 = read_trade_incremental(data / "Batch2" / "Trade.txt").table["t_id"]
        with psycopg.connect(url) as con:
            newer = con.execute("SELECT count(*) FROM dw.dimtrade WHERE batchid = 3 AND "
                                "tradeid = ANY(%s)", (batch2.to_pylist(),)).fetchone()[0]
        trade = again.replaced[0]
        assert trade.rows_kept_newer == newer > 0
        assert trade.rows_deleted == trade.rows_inserted == trade.rows_after
    finally:
        main.close()
        clean.close()


@pytest.mark.timeout(900)  # two streamed warehouses and three Spark replays: ~7 min loaded
def test_a_batch_range_and_a_date_range_backfilled_equal_a_clean_run(
        spark, data: Path, pg_url: str, tmp_path: Path) -> None:
    """A batch-id range and a date range, each corrupted by hand, backfilled in one
    transaction each: the warehouse equals the clean run again. The date range spans
    Batch1 and Batch2 trades, some updated by a later batch: their rows need their whole
    history. An overlapping date range with other bounds is refused, nothing changed."""
    url = pg_url
    for schema in ("dw", "clean"):
        create_warehouse(url, schema)
    main = StreamingDimTrade(data, url, str(tmp_path / "dw.duckdb"), "dw", batch_size=40)
    clean = StreamingDimTrade(data, url, str(tmp_path / "clean.duckdb"), "clean",
                              batch_size=40)
    try:
        dimensions.build_historical(spark, data, url, "dw")
        copy_dimensions(url, "dw", "clean")
        for run in (main, clean):
            run.refresh_lookups()
            with run.attached():
                run.stream(batch1_events(data), "historical (Batch1)")
        for batch in (2, 3):
            main.run_incremental(batch, spark)
            copy_dimensions(url, "dw", "clean")
            clean.run_incremental(batch, spark)
    finally:
        main.close()
        clean.close()
    expected = rows(url, "clean")
    assert rows(url, "dw") == expected
    t0 = time.perf_counter()
    # batches 2-3: rows of both batches wrong, an alert of Batch3 lost
    with psycopg.connect(url) as con:
        con.execute("UPDATE dw.dimtrade SET executedby = 'CORRUPT' WHERE batchid IN (2, 3)")
        assert con.execute("DELETE FROM dw.dimessages WHERE ctid IN (SELECT ctid FROM "
                           "dw.dimessages WHERE messagesource = 'DimTrade' AND batchid = 3 "
                           "LIMIT 1)").rowcount == 1
    ranged = backfill_batches(spark, data, url, "dw", 2, 3)
    assert ranged.to_dict()["versions"] == {"batch 2": 2, "batch 3": 2}
    assert rows(url, "dw") == expected

    # dates: the two days before the last day any trade was created on (Batch1's last and
    # Batch2's): rows there were made by Batch1 and Batch2, and some were updated by Batch3
    # after the range: their rows need events before, in and after it
    with psycopg.connect(url) as con:
        days = [r[0] for r in con.execute(
            "SELECT DISTINCT sk_createdateid FROM dw.dimtrade ORDER BY 1 DESC LIMIT 3")]
        low, high = days[2], days[1]
        made_by = {r[0] for r in con.execute("SELECT DISTINCT batchid FROM dw.dimtrade WHERE "
                                             "sk_createdateid BETWEEN %s AND %s", (low, high))}
        assert 3 in made_by and len(made_by) > 1, made_by  # updated after the range
        con.execute("UPDATE dw.dimtrade SET executedby = 'CORRUPT', status = 'X' WHERE "
                    "sk_createdateid BETWEEN %s AND %s", (low, high))
        con.execute("DELETE FROM dw.dimtrade WHERE tradeid = (SELECT max(tradeid) FROM "
                    "dw.dimtrade WHERE sk_createdateid BETWEEN %s AND %s)", (low, high))
        con.execute("INSERT INTO dw.dimessages VALUES (%s, 2, 'DimTrade', 'bogus', 'Alert', "
                    "'T_ID = 0')", (dt.datetime.strptime(str(high), "%Y%m%d"),))
        outside = con.execute("SELECT count(*) FROM dw.dimtrade WHERE sk_createdateid < %s",
                              (low,)).fetchone()[0]
    first = dt.datetime.strptime(str(low), "%Y%m%d").date()
    last = dt.datetime.strptime(str(high), "%Y%m%d").date()
    dated = backfill_dates(spark, data, url, "dw", first, last)
    assert rows(url, "dw") == expected
    name = f"dates {first}..{last}"
    assert dated.to_dict()["versions"] == {name: 1}
    trade = dated.replaced[0]
    assert trade.rows_after == trade.rows_inserted == trade.rows_deleted + 1
    with psycopg.connect(url) as con:
        assert con.execute("SELECT count(*) FROM dw.dimtrade WHERE sk_createdateid < %s",
                           (low,)).fetchone()[0] == outside  # the rows before it untouched

    # the same days, other bounds: refused before any Spark work, naming the recorded one
    with pytest.raises(IntervalOverlap, match=rf"overlaps interval '{name}'"):
        backfill_dates(spark, data, url, "dw", first - dt.timedelta(days=1), first)
    assert rows(url, "dw") == expected
    assert {v["interval"] for v in versions(url, "dw")} == {
        "batch 1", "batch 2", "batch 3", name}
    print(f"range and date backfills: {time.perf_counter() - t0:.1f} s")
