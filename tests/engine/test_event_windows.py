"""Event-time windows: watermark, closes, corrections, late rows, bad times, restarts, group
commit. ``tests/event_window_oracle.py`` is the row-at-a-time model they are checked against;
tests/engine/test_event_windows_crash.py kills the engine under them."""

from __future__ import annotations

import datetime
import random

import pytest

from sstore import Engine
from sstore.base.errors import DeclarationError, SchemaError
from sstore.storage.status import status_of_file
from tests import event_window_oracle as oracle

T0 = datetime.datetime(2026, 11, 25, 8, 0, 0)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def integer_graph(eng: Engine, size: int, slide: int, delay: int, lateness: int, *,
                  via_procedure: bool = False) -> None:
    """s(k, t, v) -> [copy ->] w (event window) -> on_w, and w__late -> on_late."""
    eng.stream("s", {"k": "VARCHAR", "t": "BIGINT", "v": "DOUBLE"})
    source = "s"
    if via_procedure:  # the window is then fed inside a transaction execution
        eng.stream("s2", {"k": "VARCHAR", "t": "BIGINT", "v": "DOUBLE"})
        source = "s2"

        @eng.procedure(input="s", output="s2")
        def copy(tx, batch):
            return tx.sql("SELECT k, t, v FROM batch")

    eng.event_window("w", source, time="t", size=size, slide=slide, key="k", delay=delay,
                     allowed_lateness=lateness, aggregates={"n": "count(*)", "total": "sum(v)"})
    eng.execute("CREATE TABLE IF NOT EXISTS fired_log (batch_id BIGINT, k VARCHAR, ws BIGINT, "
                "we BIGINT, revision INTEGER, n BIGINT, total DOUBLE)")
    eng.execute("CREATE TABLE IF NOT EXISTS late_log (batch_id BIGINT, k VARCHAR, t BIGINT, "
                "v DOUBLE)")

    @eng.procedure(input="w")
    def on_w(tx, batch):
        tx.execute("INSERT INTO fired_log SELECT ?, k, window_start, window_end, revision, n, "
                   "total FROM batch", tx.batch_id)

    @eng.procedure(input="w__late")
    def on_late(tx, batch):
        tx.execute("INSERT INTO late_log SELECT ?, k, t, v FROM batch", tx.batch_id)


def random_batches(seed: int, n: int = 40, keys: int = 3) -> list[list[oracle.Row]]:
    """Mostly increasing times with out-of-order rows, some far behind, empty batches,
    duplicates, NULL keys (a key like any other) and a key with a single row."""
    rng = random.Random(seed)
    clock, batches = 0, []
    for b in range(n):
        rows: list[oracle.Row] = []
        for _ in range(rng.choice([0, 1, 3, 6, 10])):
            clock += rng.randint(0, 4)
            t = clock - (rng.randint(0, 60) if rng.random() < 0.3 else rng.randint(0, 3))
            key = f"k{rng.randrange(keys)}" if rng.random() > 0.05 else None
            rows.append((key, t, float(rng.randint(1, 9))))
        if rows and rng.random() < 0.1:
            rows.append(rows[0])  # a duplicate row counts twice
        if b == 7:
            rows.append(("lonely", clock, 5.0))  # a key with a single row
        batches.append(rows)
    return batches


def fired(eng: Engine) -> list[tuple[int, oracle.Fired]]:
    return sorted(((r["batch_id"], (r["k"], r["ws"], r["we"], r["revision"], r["n"],
                                    r["total"]))
                   for r in eng.query("SELECT * FROM fired_log").to_pylist()), key=_order)


def _order(item: tuple[int, tuple]) -> tuple:
    batch_id, (key, start, *_) = item
    return batch_id, start, key is None, key or ""


def late(eng: Engine) -> list[tuple[int, oracle.Row]]:
    return sorted(((r["batch_id"], (r["k"], r["t"], r["v"]))
                   for r in eng.query("SELECT * FROM late_log").to_pylist()),
                  key=lambda item: (item[0], str(item[1])))


