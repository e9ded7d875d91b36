"""The chaos loop: an engine worker restarted after every fault until it finishes, faults
injected one at a time at seeded points of its progress.

Protocol, per planned fault (``benchmarks.chaos_faults``):

1. Make sure a worker runs (start one if the last was killed or failed).
2. Pick where the fault fires: a position (trade events taken) between the worker's position
   and the end, at ``share`` of the remaining work per remaining fault (less what each fault
   uses up beyond its position), so the plan fits in the work left (a reset adds a whole data
   set of work); or, for a start-up fault, a moment while the worker starts (warehouse,
   dimensions, lookups).
3. Wait for that position (polling the worker's progress lines, not sleeping fixed times),
   then ``delay`` of an engine batch's time, so faults land anywhere inside a batch.
4. Inject it; a fault that found nothing to hit is a miss and goes to the back of the plan.
5. A worker that exits with an error on its own (a PostgreSQL restart hit a step that does
   not retry) is restarted; twice in a row without a fault in between stops the run: then the
   error is not the chaos, it is a finding.

When the plan is done, the last worker runs to the end. A worker that finishes while faults
are left gets a reset pulled forward (there is no work left to disturb otherwise).
"""

from __future__ import annotations

import random
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.chaos_faults import (
    ATTEMPTS,
    Fault,
    Injection,
    kill_migrator,
    lock_target,
    make_fault,
    reset_target,
    terminate_copy,
)
from benchmarks.chaos_procs import Worker
from migrators.embedded_postgres import PrivatePostgres
from sstore.workloads.tpcdi.streaming.pipeline import sinks

#: Engine batches a fault uses up beyond its planned position (see ``_wait_for_moment``).
OVERSHOOT_BATCHES = 2


class ChaosAborted(RuntimeError):
    """The run cannot go on (a worker that fails on its own, a stall): a finding to report."""


@dataclass
class Settings:
    data_dir: Path
    url: str
    schema: str
    state: str
    batch_size: int
    logs: Path
    migrate_chunk_rows: int = 20
    stall_seconds: float = 180.0


@dataclass
class ChaosLog:
    """Everything the run did, for the report."""

    injections: list[Injection] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    worker_errors: list[str] = field(default_factory=list)
    engine_sigkills: int = 0
    migrate_runs: int = 0
    extra_resets: int = 0
    not_injected: int = 0  # planned faults that never landed (see ``run``)
    seconds: float = 0.0

    @property
    def landed(self) -> list[Injection]:
        return [i for i in self.injections if i.landed]


