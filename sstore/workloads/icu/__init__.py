"""ICU monitoring, the S-Store in BigDAWG paper's second use case, as a workload.

Vital signs of N patients (``generator``: deterministic, with injected episodes, noise and the
ground truth) stream through a cleaning procedure, per-patient event-time windows and an
episode detector (``dataflow``, with the clinical rules in ``rules``) that raises one alert per
episode; alerts, per-patient window aggregates, rejected and too-late readings move into
PostgreSQL (``run``). See docs/icu.md.
"""

from sstore.workloads.icu.dataflow import declare
from sstore.workloads.icu.generator import Episode, Generated, Noise, generate
from sstore.workloads.icu.run import counts, expected_counts, feed, make_sinks, match

__all__ = ["Episode", "Generated", "Noise", "counts", "declare", "expected_counts", "feed",
           "generate", "make_sinks", "match"]