def expected(batches: list[list[oracle.Row]], *params: int
             ) -> tuple[list[tuple[int, oracle.Fired]], list[tuple[int, oracle.Row]]]:
    out = oracle.run(batches, *params)
    windows = sorted(((b, f) for b, (fs, _) in enumerate(out, start=1) for f in fs), key=_order)
    lates = sorted(((b, r) for b, (_, ls) in enumerate(out, start=1) for r in ls),
                   key=lambda item: (item[0], str(item[1])))
    return windows, lates


@pytest.mark.parametrize("size, slide, delay, lateness", [
    (10, 10, 0, 0), (10, 10, 5, 20), (20, 5, 3, 7), (12, 4, 0, 30)])
@pytest.mark.parametrize("group_commit", [True, False])
def test_matches_the_row_at_a_time_model(size: int, slide: int, delay: int, lateness: int,
                                         group_commit: bool) -> None:
    batches = random_batches(size * 100 + slide + delay + lateness)
    eng = Engine(group_commit=group_commit, gc_every=3)
    integer_graph(eng, size, slide, delay, lateness, via_procedure=not group_commit)
    for rows in batches:
        eng.ingest("s", rows)
        eng.run_until_idle()
    want_fired, want_late = expected(batches, size, slide, delay, lateness)
    assert fired(eng) == want_fired
    assert late(eng) == want_late
    assert want_late and (lateness == 0) != any(f[3] > 1 for _, f in want_fired)  # both policies
    eng.close()


def test_rows_in_equal_rows_windowed_plus_rows_late() -> None:
    batches = random_batches(7, n=60)
    batches.append([("flush", 10 ** 6, 0.0)])  # moves the watermark past every window
    eng = Engine()
    integer_graph(eng, 10, 10, 2, 15)
    for rows in batches:
        eng.ingest("s", rows)
    eng.run_until_idle()
    rows_in = sum(len(rows) for rows in batches)
    windowed = eng.query("SELECT sum(n) FROM (SELECT arg_max(n, revision) AS n FROM fired_log "
                         "GROUP BY k, ws)").column(0)[0].as_py()
    still_open = eng.query("SELECT count(*) FROM w__state").column(0)[0].as_py()
    n_late = eng.query("SELECT count(*) FROM late_log").column(0)[0].as_py()
    assert still_open == 1  # the flush row, in its window that has not closed
    assert n_late > 0 and rows_in == windowed + still_open + n_late
    counters = eng.query("SELECT rows_in, rows_late FROM sstore_sys.event_windows").to_pylist()
    assert counters == [{"rows_in": rows_in, "rows_late": n_late}]
    eng.close()


def timestamp_engine(path: str, time_type: str = "TIMESTAMP") -> Engine:
    eng = Engine(path)
    eng.stream("vitals", {"patient": "INTEGER NOT NULL", "ts": time_type, "hr": "DOUBLE"})
    eng.event_window("hr_1m", "vitals", time="ts", size="1 minute", key="patient",
                     delay=datetime.timedelta(seconds=10), allowed_lateness="30 seconds",
                     aggregates={"n": "count(*)", "avg_hr": "avg(hr)",
                                 "hrs": "list(hr ORDER BY ts)"})
    eng.execute(f"CREATE TABLE IF NOT EXISTS closes (b BIGINT, patient INTEGER, window_start "
                f"{time_type}, window_end {time_type}, revision INTEGER, n BIGINT, "
                f"avg_hr DOUBLE, hrs DOUBLE[])")

    @eng.procedure(input="hr_1m")
    def on_close(tx, batch):
        tx.execute("INSERT INTO closes SELECT ?, * FROM batch", tx.batch_id)

    return eng


def closes(eng: Engine) -> list[tuple]:
    return [tuple(r.values()) for r in
            eng.query("SELECT b, patient, window_start, revision, n, avg_hr, hrs FROM closes "
                      "ORDER BY ALL").to_pylist()]


