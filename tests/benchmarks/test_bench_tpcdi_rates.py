"""The TPC-DI benchmark's open loop (``--rates``): batches are sent when they are due, and a
batch's latency starts when it was due, even when the system is behind (a closed loop, or an
open loop that waited for the system before taking the time, would hide the backlog:
coordinated omission). And runs at different rates are never compared with each other. The
real systems' feeds, flooded open loop: tests/benchmarks/test_bench_tpcdi_reference.py (it builds
the dimensions they need once)."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pytest

from benchmarks.tpcdi import make_plan, parse_args
from benchmarks.tpcdi_report import add_ratios, batch_label, kept_up
from benchmarks.tpcdi_runs import Budget, feed_phase
from sstore.workloads.tpcdi.streaming.events import BatchEvents


class RecordingFeed:
    """A system that takes ``seconds`` per batch and records when each was due and sent."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.sent: list[tuple[float | None, float, int]] = []  # due, sent at, rows

    def begin(self, events: BatchEvents) -> None:
        pass

    def send(self, chunk: pa.Table, measured: bool, due: float | None = None) -> None:
        if measured:
            self.sent.append((due, time.perf_counter(), chunk.num_rows))
        time.sleep(self.seconds)

    def finish(self) -> None:
        pass


def _events(lines: int) -> BatchEvents:
    return BatchEvents(1, pa.table({"line": [f"l{i}" for i in range(lines)]}),
                       pa.table({"reason": pa.array([], pa.string())}))


def test_batches_are_sent_when_due_and_keep_their_due_time_when_the_system_is_behind() -> None:
    budget = Budget(phase_seconds=60.0, rate_trades=10_000.0)  # 100 trades: one per 10 ms
    assert budget.interval(100) == 0.01 and Budget(60.0).interval(100) == 0.0
    fast = RecordingFeed(seconds=0.0)
    phase = feed_phase(fast, _events(40), 4, budget, lambda n: None, batch_trades=100)
    assert phase.batches == 10 and not phase.capped
    first = fast.sent[0][0]
    assert first is not None
    for i, (due, sent_at, rows) in enumerate(fast.sent):
        assert due == first + i * 0.01, "batches are due at fixed intervals"
        assert sent_at >= due, "never sent before it is due"
        assert rows == 4
    assert phase.seconds >= 0.09  # ten batches 10 ms apart: the rate, not the system, set it

    slow = RecordingFeed(seconds=0.03)  # three times slower than the rate
    feed_phase(slow, _events(40), 4, budget, lambda n: None, batch_trades=100)
    first = slow.sent[0][0]
    assert first is not None
    lateness = [sent_at - due for due, sent_at, _ in slow.sent if due is not None]
    assert [due for due, _, _ in slow.sent] == [first + i * 0.01 for i in range(10)]
    assert lateness[-1] >= 9 * 0.02, "the backlog shows in the last batch's latency"
    assert lateness == sorted(lateness)


def test_closed_loop_sends_at_once_without_a_due_time() -> None:
    feed = RecordingFeed(seconds=0.0)
    feed_phase(feed, _events(12), 4, Budget(phase_seconds=60.0), lambda n: None,
               batch_trades=100)
    assert [due for due, _, _ in feed.sent] == [None, None, None]


def test_rates_on_the_command_line_are_checked() -> None:
    plan = make_plan(parse_args(["--rates", "0", "1500", "2e3", "--systems", "sstore"]))
    assert plan.rates == (0.0, 1500.0, 2000.0)
    assert make_plan(parse_args([])).rates == (0.0,)  # closed loop by default
    for bad in ("-5", "nan", "inf", "fast"):
        with pytest.raises(SystemExit):  # argparse's error: exit status 2, message on stderr
            parse_args(["--rates", bad])


def _record(system: str, offered: float | None, trades_per_s: float, p50: float
            ) -> dict[str, Any]:
    return {"system": system, "scale_factor": 1.0, "batch_trades": 100,
            "offered_trades_per_s": offered, "batch_label": batch_label(100, offered),
            "trades_per_s": trades_per_s, "p50_ms": p50, "p99_ms": p50 * 2,
            "hist_rows_per_s": 1.0, "incr_rows_per_s": 1.0, "capped": True}


def test_runs_are_compared_at_the_same_rate_only_and_falling_behind_is_flagged() -> None:
    records = [_record("sstore", None, 2000.0, 60.0), _record("reference", None, 2500.0, 40.0),
               _record("sstore", 2000.0, 1990.0, 80.0),
               _record("reference", 2000.0, 1500.0, 900.0)]
    ratios = add_ratios(records)
    assert [(r["offered_trades_per_s"], r["sstore_over_reference_trades_per_s"])
            for r in ratios] == [(None, 0.8), (2000.0, 1.327)]
    assert ratios[1]["batch_label"] == "100 at 2,000/s"
    assert [kept_up(r) for r in records] == [None, None, True, False]

