"""Deterministic vital-sign streams for the ICU monitoring workload, with their ground truth.

The S-Store in BigDAWG paper's second use case monitors ICU patients (MIMIC II waveforms):
alert when a patient's weighted average pulmonary arterial pressure (PAP) falls below a
threshold, on an irregular ECG rhythm and on an abnormal heart rate. MIMIC II needs a
credentialed data-use agreement, so this module makes streams of the same shape instead, and
knows exactly which episodes it put in them, which is what lets a test say "every episode
raised exactly one alert and nothing else did".

One reading per patient per second of event time (``READING_COLUMNS``): heart rate (bpm,
derived from the beat interval as an ECG monitor does), systolic and diastolic PAP (mmHg) and
the ECG beat-to-beat (RR) interval in ms. Episodes (``Episode``) change one sign for 75-150 s:

- ``low_pap``: PAP falls (mean PAP about 6 mmHg instead of about 14);
- ``tachycardia`` / ``bradycardia``: the heart rate ramps to about 145 / 38 bpm over 15 s;
- ``irregular_rhythm``: RR intervals jitter by +-25 % beat to beat (as in atrial fibrillation)
  around the patient's usual rate.

Episodes of one patient are at least ``QUIET_SECONDS`` apart, start no earlier than 90 s
into the stream and end at least 120 s before its end, so every episode's windows close.

Noise, in the arrival order (``Generated.arrivals``; one batch per second of arrival time):
most readings arrive 0-2 s after their time (out of order within the window's delay); a share
arrives 10-50 s late (within the allowed lateness: windows are corrected), a share 100-200 s
late (too late: the late-rows stream); a share is sent twice (duplicates: same reading id and
values); a share is bad (no time, no patient, impossible values) and must be rejected. The
counts of each are part of ``Generated`` so a test can check the dataflow's counts.
"""

from __future__ import annotations

import datetime
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

#: Column names and DuckDB types of a reading, in stream order.
READING_COLUMNS: dict[str, str] = {
    "reading_id": "BIGINT", "patient": "INTEGER", "ts": "TIMESTAMP", "hr": "INTEGER",
    "pap_sys": "DOUBLE", "pap_dia": "DOUBLE", "rr_ms": "INTEGER",
}
READING_SCHEMA = pa.schema([
    ("reading_id", pa.int64()), ("patient", pa.int32()), ("ts", pa.timestamp("us")),
    ("hr", pa.int32()), ("pap_sys", pa.float64()), ("pap_dia", pa.float64()),
    ("rr_ms", pa.int32()),
])

START = datetime.datetime(2026, 1, 1, 8, 0, 0)
KINDS = ("low_pap", "tachycardia", "bradycardia", "irregular_rhythm")
QUIET_SECONDS = 150  # between two episodes of one patient
LEAD_SECONDS = 90  # no episode before this
TAIL_SECONDS = 120  # every episode ends this long before the stream does
RAMP_SECONDS = 15  # heart-rate episodes ramp in and out


@dataclass(frozen=True)
class Episode:
    """One injected episode: ``kind`` on ``patient`` during event time [start, end)."""

    patient: int
    kind: str
    start: datetime.datetime
    end: datetime.datetime


@dataclass(frozen=True)
class Noise:
    """Shares of readings that arrive disordered, late, too late, twice, or bad."""

    late: float = 0.02  # 10-50 s behind: corrections
    too_late: float = 0.003  # 100-200 s behind: the late-rows stream
    duplicate: float = 0.01
    bad: float = 0.005


@dataclass
class Generated:
    """The arrival batches (batch i = what arrived in the i-th ``batch_seconds`` of arrival
    time), the ground truth (the injected episodes), the counts of each kind of noise."""

    batches: list[pa.Table]
    episodes: list[Episode]
    readings: int  # distinct good readings made
    duplicates: int
    bad: int
    too_late: int

    @property
    def rows(self) -> int:
        return sum(b.num_rows for b in self.batches)


def _episodes(rng: random.Random, patients: int, seconds: int, rate_per_hour: float
              ) -> list[tuple[int, str, int, int]]:
    out = []
    for patient in range(1, patients + 1):
        t = LEAD_SECONDS + rng.expovariate(rate_per_hour / 3600.0) if rate_per_hour > 0 \
            else math.inf
        while True:
            length = rng.randint(75, 150)
            if t + length > seconds - TAIL_SECONDS:
                break
            start = int(t)
            out.append((patient, rng.choice(KINDS), start, start + length))
            t = start + length + QUIET_SECONDS + rng.expovariate(rate_per_hour / 3600.0)
    return out


