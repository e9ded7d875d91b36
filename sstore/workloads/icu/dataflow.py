"""The ICU dataflow, declared on an ``Engine``::

    icu_readings ─icu_clean─┬─▶ icu_clean_readings ─event window icu_windows─┬─▶ icu_windows ─┐
                            │                                                └─▶ icu_windows__late
                            └─▶ icu_rejects               ┌──────────────────────────────────┘
                                                          └─icu_detect─▶ icu_alerts

- ``icu_clean`` (one TE per arrival batch) rejects impossible readings with a reason (to
  ``icu_rejects``, never dropped), removes duplicates (a reading id seen before, in an earlier
  batch or earlier in this one, with the same values: the first arrival is kept; ties inside a
  batch go to the smallest row, so the choice is deterministic) and counts each batch in
  ``icu_batch_counts``: rows in = clean + rejected + duplicates. A re-send of a reading id with
  OTHER values is no duplicate but a conflict: it goes to ``icu_rejects`` (counted as rejected)
  with the reason ``conflicting re-send: reading id N arrived in batch B with other values``,
  and a warning is logged; the first arrival stays the one used. ``icu_seen`` keeps each kept
  reading's id, a digest of its values and its batch.
- ``icu_windows``: 30 s tumbling event-time windows per patient (``rules``), fed inside
  ``icu_clean``'s TE; closes and corrections go to ``icu_windows``, too-late readings to
  ``icu_windows__late``.
- ``icu_detect`` flags abnormal windows (``rules.CHECKS``), remembers every abnormal window
  once (``icu_abnormal_windows``: a correction re-firing a window flags nothing new) and joins
  each new one to its patient's episode (``rules.assign``); only a new episode makes an alert
  (``icu_alerts``, also kept in ``icu_alert_log``). So an episode spanning several windows, or
  corrected by late rows, raises one alert.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from sstore.base.sql import ident
from sstore.engine import Engine
from sstore.execution.transaction import Transaction
from sstore.workloads.icu import rules
from sstore.workloads.icu.generator import READING_COLUMNS

log = logging.getLogger(__name__)

READINGS = "icu_readings"
CLEAN = "icu_clean_readings"
REJECTS = "icu_rejects"
WINDOWS = "icu_windows"
LATE = f"{WINDOWS}__late"
ALERTS = "icu_alerts"
COUNTS = "icu_batch_counts"
SEEN = "icu_seen"
ABNORMAL = "icu_abnormal_windows"
EPISODES = "icu_episodes"
ALERT_LOG = "icu_alert_log"

REJECT_COLUMNS = {**READING_COLUMNS, "reason": "VARCHAR", "batch_id": "BIGINT"}
ALERT_COLUMNS = {"alert_id": "BIGINT", "patient": "INTEGER", "kind": "VARCHAR",
                 "window_start": "TIMESTAMP", "window_end": "TIMESTAMP", "value": "DOUBLE",
                 "threshold": "DOUBLE", "batch_id": "BIGINT"}

_lo_hr, _hi_hr = rules.HR_RANGE
_lo_rr, _hi_rr = rules.RR_RANGE
_lo_p, _hi_p = rules.PRESSURE_RANGE
#: The first defect found, in this order, is the reading's reason; NULL: a good reading.
REASON_SQL = f"""CASE
    WHEN reading_id IS NULL THEN 'no reading id'
    WHEN ts IS NULL THEN 'no time'
    WHEN patient IS NULL THEN 'no patient'
    WHEN hr IS NULL OR hr NOT BETWEEN {_lo_hr} AND {_hi_hr} THEN 'implausible heart rate'
    WHEN rr_ms IS NULL OR rr_ms NOT BETWEEN {_lo_rr} AND {_hi_rr}
        THEN 'implausible beat interval'
    WHEN pap_sys IS NULL OR pap_dia IS NULL OR pap_sys NOT BETWEEN {_lo_p} AND {_hi_p}
        OR pap_dia NOT BETWEEN {_lo_p} AND {_hi_p} THEN 'implausible pressure'
    WHEN pap_dia > pap_sys THEN 'diastolic above systolic'