def test_timestamp_windows_close_when_the_watermark_passes(state_path: str) -> None:
    eng = timestamp_engine(state_path)
    eng.ingest("vitals", [(1, at(5), 60.0), (2, at(30), 70.0), (1, at(62), 61.0)])
    eng.ingest("vitals", [(1, at(68), 62.0), (1, at(55), 64.0)])  # 55 is behind, in the bound
    eng.run_until_idle()
    assert closes(eng) == []  # watermark 68 - 10 = 58: the first minute is still open
    eng.ingest("vitals", [(3, at(71), 90.0)])  # a single row of patient 3; watermark 61
    eng.run_until_idle()
    assert closes(eng) == [(3, 1, T0, 1, 2, 62.0, [60.0, 64.0]),
                           (3, 2, T0, 1, 1, 70.0, [70.0])]
    eng.ingest("vitals", [(2, at(50), 72.0), (1, at(20), 10.0)])  # late, within 30 s
    eng.ingest("vitals", [(1, at(200), 63.0)])  # watermark 190: every minute before closes
    eng.ingest("vitals", [(2, at(40), 1.0)])  # beyond the lateness: late stream
    eng.run_until_idle()
    assert closes(eng)[2:] == [
        (4, 1, T0, 2, 3, 44.666666666666664, [60.0, 10.0, 64.0]),
        (4, 2, T0, 2, 2, 71.0, [70.0, 72.0]),
        (5, 1, at(60), 1, 2, 61.5, [61.0, 62.0]),
        (5, 3, at(60), 1, 1, 90.0, [90.0])]
    assert eng.query("SELECT patient, ts, hr FROM hr_1m__late").to_pylist() == [
        {"patient": 2, "ts": at(40), "hr": 1.0}]
    # the minute of 200 s never closes until the watermark passes 240 s
    eng.ingest("vitals", [(1, at(249), 1.0)])  # watermark 239
    eng.run_until_idle()
    assert closes(eng)[-1][0] == 5
    eng.ingest("vitals", [(1, at(251), 1.0)])  # watermark 241
    eng.run_until_idle()
    assert closes(eng)[-1][:4] == (8, 1, at(180), 1)
    assert eng.schema("hr_1m").field("window_end").type == "timestamp[us]"
    eng.close()


def test_timestamptz_and_the_bound_on_out_of_order_rows(tmp_path) -> None:
    eng = timestamp_engine(str(tmp_path / "tz.duckdb"), "TIMESTAMPTZ")
    utc = datetime.UTC
    rows = [(1, at(s).replace(tzinfo=utc), float(s)) for s in (3, 65, 59, 61, 50)]
    eng.ingest("vitals", rows[:2])
    eng.ingest("vitals", rows[2:])  # 59 and 50: behind the newest row, not the watermark (55)
    eng.ingest("vitals", [(1, at(75).replace(tzinfo=utc), 0.0)])
    eng.run_until_idle()
    got = eng.query("SELECT window_start, n, hrs FROM closes").to_pylist()
    assert got == [{"window_start": T0.replace(tzinfo=utc), "n": 3, "hrs": [3.0, 50.0, 59.0]}]
    assert eng.query("SELECT count(*) FROM hr_1m__late").column(0)[0].as_py() == 0
    eng.close()


def test_rows_without_event_time_are_refused(state_path: str) -> None:
    eng = timestamp_engine(state_path)
    eng.ingest("vitals", [(1, at(5), 60.0)])
    with pytest.raises(SchemaError, match=r"hr_1m.*1 row\(s\) of batch 2.*'ts' is NULL"):
        eng.ingest("vitals", [(1, at(6), 61.0), (1, None, 62.0)])
    with pytest.raises(SchemaError):
        eng.ingest("vitals", [(1, "not a time", 62.0)])
    assert eng.ingest("vitals", [(1, at(7), 63.0)]) == 2  # nothing of the refused batches
    counters = eng.query("SELECT rows_in, rows_late FROM sstore_sys.event_windows").to_pylist()
    assert counters == [{"rows_in": 2, "rows_late": 0}]
    assert eng.query("SELECT count(*) FROM vitals").column(0)[0].as_py() == 2
    eng.close()


