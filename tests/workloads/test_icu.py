"""The ICU monitoring workload end to end on real DuckDB and PostgreSQL: every injected
episode raises exactly one alert and no alert fires without one; every reading is counted
(in = clean + rejected + duplicates; clean = windowed + late); alerts reach subscribers and
PostgreSQL; corrections from late rows never alert twice. Crashes:
tests/workloads/test_icu_crash.py."""

from __future__ import annotations

import datetime

import psycopg
import pytest

from sstore import Engine
from sstore.workloads import icu
from sstore.workloads.icu import dataflow, rules, run

T0 = datetime.datetime(2026, 1, 1, 8, 0)


def at(seconds: int) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def flag(patient: int, kind: str, start: int) -> rules.Flag:
    return rules.Flag(patient, kind, at(start), at(start + 30), 1.0)


def test_episode_rules_one_alert_per_episode() -> None:
    # an episode over three windows, then its first window corrected, then a window arriving
    # out of order before it: one alert; another kind, and the same kind much later: new ones
    alerts, episodes = rules.assign([flag(1, "low_pap", 60), flag(1, "low_pap", 90),
                                     flag(1, "low_pap", 120)], [], 1)
    assert [(f.window_start, e.alert_id) for f, e in alerts] == [(at(60), 1)]
    more, touched = rules.assign([flag(1, "low_pap", 30), flag(1, "tachycardia", 90),
                                  flag(1, "low_pap", 600), flag(2, "low_pap", 90)],
                                 episodes, 2)
    assert [(f.patient, f.kind, e.alert_id) for f, e in more] == [
        (1, "tachycardia", 2), (1, "low_pap", 3), (2, "low_pap", 4)]
    assert (touched[0].first_start, touched[0].last_end) == (at(30), at(150))


def test_generator_is_deterministic_and_keeps_episodes_apart() -> None:
    a = icu.generate(8, 900, seed=5, batch_seconds=3)
    b = icu.generate(8, 900, seed=5, batch_seconds=3)
    assert [t.to_pylist() for t in a.batches] == [t.to_pylist() for t in b.batches]
    assert a.episodes == b.episodes and a.episodes
    assert a.rows == a.readings + a.duplicates + a.bad
    assert icu.generate(8, 900, seed=6).episodes != a.episodes
    for x in a.episodes:
        assert x.start >= at(90) and x.end <= at(900 - 120)
        for y in a.episodes:
            if x is not y and x.patient == y.patient:
                assert x.end + datetime.timedelta(seconds=150) <= y.start \
                    or y.end + datetime.timedelta(seconds=150) <= x.start
    with pytest.raises(ValueError, match="patients"):
        icu.generate(0, 10)


def test_every_episode_raises_one_alert_in_postgres(state_path: str, pg_url: str) -> None:
    gen = icu.generate(24, 720, seed=2, batch_seconds=4, rate_per_hour=20,
                       noise=icu.Noise(late=0.06, duplicate=0.02, bad=0.01))
    engine = Engine(state_path)
    icu.declare(engine)
    sinks = icu.make_sinks(engine, pg_url)
    pushed: list[dict] = []
    corrections: list[dict] = []
    engine.subscribe(dataflow.ALERTS, lambda _b, rows: pushed.extend(rows.to_pylist()))
    engine.subscribe(dataflow.WINDOWS, lambda _b, rows: corrections.extend(
        r for r in rows.to_pylist() if r["revision"] > 1))
    for sink in sinks:
        sink.attach()
    icu.feed(engine, gen.batches)
    for sink in sinks:
        assert sink.flush(timeout=60), sink.last_error

    alerts = run.alert_rows(engine)
    verdict = icu.match(alerts, gen.episodes)
    assert verdict.ok, verdict.describe(gen.episodes)
    assert len(alerts) == len(gen.episodes) >= 8
    assert {e.kind for e in gen.episodes} == set(rules.CHECKS)
    assert pushed == alerts  # every alert pushed to the subscriber, once, in order

    counts = run.counts(engine)
    assert {k: counts[k] for k in ("rows_in", "clean", "rejected", "duplicates")} \
        == icu.expected_counts(gen)
    assert counts["rows_in"] == counts["clean"] + counts["rejected"] + counts["duplicates"]
    assert counts["clean"] == counts["windowed"] + counts["late"] and counts["late"] > 0

    # late rows corrected windows, some of them abnormal ones, and no alert came of that
    abnormal = {(w["patient"], w["window_start"]) for w in corrections
                if any(_abnormal(w, kind) for kind in rules.CHECKS)}
    assert corrections and abnormal

    with psycopg.connect(pg_url) as con:
        pg_alerts = con.execute("SELECT alert_id, patient, kind, window_start FROM icu.alerts "
                                "ORDER BY alert_id").fetchall()
        assert pg_alerts == [(a["alert_id"], a["patient"], a["kind"], a["window_start"])
                             for a in alerts]
        reasons = dict(con.execute("SELECT reason, count(*) FROM icu.rejects "
                                   "GROUP BY reason").fetchall())
        assert sum(reasons.values()) == gen.bad and "no time" in reasons
        assert con.execute("SELECT count(*) FROM icu.late_readings").fetchone()[0] \
            == counts["late"]
        # one row per window, at its last revision, equal to the engine's last firing
        windows = con.execute("SELECT count(*), count(DISTINCT (patient, window_start)), "
                              "max(revision) FROM icu.patient_windows").fetchone()
        assert windows[0] == windows[1] and windows[2] > 1
        fixed = con.execute("SELECT revision FROM icu.patient_windows WHERE patient = %s AND "
                            "window_start = %s", min(abnormal)).fetchone()[0]
        assert fixed == max(w["revision"] for w in corrections
                            if (w["patient"], w["window_start"]) == min(abnormal))
    for sink in sinks:
        sink.detach()
    engine.close()