END"""

_UNNEST_ALERT = ", ".join(f"unnest(?::{t}[])" for t in ALERT_COLUMNS.values())
_COLS = ", ".join(ident(c) for c in READING_COLUMNS)
_J_COLS = ", ".join(f"j.{ident(c)}" for c in READING_COLUMNS)
#: What a re-send must repeat to be a harmless duplicate: every value of the reading, as text
#: (stable across DuckDB versions, unlike ``hash``), in 64 bits of its MD5 (only readings of
#: one id are compared, so two different ones pass for equal with odds of 2^-64).
DIGEST_SQL = ("md5_number_upper(concat_ws(chr(31), "
              + ", ".join(f"{ident(c)}::VARCHAR" for c in READING_COLUMNS) + "))")
#: Every reading of the batch with its fate: rejected (with a reason); duplicate (its id was
#: seen in an earlier batch, or earlier in this one, the smallest row of an id being kept, with
#: the same values); conflict (the same id with other values: a different reading under a
#: used id, never dropped as a duplicate, it goes to the rejects with a reason saying so; a
#: reading kept before ``icu_seen`` had digests compares as a duplicate); clean.
JUDGE_SQL = f"""SELECT {_COLS}, CASE fate
        WHEN 'conflict' THEN 'conflicting re-send: reading id ' || reading_id || ' arrived '
            || coalesce('in batch ' || seen_batch, 'earlier in this batch')
            || ' with other values; this copy is not used'
        ELSE reason END AS reason, fate, digest
FROM (SELECT *, CASE WHEN reason IS NOT NULL THEN 'rejected'
            WHEN seen AND seen_digest <> digest THEN 'conflict'
            WHEN NOT seen AND nth > 1 AND first_digest <> digest THEN 'conflict'
            WHEN seen OR nth > 1 THEN 'duplicate' ELSE 'clean' END AS fate
      FROM (SELECT {_J_COLS}, j.reason, j.digest,
                   row_number() OVER w AS nth, first_value(j.digest) OVER w AS first_digest,
                   s.reading_id IS NOT NULL AS seen, s.digest AS seen_digest,
                   s.batch_id AS seen_batch
            FROM (SELECT *, {REASON_SQL} AS reason, {DIGEST_SQL} AS digest FROM batch) AS j
            LEFT JOIN {ident(SEEN)} AS s ON s.reading_id = j.reading_id
            WINDOW w AS (PARTITION BY j.reading_id, j.reason IS NULL ORDER BY {_J_COLS})))