def test_a_procedure_that_emits_no_event_time_is_dead_lettered() -> None:
    eng = Engine()
    eng.stream("raw", {"k": "VARCHAR", "t": "BIGINT"})
    eng.stream("clean", {"k": "VARCHAR", "t": "BIGINT"})

    @eng.procedure(input="raw", output="clean", on_error="dead_letter")
    def tidy(tx, batch):
        return tx.sql("SELECT k, t FROM batch")  # passes a NULL time through

    eng.event_window("w", "clean", time="t", size=10, key="k")
    eng.ingest("raw", [("a", 1), ("a", None)])
    eng.ingest("raw", [("a", 2), ("a", 30)])
    eng.run_until_idle()
    dead = eng.query("SELECT _batch_id, k, t FROM raw__dead_letter ORDER BY t").to_pylist()
    assert dead == [{"_batch_id": 1, "k": "a", "t": 1}, {"_batch_id": 1, "k": "a", "t": None}]
    assert eng.latest("w")[1].to_pylist() == [
        {"k": "a", "window_start": 0, "window_end": 10, "revision": 1, "rows": 1}]
    eng.close()


def test_restart_mid_stream_continues_with_the_same_watermark(state_path: str) -> None:
    batches = random_batches(11, n=30)
    reference = Engine()
    integer_graph(reference, 20, 5, 3, 10)
    for rows in batches:
        reference.ingest("s", rows)
    reference.run_until_idle()
    eng = Engine(state_path)
    integer_graph(eng, 20, 5, 3, 10)
    for rows in batches[:13]:
        eng.ingest("s", rows)
    eng.run_until_idle(max_executions=7)  # some closes not yet consumed
    watermark = eng.query("SELECT watermark FROM sstore_sys.event_windows").column(0)[0]
    eng.close()
    eng = Engine(state_path)
    integer_graph(eng, 20, 5, 3, 10)
    assert eng.query("SELECT watermark FROM sstore_sys.event_windows").column(0)[0] == watermark
    for rows in batches[13:]:
        eng.ingest("s", rows)
    eng.run_until_idle()
    assert fired(eng) == fired(reference) and late(eng) == late(reference)
    eng.close()
    eng = Engine(state_path)
    with pytest.raises(DeclarationError, match="declared differently"):
        integer_graph(eng, 20, 10, 3, 10)  # another slide over the same state
        eng.run_until_idle()
    eng.close()
    reference.close()


@pytest.mark.parametrize("via_procedure", [True, False])
def test_ingest_and_run_matches_the_row_at_a_time_model(via_procedure: bool) -> None:
    """The window fed inside a group that the ingest leads (``Engine.ingest_and_run``): the
    closes and late rows commit with the batch and the procedures reading them."""
    batches = random_batches(77)
    eng = Engine(gc_every=3)
    integer_graph(eng, 10, 5, 2, 8, via_procedure=via_procedure)
    for rows in batches:
        eng.ingest_and_run("s", rows)
    want_fired, want_late = expected(batches, 10, 5, 2, 8)
    assert fired(eng) == want_fired and want_fired
    assert late(eng) == want_late and want_late
    eng.close()


def test_group_commit_on_and_off_give_identical_results(tmp_path) -> None:
    results = []
    for group_commit in (True, False):
        eng = Engine(str(tmp_path / f"g{group_commit}.duckdb"), group_commit=group_commit)
        integer_graph(eng, 10, 5, 2, 8, via_procedure=True)
        for rows in random_batches(3, n=40):
            eng.ingest("s", rows)
        eng.run_until_idle()
        results.append((fired(eng), late(eng), eng.query(
            "SELECT * FROM w__state ORDER BY ALL").to_pylist()))
        eng.close()
    assert results[0] == results[1] and results[0][0] and results[0][1]


