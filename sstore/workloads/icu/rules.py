"""The ICU workload's clinical rules: windows, thresholds, and one alert per episode.

Everything a clinician would want to tune is a named constant here, documented with its
source in docs/icu.md (which numbers are clinical conventions and which are our choices). The
episode logic is plain Python over a handful of flagged windows, so the engine's procedure and
the Spark Structured Streaming baseline (``benchmarks.icu_sss``) share it verbatim.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass

# ----------------------------------------------------------------------------- windows
WINDOW = datetime.timedelta(seconds=30)  # tumbling, per patient
DELAY = datetime.timedelta(seconds=5)  # watermark = newest reading time - DELAY
LATENESS = datetime.timedelta(seconds=60)  # closed windows take corrections this long
MIN_READINGS = 10  # a window with fewer readings is not judged (a sensor gap, not a patient)
#: Abnormal windows of one patient and kind this close to an episode belong to it.
MERGE_GAP = 2 * WINDOW

# ----------------------------------------------------------------------------- thresholds
#: Mean PAP weights: the classical estimate (systolic + 2 x diastolic) / 3.
PAP_WEIGHTS = (1, 2)
LOW_MEAN_PAP = 9.0  # mmHg; normal resting mean PAP is 14 +- 3.3 (Kovacs et al. 2009)
BRADYCARDIA_BPM = 50.0  # window mean below: a common bedside-monitor alarm limit
TACHYCARDIA_BPM = 120.0  # window mean above: a common bedside-monitor alarm limit
IRREGULARITY = 0.08  # mean |successive RR difference| / mean RR above: irregular rhythm

#: Plausible ranges; a reading outside is rejected (a sensor or transmission fault).
HR_RANGE = (20, 300)
RR_RANGE = (200, 3000)
PRESSURE_RANGE = (0.0, 150.0)

#: The window's aggregates, as SQL over the window's readings (DuckDB). Sums of exact
#: decimals and integers, so a late row or a replay after a crash gives the very same numbers.
AGGREGATES: dict[str, str] = {
    "n": "count(*)",
    "mean_pap": "round(sum(CAST(pap_sys + 2 * pap_dia AS DECIMAL(12, 1))) "
                "/ (3 * count(*)), 2)",
    "mean_hr": "round(sum(hr) / count(*), 2)",
    "irregularity": "round(list_sum(list_transform(list_zip(list(rr_ms ORDER BY ts)[2:], "
                    "list(rr_ms ORDER BY ts)[:-2]), lambda d: abs(d[1] - d[2]))) "
                    "/ nullif(count(*) - 1, 0) / (sum(rr_ms) / count(*)), 4)",
}

#: kind -> (aggregate, comparison, threshold): a window is abnormal for ``kind`` when
#: ``aggregate comparison threshold`` and it holds at least MIN_READINGS readings.
CHECKS: dict[str, tuple[str, str, float]] = {
    "low_pap": ("mean_pap", "<", LOW_MEAN_PAP),
    "tachycardia": ("mean_hr", ">", TACHYCARDIA_BPM),
    "bradycardia": ("mean_hr", "<", BRADYCARDIA_BPM),
    "irregular_rhythm": ("irregularity", ">", IRREGULARITY),
}


@dataclass(frozen=True)
class Flag:
    """A closed (or corrected) window found abnormal for one kind."""

    patient: int
    kind: str
    window_start: datetime.datetime
    window_end: datetime.datetime
    value: float


@dataclass
class Episode:
    """An alert's extent: the abnormal windows of one patient and kind seen so far."""

    alert_id: int
    patient: int
    kind: str
    first_start: datetime.datetime
    last_end: datetime.datetime


def flag_sql(relation: str = "batch") -> str:
    """The abnormal (window, kind) pairs of ``relation`` (rows of the window stream), in a
    fixed order: window start, patient, kind."""
    parts = [f"SELECT patient, '{kind}' AS kind, window_start, window_end, "
             f"CAST({column} AS DOUBLE) AS value FROM {relation} "
             f"WHERE n >= {MIN_READINGS} AND {column} {op} {threshold}"
             for kind, (column, op, threshold) in CHECKS.items()]
    return " UNION ALL ".join(parts) + " ORDER BY window_start, patient, kind"


def assign(flags: Iterable[Flag], episodes: list[Episode], next_id: int
           ) -> tuple[list[tuple[Flag, Episode]], list[Episode]]:
    """Join each new abnormal window to its patient's episode of that kind, or open one.

    Returns (the alerts: the flag that opened each new episode, with it; every episode touched,
    new or extended). ``episodes`` are the known episodes of the flags' patients; windows
    must come in ``flag_sql`` order. A window joins an episode when it lies within
    ``MERGE_GAP`` of it, so an episode spanning several windows, or a window corrected into
    or out of abnormal by late rows, never raises a second alert."""
    by_key: dict[tuple[int, str], list[Episode]] = {}
    for ep in episodes:
        by_key.setdefault((ep.patient, ep.kind), []).append(ep)
    alerts: list[tuple[Flag, Episode]] = []
    touched: dict[int, Episode] = {}
    for flag in flags:
        mine = by_key.setdefault((flag.patient, flag.kind), [])
        home = next((ep for ep in mine if flag.window_start <= ep.last_end + MERGE_GAP
                     and flag.window_end >= ep.first_start - MERGE_GAP), None)
        if home is None:
            home = Episode(next_id, flag.patient, flag.kind, flag.window_start,
                           flag.window_end)
            next_id += 1
            mine.append(home)
            alerts.append((flag, home))
        else:
            home.first_start = min(home.first_start, flag.window_start)
            home.last_end = max(home.last_end, flag.window_end)
        touched[home.alert_id] = home
    return alerts, sorted(touched.values(), key=lambda e: e.alert_id)


def threshold_of(kind: str) -> float:
    return CHECKS[kind][2]