ORDER BY reading_id NULLS FIRST, {_COLS}"""


def declare(engine: Engine) -> None:
    """Declare the streams, window, tables and procedures (each time the program starts,
    before the engine's first ingest; tables are created only when missing)."""
    engine.stream(READINGS, READING_COLUMNS)
    engine.stream(CLEAN, READING_COLUMNS)
    engine.stream(REJECTS, REJECT_COLUMNS)
    engine.stream(ALERTS, ALERT_COLUMNS)
    engine.event_window(WINDOWS, CLEAN, time="ts", size=rules.WINDOW, key="patient",
                        delay=rules.DELAY, allowed_lateness=rules.LATENESS,
                        aggregates=rules.AGGREGATES)
    for column, kind in (("digest", "UBIGINT"), ("batch_id", "BIGINT")):  # older state files
        engine.execute(f"ALTER TABLE IF EXISTS {ident(SEEN)} ADD COLUMN IF NOT EXISTS "
                       f"{column} {kind}")
    engine.execute(f"CREATE TABLE IF NOT EXISTS {ident(SEEN)} (reading_id BIGINT PRIMARY KEY, "
                   "digest UBIGINT, batch_id BIGINT)")
    engine.execute(f"CREATE TABLE IF NOT EXISTS {ident(COUNTS)} (batch_id BIGINT PRIMARY KEY, "
                   "rows_in BIGINT NOT NULL, clean BIGINT NOT NULL, rejected BIGINT NOT NULL, "
                   "duplicates BIGINT NOT NULL, CHECK (rows_in = clean + rejected + duplicates))")
    engine.execute(f"CREATE TABLE IF NOT EXISTS {ident(ABNORMAL)} (patient INTEGER, "
                   "kind VARCHAR, window_start TIMESTAMP, PRIMARY KEY (patient, kind, "
                   "window_start))")
    engine.execute(f"CREATE TABLE IF NOT EXISTS {ident(EPISODES)} (alert_id BIGINT PRIMARY KEY, "
                   "patient INTEGER NOT NULL, kind VARCHAR NOT NULL, "
                   "first_start TIMESTAMP NOT NULL, last_end TIMESTAMP NOT NULL)")
    cols = ", ".join(f"{ident(c)} {t}" for c, t in ALERT_COLUMNS.items())
    engine.execute(f"CREATE TABLE IF NOT EXISTS {ident(ALERT_LOG)} ({cols})")

    @engine.procedure(input=READINGS, output=(CLEAN, REJECTS))
    def icu_clean(tx: Transaction, batch: pa.Table) -> dict[str, pa.Table]:
        """Reject impossible readings and conflicting re-sends (with a reason), drop repeated
        readings, count the batch."""
        judged = tx.sql(JUDGE_SQL)
        fate = judged["fate"]
        clean = judged.filter(pc.equal(fate, "clean"))
        fresh = clean.select(list(READING_COLUMNS))
        conflicts = pc.sum(pc.equal(fate, "conflict")).as_py() or 0
        if conflicts:
            log.warning("icu_clean batch %s: %s reading(s) re-sent under a used id with other "
                        "values; they are in %s with their reason", tx.batch_id, conflicts,
                        REJECTS)
        rejects = judged.filter(pc.is_in(fate, pa.array(["rejected", "conflict"]))).select(
            [*READING_COLUMNS, "reason"])
        rejects = rejects.append_column("batch_id", pa.array([tx.batch_id] * rejects.num_rows,
                                                             pa.int64()))
        if fresh.num_rows:
            tx.execute(f"INSERT INTO {ident(SEEN)} SELECT unnest(?::BIGINT[]), "
                       "unnest(?::UBIGINT[]), ?", fresh["reading_id"].to_pylist(),
                       clean["digest"].to_pylist(), tx.batch_id)
        duplicates = pc.sum(pc.equal(fate, "duplicate")).as_py() or 0
        # the table's CHECK refuses the batch if a row got no fate: nothing lost unnoticed
        tx.execute(f"INSERT INTO {ident(COUNTS)} VALUES (?, ?, ?, ?, ?)", tx.batch_id,
                   batch.num_rows, fresh.num_rows, rejects.num_rows, duplicates)
        return {CLEAN: fresh, REJECTS: rejects}

    @engine.procedure(input=WINDOWS, output=ALERTS)
    def icu_detect(tx: Transaction, batch: pa.Table) -> pa.Table | None:
        """Flag abnormal windows; open an episode (one alert) for each that joins none."""
        if not batch.num_rows:
            return None
        flagged = tx.sql(f"SELECT * FROM ({rules.flag_sql('batch')}) AS f WHERE NOT EXISTS ("
                         f"SELECT 1 FROM {ident(ABNORMAL)} AS a WHERE a.patient = f.patient "
                         "AND a.kind = f.kind AND a.window_start = f.window_start) "
                         "ORDER BY window_start, patient, kind")
        if not flagged.num_rows:
            return None
        flags = [rules.Flag(**row) for row in flagged.to_pylist()]
        tx.execute(f"INSERT INTO {ident(ABNORMAL)} SELECT unnest(?::INTEGER[]), "
                   "unnest(?::VARCHAR[]), unnest(?::TIMESTAMP[])",
                   [f.patient for f in flags], [f.kind for f in flags],
                   [f.window_start for f in flags])
        patients = sorted({f.patient for f in flags})
        known = [rules.Episode(*row) for row in tx.fetchall(
            f"SELECT alert_id, patient, kind, first_start, last_end FROM {ident(EPISODES)} "
            "WHERE patient IN (SELECT unnest(?::INTEGER[])) ORDER BY alert_id", patients)]
        next_id = int(tx.fetchall(f"SELECT coalesce(max(alert_id), 0) + 1 "
                                  f"FROM {ident(EPISODES)}")[0][0])
        alerts, touched = rules.assign(flags, known, next_id)
        if touched:
            tx.execute(f"INSERT OR REPLACE INTO {ident(EPISODES)} SELECT unnest(?::BIGINT[]), "
                       "unnest(?::INTEGER[]), unnest(?::VARCHAR[]), unnest(?::TIMESTAMP[]), "
                       "unnest(?::TIMESTAMP[])", [e.alert_id for e in touched],
                       [e.patient for e in touched], [e.kind for e in touched],
                       [e.first_start for e in touched], [e.last_end for e in touched])
        if not alerts:
            return None
        rows = pa.table({
            "alert_id": pa.array([e.alert_id for _, e in alerts], pa.int64()),
            "patient": pa.array([f.patient for f, _ in alerts], pa.int32()),
            "kind": pa.array([f.kind for f, _ in alerts], pa.string()),
            "window_start": pa.array([f.window_start for f, _ in alerts], pa.timestamp("us")),
            "window_end": pa.array([f.window_end for f, _ in alerts], pa.timestamp("us")),
            "value": pa.array([f.value for f, _ in alerts], pa.float64()),
            "threshold": pa.array([rules.threshold_of(f.kind) for f, _ in alerts],
                                  pa.float64()),
            "batch_id": pa.array([tx.batch_id] * len(alerts), pa.int64()),
        })
        tx.execute(f"INSERT INTO {ident(ALERT_LOG)} SELECT {_UNNEST_ALERT}",
                   *[rows[c].to_pylist() for c in ALERT_COLUMNS])
        return rows
