"""The ICU workload as a child process for the crash tests (tests/workloads/test_icu_crash.py).

    python -m tests.icu_worker full|weak PATH POSTGRES_URL

It sends every arrival batch from the first one (the engine skips those it already committed),
with the four warehouse sinks attached, waits until PostgreSQL has everything, and writes what
PostgreSQL and the engine hold to ``PATH.result.json``; then prints DONE. The tests kill it
with SIGKILL at random moments and at crash points, and compare the result with an uncrashed
run's.
"""

from __future__ import annotations

import json
import sys

import psycopg

from sstore import Engine
from sstore.workloads import icu
from sstore.workloads.icu import run

PATIENTS, SECONDS, SEED, BATCH_SECONDS = 16, 480, 11, 5


def generated() -> icu.Generated:
    return icu.generate(PATIENTS, SECONDS, seed=SEED, batch_seconds=BATCH_SECONDS,
                        rate_per_hour=30, noise=icu.Noise(late=0.05))


def warehouse(url: str) -> dict[str, list[list[object]]]:
    queries = {
        "alerts": "SELECT alert_id, patient, kind, window_start::text, window_end::text, value,"
                  " threshold, batch_id FROM icu.alerts ORDER BY alert_id",
        "windows": "SELECT patient, window_start::text, revision, n, mean_pap, mean_hr, "
                   "irregularity FROM icu.patient_windows ORDER BY patient, window_start",
        "rejects": "SELECT reading_id, reason, batch_id FROM icu.rejects ORDER BY reading_id",
        "late": "SELECT reading_id, patient, ts::text FROM icu.late_readings "
                "ORDER BY reading_id",
    }
    with psycopg.connect(url) as con:
        return {name: [list(r) for r in con.execute(sql).fetchall()]
                for name, sql in queries.items()}


def main(mode: str, path: str, url: str) -> None:
    engine = Engine(path) if mode == "full" else Engine(":memory:", input_log=path)
    icu.declare(engine)
    sinks = run.make_sinks(engine, url)
    gen = generated()
    for sink in sinks:
        sink.attach()
    icu.feed(engine, gen.batches)
    for sink in sinks:
        if not sink.flush(timeout=120):
            raise SystemExit(f"sink {sink.table} did not catch up: {sink.last_error}")
    result = {"warehouse": warehouse(url), "counts": run.counts(engine),
              "engine_alerts": [[r["alert_id"], r["patient"], r["kind"]]
                                for r in run.alert_rows(engine)]}
    for sink in sinks:
        sink.detach()
    with open(path + ".result.json", "w") as f:
        json.dump(result, f, default=str)
    engine.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