class ChaosRun:
    def __init__(self, pg: PrivatePostgres, settings: Settings, batch_events: Sequence[int],
                 rng: random.Random, startup_seconds: float, kinds: Sequence[str]) -> None:
        self.pg = pg
        self.s = settings
        self.offsets = {b: sum(batch_events[:b - 1]) for b in range(1, len(batch_events) + 1)}
        self.total = sum(batch_events)
        self.rng = rng
        self.startup_seconds = startup_seconds
        self.kinds = tuple(kinds)
        self.position = 0
        self.worker: Worker | None = None
        self.log = ChaosLog()
        self.began = time.monotonic()
        self._faults_since_start = 0

    # ------------------------------------------------------------------ the loop
    def run(self, plan: Sequence[Fault]) -> ChaosLog:
        pending = deque(plan)
        while pending:
            worker = self._ensure_worker()
            fault = pending[0]
            outcome = self._wait_for_moment(worker, fault, len(pending))
            if outcome == "exited":
                if self._after_exit(worker):
                    if "target_reset" not in self.kinds:
                        self.log.not_injected += len(pending)
                        break
                    self._pull_reset_forward(pending)
                continue
            pending.popleft()
            injection = self._inject(worker, fault)
            self.log.injections.append(injection)
            if not injection.landed:
                if fault.attempt < ATTEMPTS:
                    again = make_fault(self.rng, fault.kind)
                    pending.append(replace(again, attempt=fault.attempt + 1))
                else:
                    self.log.not_injected += 1
        self._finish()
        self.log.seconds = time.monotonic() - self.began
        return self.log

    def _finish(self) -> None:
        """Let the last worker run to the end (restarting it after errors)."""
        while True:
            worker = self._ensure_worker()
            outcome = worker.wait_for(quiet=self.s.stall_seconds,
                                      timeout=self.s.stall_seconds * 10)
            if outcome == "exited":
                if self._after_exit(worker):
                    return
                continue
            self._stalled(worker)

    # ------------------------------------------------------------------ workers
    def _ensure_worker(self) -> Worker:
        if self.worker is not None:
            if self.worker.running:
                return self.worker
            if self.log.workers[-1]["ended"] == "running":  # it died while a fault ran
                self._after_exit(self.worker)
        n = len(self.log.workers) + 1
        args = ["--data", str(self.s.data_dir), "--url", self.s.url, "--state", self.s.state,
                "--schema", self.s.schema, "--batch-size", str(self.s.batch_size)]
        self.worker = Worker(args, f"chaos-worker-{n}", self.s.logs / "workers.log",
                             self.offsets, self.position)
        self.log.workers.append({"n": n, "position": self.position, "ended": "running"})
        self._faults_since_start = 0
        return self.worker

    def _after_exit(self, worker: Worker) -> bool:
        """A worker exited on its own: True if it finished the run, else record its error
        (and stop the run if it failed without a fault since it started)."""
        code = worker.wait(60)
        self.position = max(self.position, worker.position)
        record = self.log.workers[-1]
        if code == 0 and worker.finished:
            record["ended"] = "finished"
            return True
        error = self._last_error_line()
        record["ended"] = f"error (exit {code}): {error}"
        self.log.worker_errors.append(error)
        if self._faults_since_start == 0 and len(self.log.workers) > 1 and \
                self.log.workers[-2]["ended"].startswith("error"):
            raise ChaosAborted(f"the engine worker fails on its own, twice in a row: {error}")
        return False

    def _stalled(self, worker: Worker) -> None:
        worker.kill()
        raise ChaosAborted(f"the engine worker made no progress for {self.s.stall_seconds:.0f}"
                           f" s at event {worker.position} of {self.total}; its log: "
                           f"{self._last_error_line()}")

    def _last_error_line(self) -> str:
        try:
            lines = (self.s.logs / "workers.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        lines = [line for line in lines if line.strip()]
        return lines[-1][:300] if lines else "(empty log)"

    def _killed(self, worker: Worker) -> None:
        if worker.running:
            self.log.engine_sigkills += 1
            self.log.workers[-1]["ended"] = "SIGKILL"
        worker.kill()
        if self.log.workers[-1]["ended"] == "running":  # it had died on its own just before
            self._after_exit(worker)
        self.position = max(self.position, worker.position)

    # ------------------------------------------------------------------ when
    def _wait_for_moment(self, worker: Worker, fault: Fault, left: int) -> str:
        """Steps 2 and 3: "ready" when the fault should fire now, "exited" if the worker
        ended first."""
        if fault.share == 0.0:
            wait = max(0.0, worker.started_at + fault.delay * self.startup_seconds
                       - time.monotonic())
            time.sleep(wait)
            return "ready" if worker.running else "exited"
        position = max(self.position, worker.position)
        # a fault also uses up work it did not plan for: it fires at the first engine batch
        # past its target, and a migrator kill lets the engine run ahead: keep that aside
        spare = self.total - position - left * OVERSHOOT_BATCHES * self.s.batch_size
        target = position + int(fault.share * max(0, spare) / (left + 1))
        outcome = worker.wait_for(position=target, quiet=self.s.stall_seconds,
                                  timeout=self.s.stall_seconds * 10)
        if outcome == "quiet" or outcome == "timeout":
            self._stalled(worker)
        if outcome == "exited":
            return outcome
        time.sleep(fault.delay * self._batch_seconds(worker))
        return "ready" if worker.running else "exited"

    def _batch_seconds(self, worker: Worker) -> float:
        recent = worker.tick_intervals[-20:]
        return statistics.median(recent) if recent else 0.2

    def _pull_reset_forward(self, pending: deque[Fault]) -> None:
        """The worker finished with faults left: a reset (the plan's next, or an extra one)
        gives them work to disturb."""
        for fault in list(pending):
            if fault.kind == "target_reset":
                pending.remove(fault)
                pending.appendleft(Fault("target_reset", 0.0, fault.delay, fault.variant))
                return
        self.log.extra_resets += 1
        pending.appendleft(Fault("target_reset", 0.0, 0.0, self.rng.choice(("tables",
                                                                              "schema"))))

    # ------------------------------------------------------------------ what
    def _inject(self, worker: Worker, fault: Fault) -> Injection:
        number = len(self.log.injections) + 1
        position = max(self.position, worker.position)
        at = round(time.monotonic() - self.began, 2)
        landed, detail = getattr(self, f"_{fault.kind}")(worker, fault)
        if landed:
            self._faults_since_start += 1
        return Injection(number, fault.kind, fault.variant, landed, position, at, detail)

    def _engine_kill(self, worker: Worker, fault: Fault) -> tuple[bool, str]:
        if not worker.running:
            return False, "the worker had already exited"
        self._killed(worker)
        return True, f"worker {worker.app} at event {worker.position}"

    def _pg_restart(self, worker: Worker, fault: Fault) -> tuple[bool, str]:
        t0 = time.monotonic()
        self.pg.restart(fault.variant)
        state = "running" if worker.running else "exited"
        took = time.monotonic() - t0
        return True, f"stop -m {fault.variant} + start in {took:.2f} s (worker {state})"

    def _backend_terminate(self, worker: Worker, fault: Fault) -> tuple[bool, str]:
        window = max(10.0, 30 * self._batch_seconds(worker))
        return terminate_copy(self.s.url, worker.app, time.monotonic() + window,
                              lambda: worker.running and not worker.finished)

    def _migrator_kill(self, worker: Worker, fault: Fault) -> tuple[bool, str]:
        sink = sinks(self.s.schema)[fault.sink]
        lock = lock_target(self.s.url, sink.table)
        if lock is None:
            return False, f"{sink.table} is not there to lock"
        try:
            quiet = max(3.0, 10 * self._batch_seconds(worker))
            worker.wait_for(ticks=fault.lag, quiet=quiet, timeout=self.s.stall_seconds)
            lagged = worker.position
            self._killed(worker)
        finally:
            lock.rollback()
            lock.close()
        self.log.migrate_runs += 1
        landed, detail = kill_migrator(self.s.state, self.s.url, sink, fault.variant,
                                       self.s.migrate_chunk_rows, self.s.logs / "migrate.log")
        return landed, f"sink lagged to event {lagged}, worker SIGKILLed; {detail}"

    def _target_reset(self, worker: Worker, fault: Fault) -> tuple[bool, str]:
        if worker.running:
            self._killed(worker)
        detail = reset_target(self.s.url, self.s.schema, self.s.state, fault.variant)
        self.position = 0
        return True, f"at event {worker.position}: {detail}"