def test_status_open_existing_and_refused_writes(state_path: str) -> None:
    eng = timestamp_engine(state_path)
    eng.ingest("vitals", [(1, at(5), 60.0), (1, at(100), 61.0)])
    eng.run_until_idle()
    streams = {s.name: s for s in eng.status().streams}
    assert streams["hr_1m"].source == "vitals" and streams["hr_1m__late"].source == "vitals"
    assert streams["hr_1m"].last_batch == 1
    with pytest.raises(DeclarationError, match="written by event window 'hr_1m'"):
        eng.ingest("hr_1m", [])
    eng.close()
    assert {s.name for s in status_of_file(state_path).streams} >= {"hr_1m", "hr_1m__late"}
    foreign = Engine.open_existing(state_path)
    assert foreign.graph.event_windows["hr_1m"].size == 60_000_000
    assert foreign.read_batches("hr_1m", 1, 1).num_rows == 1
    foreign.close()


@pytest.mark.parametrize("kwargs, message", [
    ({"time": "nope", "size": 10}, "has no column 'nope'"),
    ({"time": "t", "size": 10, "key": "t"}, "not the time column"),
    ({"time": "k", "size": 10}, "must be TIMESTAMP, TIMESTAMPTZ or an integer"),
    ({"time": "t", "size": 10, "slide": 20}, "slide <= size"),
    ({"time": "t", "size": 10, "slide": 0}, "slide <= size"),
    ({"time": "t", "size": 10_000, "slide": 1}, "at most 1000 windows per row"),
    ({"time": "t", "size": "10 seconds"}, "integer in its unit"),
    ({"time": "t", "size": 10, "delay": -1}, ">= 0"),
    ({"time": "t", "size": 10, "aggregates": {"x": "avg(nope)"}}, "do not compile"),
    ({"time": "t", "size": 10, "aggregates": {"x": "v"}}, "do not compile"),
    ({"time": "t", "size": 10, "aggregates": {"revision": "count(*)"}}, "new column name"),
])
def test_declaration_errors(kwargs: dict, message: str) -> None:
    eng = Engine()
    eng.stream("s", {"k": "VARCHAR", "t": "BIGINT", "v": "DOUBLE"})
    with pytest.raises(DeclarationError, match=message):
        eng.event_window("w", "s", **kwargs)
    eng.close()


def test_timestamp_durations_must_have_a_fixed_length() -> None:
    eng = Engine()
    eng.stream("s", {"ts": "TIMESTAMP"})
    with pytest.raises(DeclarationError, match="no fixed length"):
        eng.event_window("w", "s", time="ts", size="1 month")
    with pytest.raises(DeclarationError, match="timedelta or an interval string"):
        eng.event_window("w", "s", time="ts", size=60)
    with pytest.raises(DeclarationError, match="already declared"):
        eng.stream("w2__late", {"x": "INTEGER"})
        eng.event_window("w2", "s", time="ts", size="1 minute")
    eng.close()


