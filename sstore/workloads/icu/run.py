"""Running the ICU workload: the warehouse sinks, feeding the arrival batches, checking alerts
against the generator's ground truth.

Arrival batch ``i`` (what arrived in second ``i``) is engine batch ``i + 1`` of
``icu_readings``, so a program that restarts on the same state file simply sends every batch
again: the engine skips the ones it already committed (exactly once), and the sinks resume
from their PostgreSQL watermarks.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from migrators.engine_to_postgres import StreamToPostgres
from sstore.engine import Engine
from sstore.maintenance import StreamTarget
from sstore.workloads.icu import dataflow, rules
from sstore.workloads.icu.generator import Episode, Generated


def targets(schema: str = "icu") -> tuple[StreamTarget, ...]:
    """Where the dataflow's outputs go in the warehouse ``schema``: alerts and per-patient
    window aggregates merge by their keys (a window's correction replaces it), rejected and
    too-late readings append (kept, never dropped)."""
    return (StreamTarget(dataflow.ALERTS, f"{schema}.alerts", "merge", ("alert_id",)),
            StreamTarget(dataflow.WINDOWS, f"{schema}.patient_windows", "merge",
                         ("patient", "window_start")),
            StreamTarget(dataflow.REJECTS, f"{schema}.rejects"),
            StreamTarget(dataflow.LATE, f"{schema}.late_readings"))


def make_sinks(engine: Engine, url: str, schema: str = "icu",
               on_delivered: Callable[[str, object], None] | None = None
               ) -> list[StreamToPostgres]:
    """One continuous sink per target (created before the engine starts, so every batch is
    kept for them). ``on_delivered(stream, delivered)`` after each PostgreSQL COMMIT."""
    return [StreamToPostgres(engine, t.stream, url, t.table, mode=t.mode, key=t.key,
                             ack_every=0.2, on_delivered=None if on_delivered is None else
                             functools.partial(on_delivered, t.stream))
            for t in targets(schema)]


@dataclass
class Fed:
    """What feeding did: readings sent, batches, seconds (feeding and running)."""

    rows: int = 0
    batches: int = 0
    seconds: float = 0.0
    sent_at: dict[int, float] = field(default_factory=dict)  # batch id -> perf_counter


def feed(engine: Engine, batches: Sequence[pa.Table],
         each: Callable[[int, int], None] | None = None,
         pace: float | None = None) -> Fed:
    """Send every arrival batch (``ingest_and_run``), in order, as batch ``i + 1``.
    ``pace``: seconds of wall time per arrival second (None: as fast as it goes)."""
    fed = Fed()
    began = time.perf_counter()
    for i, table in enumerate(batches):
        if pace is not None:
            delay = began + i * pace - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        fed.sent_at[i + 1] = time.perf_counter()
        engine.ingest_and_run(dataflow.READINGS, table, batch_id=i + 1)
        fed.rows += table.num_rows
        fed.batches += 1
        if each is not None:
            each(i + 1, table.num_rows)
    engine.run_until_idle()
    fed.seconds = time.perf_counter() - began
    return fed


@dataclass
class Verdict:
    """Alerts matched to the injected episodes."""

    per_episode: dict[int, list[int]]  # index in the ground truth -> alert ids
    unmatched: list[int]  # alert ids matching no episode

    @property
    def ok(self) -> bool:
        return not self.unmatched and all(len(a) == 1 for a in self.per_episode.values())

    def describe(self, episodes: Sequence[Episode]) -> str:
        missed = [episodes[i] for i, a in self.per_episode.items() if not a]
        double = {i: a for i, a in self.per_episode.items() if len(a) > 1}
        return f"missed {missed}; several alerts {double}; without episode {self.unmatched}"


def match(alerts: Iterable[dict[str, Any]], episodes: Sequence[Episode]) -> Verdict:
    """An alert (patient, kind, window) matches an episode of that patient and kind when its
    window overlaps the episode's time (windows straddle its start and end)."""
    per: dict[int, list[int]] = {i: [] for i in range(len(episodes))}
    unmatched = []
    for alert in alerts:
        hits = [i for i, ep in enumerate(episodes)
                if ep.patient == alert["patient"] and ep.kind == alert["kind"]
                and alert["window_start"] < ep.end and alert["window_end"] > ep.start]
        for i in hits:
            per[i].append(alert["alert_id"])
        if not hits:
            unmatched.append(alert["alert_id"])
    return Verdict(per, unmatched)


def counts(engine: Engine) -> dict[str, int]:
    """The engine's accounting: rows in, clean, rejected, duplicates (``icu_batch_counts``),
    rows windowed and late (``sstore_sys.event_windows``)."""
    row = engine.query(f"SELECT coalesce(sum(rows_in), 0) AS rows_in, coalesce(sum(clean), 0) "
                       f"AS clean, coalesce(sum(rejected), 0) AS rejected, "
                       f"coalesce(sum(duplicates), 0) AS duplicates "
                       f"FROM {dataflow.COUNTS}").to_pylist()[0]
    ev = engine.query("SELECT rows_in, rows_late FROM sstore_sys.event_windows WHERE name = ?",
                      dataflow.WINDOWS).to_pylist()
    out = {k: int(v) for k, v in row.items()}
    out["windowed"] = int(ev[0]["rows_in"]) - int(ev[0]["rows_late"]) if ev else 0
    out["late"] = int(ev[0]["rows_late"]) if ev else 0
    return out


def expected_counts(gen: Generated) -> dict[str, int]:
    """What the counts must be, from the generator alone."""
    return {"rows_in": gen.rows, "clean": gen.readings, "rejected": gen.bad,
            "duplicates": gen.duplicates}


def alert_rows(engine: Engine) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = engine.query(
        f"SELECT * FROM {dataflow.ALERT_LOG} ORDER BY alert_id").to_pylist()
    return rows


__all__ = ["Fed", "Verdict", "alert_rows", "counts", "expected_counts", "feed", "make_sinks",
           "match", "rules", "targets"]