def _abnormal(window: dict, kind: str) -> bool:
    column, op, threshold = rules.CHECKS[kind]
    value = window[column]
    return window["n"] >= rules.MIN_READINGS and value is not None and (
        value < threshold if op == "<" else value > threshold)


def test_bad_rows_are_rejected_with_reasons_not_dropped(engine: Engine) -> None:
    icu.declare(engine)
    good = (1, 1, at(0), 80, 20.0, 10.0, 750)
    rows = [good, good, (2, 1, None, 80, 20.0, 10.0, 750), (3, None, at(1), 80, 20.0, 10.0, 750),
            (4, 1, at(2), 0, 20.0, 10.0, 0), (5, 1, at(3), 80, 10.0, 20.0, 750),
            (6, 1, at(4), 80, -1.0, -2.0, 750)]
    engine.ingest_and_run(dataflow.READINGS, rows, batch_id=1)
    engine.ingest_and_run(dataflow.READINGS, [good], batch_id=2)  # sent again later
    engine.execute("CREATE TABLE kept AS SELECT * FROM icu_rejects")  # not yet collected
    rejected = engine.query("SELECT reading_id, reason, batch_id FROM kept ORDER BY 1")
    assert [tuple(r.values()) for r in rejected.to_pylist()] == [
        (2, "no time", 1), (3, "no patient", 1), (4, "implausible heart rate", 1),
        (5, "diastolic above systolic", 1), (6, "implausible pressure", 1)]
    assert run.counts(engine) == {"rows_in": 8, "clean": 1, "rejected": 5,
                                       "duplicates": 2, "windowed": 1, "late": 0}


def test_cli_demo_shows_alerts_and_fills_the_warehouse(pg_url: str) -> None:
    from click.testing import CliRunner

    from sstore.cli.app import main

    args = ["icu", "demo", "--postgres", pg_url, "--patients", "6", "--seconds", "400",
            "--speed", "0", "--seed", "4"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    gen = icu.generate(6, 400, seed=4, rate_per_hour=12.0)
    assert result.output.count("ALERT") == len(gen.episodes) >= 2
    assert "each episode alerted exactly once" in result.output
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT count(*) FROM icu_demo.alerts").fetchone()[0] \
            == len(gen.episodes)


def test_a_resent_reading_with_other_values_is_a_conflict_not_a_duplicate(
        engine: Engine) -> None:
    """Same id, same values: a harmless duplicate. Same id, other values (in a later batch or
    in the same one): a conflict, kept in the rejects with a reason, never silently dropped."""
    icu.declare(engine)
    first = (1, 1, at(0), 80, 20.0, 10.0, 750)
    other = (2, 1, at(1), 81, 20.0, 10.0, 740)
    engine.ingest_and_run(dataflow.READINGS, [first, other], batch_id=1)
    engine.ingest_and_run(dataflow.READINGS, [first], batch_id=2)  # identical: duplicate
    changed = (1, 1, at(0), 95, 20.0, 10.0, 750)  # id 1 again, another heart rate
    twin = (3, 1, at(2), 82, 20.0, 10.0, 730)
    twin_changed = (3, 1, at(2), 82, 20.5, 10.0, 730)
    engine.ingest_and_run(dataflow.READINGS, [changed, twin, twin_changed, twin], batch_id=3)
    engine.execute("CREATE TABLE kept AS SELECT * FROM icu_rejects")  # not yet collected
    rejected = engine.query("SELECT reading_id, hr, pap_sys, reason, batch_id FROM kept "
                            "ORDER BY 1").to_pylist()
    assert [tuple(r.values()) for r in rejected] == [
        (1, 95, 20.0, ("conflicting re-send: reading id 1 arrived in batch 1 with other "
                       "values; this copy is not used"), 3),
        (3, 82, 20.5, ("conflicting re-send: reading id 3 arrived earlier in this batch with "
                       "other values; this copy is not used"), 3)]
    assert run.counts(engine) == {"rows_in": 7, "clean": 3, "rejected": 2,
                                  "duplicates": 2, "windowed": 3, "late": 0}
    assert [tuple(r.values()) for r in engine.query(
        "SELECT reading_id, batch_id FROM icu_seen ORDER BY 1").to_pylist()] == [
        (1, 1), (2, 1), (3, 3)]


def test_a_state_file_from_before_digests_opens_and_its_readings_stay_duplicates(
        engine: Engine) -> None:
    """``icu_seen`` of an older state file gets its new columns; a reading kept before them
    has no digest to compare, so its re-send is a duplicate, as it was."""
    engine.execute(f"CREATE TABLE {dataflow.SEEN} (reading_id BIGINT PRIMARY KEY)")
    engine.execute(f"INSERT INTO {dataflow.SEEN} VALUES (1)")
    icu.declare(engine)
    engine.ingest_and_run(dataflow.READINGS, [(1, 1, at(0), 99, 20.0, 10.0, 750),
                                              (2, 1, at(1), 80, 20.0, 10.0, 750)], batch_id=1)
    engine.ingest_and_run(dataflow.READINGS, [(2, 1, at(1), 81, 20.0, 10.0, 750)], batch_id=2)
    assert run.counts(engine) == {"rows_in": 3, "clean": 1, "rejected": 1,
                                  "duplicates": 1, "windowed": 1, "late": 0}