def test_the_documented_example_weighted_pressure_alerts() -> None:
    """docs/engine.md's example, the shape the ICU workload builds on: per-patient sliding
    windows, a weighted average, alerts from a procedure, late readings kept."""
    eng = Engine()
    eng.stream("vitals", {"patient": "INTEGER", "ts": "TIMESTAMP", "pap": "DOUBLE",
                          "w": "DOUBLE"})
    eng.event_window("pap_1m", "vitals", time="ts", size="1 minute", slide="20 seconds",
                     key="patient", delay="10 seconds", allowed_lateness="2 minutes",
                     aggregates={"n": "count(*)", "wavg_pap": "sum(w * pap) / sum(w)"})
    eng.execute("CREATE TABLE late_readings (patient INTEGER, ts TIMESTAMP, pap DOUBLE, "
                "w DOUBLE)")

    @eng.procedure(input="pap_1m", output="alerts")
    def low_pressure(tx, batch):
        return tx.sql("SELECT patient, window_end, revision, wavg_pap FROM batch "
                      "WHERE wavg_pap < 20")

    @eng.procedure(input="pap_1m__late")
    def keep_late(tx, batch):
        tx.execute("INSERT INTO late_readings SELECT * FROM batch")

    alerts: list[dict] = []
    eng.subscribe("alerts", lambda batch_id, rows: alerts.extend(rows.to_pylist()))
    eng.ingest("vitals", [(1, at(1), 25.0, 1.0), (1, at(15), 10.0, 3.0),
                          (2, at(5), 30.0, 1.0)])
    eng.ingest("vitals", [(1, at(35), 30.0, 1.0), (2, at(45), 31.0, 1.0)])
    eng.run_until_idle()  # watermark 35: the window [-40 s, 20 s) closed
    assert alerts == [{"patient": 1, "window_end": at(20), "revision": 1, "wavg_pap": 13.75}]
    eng.ingest("vitals", [(1, at(12), 2.0, 4.0)])  # late within 2 minutes: a correction
    eng.ingest("vitals", [(1, at(400), 30.0, 1.0)])  # watermark 390: everything finalized
    eng.ingest("vitals", [(1, at(14), 5.0, 1.0)])  # too late
    eng.run_until_idle()
    assert [(a["window_end"], a["revision"], a["wavg_pap"]) for a in alerts] == [
        (at(20), 1, 13.75), (at(20), 2, 7.875),  # the correction: (25 + 30 + 8) / 8
        (at(40), 1, 93 / 9), (at(60), 1, 93 / 9)]  # then [-20 s, 40 s) and [0, 60 s) close
    assert eng.query("SELECT patient, pap FROM late_readings").to_pylist() == [
        {"patient": 1, "pap": 5.0}]
    eng.close()


def test_an_event_window_over_another_event_windows_closes() -> None:
    """Minutes per patient, then 5-minute windows over the minutes' ends: the second window
    advances with the first one's source (its batches commit in the same transactions)."""
    eng = Engine()
    eng.stream("v", {"patient": "INTEGER", "ts": "TIMESTAMP", "hr": "DOUBLE"})
    eng.event_window("minute", "v", time="ts", size="1 minute", key="patient",
                     aggregates={"avg_hr": "avg(hr)"})
    eng.event_window("five", "minute", time="window_end", size="5 minutes", key="patient",
                     aggregates={"minutes": "count(*)", "peak": "max(avg_hr)"})
    got: list[dict] = []

    @eng.procedure(input="five")
    def collect(tx, batch):
        got.extend(batch.to_pylist())

    for minute in range(12):
        eng.ingest("v", [(1, at(60 * minute + 30), float(minute))])
    eng.run_until_idle()
    # minutes end at 1..11 min (the 12th is open); [0, 5 min) holds those ending at 1..4
    assert [(r["window_end"], r["minutes"], r["peak"]) for r in got] == [
        (at(300), 4, 3.0), (at(600), 5, 8.0)]
    eng.close()


def test_status_shows_each_windows_watermark_and_counts(state_path: str) -> None:
    """What an operator sees: the watermark (as a time for a timestamp column) and the rows
    taken in and found late, in ``status()``, its JSON and ``sstore status``'s text."""
    from sstore.cli.format import status_view
    from sstore.storage.status import EngineStatus

    eng = Engine(state_path)
    eng.stream("v", {"k": "VARCHAR", "ts": "TIMESTAMP", "x": "DOUBLE"})
    eng.event_window("per_min", "v", time="ts", size="1 minute", key="k", delay="10 seconds")
    eng.ingest("v", [("a", at(0), 1.0), ("a", at(100), 2.0)])
    eng.ingest("v", [("a", at(5), 3.0)])  # behind the watermark (90 s) and its window is done
    status = eng.status()
    (w,) = status.event_windows
    assert (w["name"], w["source"], w["rows_in"], w["rows_late"]) == ("per_min", "v", 3, 1)
    assert w["watermark_at"] == at(90).replace(tzinfo=datetime.UTC).isoformat()
    again = EngineStatus.from_dict(status.to_dict())
    assert again.event_windows == status.event_windows
    from rich.console import Console
    console = Console(record=True, width=160)
    console.print(status_view(status))
    text = console.export_text()
    assert "Event-time windows" in text and "per_min" in text
    eng.close()