def generate(patients: int, seconds: int, seed: int = 0, rate_per_hour: float = 6.0,
             noise: Noise | None = None, batch_seconds: int = 1) -> Generated:
    """``patients`` x ``seconds`` readings with episodes (about ``rate_per_hour`` per patient
    per hour of event time) and ``noise``, cut into one arrival batch per ``batch_seconds``
    of arrival time; the same arguments always give the same result."""
    if patients < 1 or seconds < 1 or batch_seconds < 1:
        raise ValueError(f"need patients, seconds and batch_seconds >= 1, got {patients}, "
                         f"{seconds}, {batch_seconds}")
    noise = noise or Noise()
    rng = random.Random(seed)
    planned = _episodes(rng, patients, seconds, rate_per_hour)
    by_patient: dict[int, list[tuple[str, int, int]]] = {}
    for patient, kind, start, end in planned:
        by_patient.setdefault(patient, []).append((kind, start, end))
    arrivals: dict[int, list[tuple[Any, ...]]] = {}
    made = duplicates = bad = too_late = 0
    reading_id = 0
    base_us = int((START - datetime.datetime(1970, 1, 1)).total_seconds()) * 1_000_000
    for patient in range(1, patients + 1):
        prng = random.Random(seed * 1_000_003 + patient)
        base_hr = prng.uniform(62, 92)
        base_sys, base_dia = prng.uniform(19, 25), prng.uniform(8.5, 11.5)
        episodes = by_patient.get(patient, [])
        for sec in range(seconds):
            reading_id += 1
            hr_target, sys_, dia, irregular = base_hr, base_sys, base_dia, False
            for kind, start, end in episodes:
                if not start <= sec < end:
                    continue
                ramp = min(1.0, (sec - start + 1) / RAMP_SECONDS, (end - sec) / RAMP_SECONDS)
                if kind == "low_pap":
                    sys_, dia = 9.5, 4.0
                elif kind == "tachycardia":
                    hr_target = base_hr + (145 - base_hr) * ramp
                elif kind == "bradycardia":
                    hr_target = base_hr + (38 - base_hr) * ramp
                else:
                    irregular = True
            jitter = prng.uniform(-0.25, 0.25) if irregular else prng.uniform(-0.02, 0.02)
            rr = round(60000.0 / hr_target * (1 + jitter))
            row = (reading_id, patient, base_us + sec * 1_000_000, round(60000.0 / rr),
                   round(sys_ + prng.gauss(0, 1.0), 1), round(dia + prng.gauss(0, 0.6), 1), rr)
            made += 1
            draw = prng.random()
            if draw < noise.too_late:
                delay = prng.uniform(100, 200)
                too_late += 1
            elif draw < noise.too_late + noise.late:
                delay = prng.uniform(10, 50)
            else:
                delay = prng.uniform(0, 2)
            arrivals.setdefault(int(sec + delay) // batch_seconds, []).append(row)
            if prng.random() < noise.duplicate:
                duplicates += 1
                arrivals.setdefault(int(sec + prng.uniform(0, 4)) // batch_seconds, []).append(row)
            if prng.random() < noise.bad:
                bad += 1
                reading_id += 1
                arrivals.setdefault(int(sec + prng.uniform(0, 2)) // batch_seconds, []).append(
                    _bad_row(prng, reading_id, patient, base_us + sec * 1_000_000, row))
    last = max(arrivals) if arrivals else 0
    batches = [_table(sorted(arrivals.get(i, []), key=lambda r: (r[0], r[1] or 0)))
               for i in range(last + 1)]
    episodes_out = [Episode(p, k, START + datetime.timedelta(seconds=s),
                            START + datetime.timedelta(seconds=e)) for p, k, s, e in planned]
    return Generated(batches, episodes_out, made, duplicates, bad, too_late)


def _bad_row(rng: random.Random, reading_id: int, patient: int, ts: int, good: tuple[Any, ...]
             ) -> tuple[Any, ...]:
    """A reading a monitor might send but a clinician must not see: one defect of five."""
    _, _, _, hr, sys_, dia, rr = good
    defect = rng.randrange(5)
    if defect == 0:
        return (reading_id, patient, None, hr, sys_, dia, rr)  # no time
    if defect == 1:
        return (reading_id, None, ts, hr, sys_, dia, rr)  # no patient
    if defect == 2:
        return (reading_id, patient, ts, 0, sys_, dia, 0)  # lead off: no beats
    if defect == 3:
        return (reading_id, patient, ts, hr, dia, sys_ + 5, rr)  # diastolic above systolic
    return (reading_id, patient, ts, hr, -sys_, -dia, rr)  # negative pressure (zeroing error)


def _table(rows: list[tuple[Any, ...]]) -> pa.Table:
    columns: list[Sequence[Any]] = list(zip(*rows)) if rows else [[] for _ in READING_SCHEMA]
    arrays = []
    for values, fld in zip(columns, READING_SCHEMA):
        if fld.name == "ts":
            arrays.append(pa.array(values, pa.int64()).cast(fld.type))
        else:
            arrays.append(pa.array(values, fld.type))
    return pa.Table.from_arrays(arrays, schema=READING_SCHEMA)
