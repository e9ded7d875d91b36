"""The engine's process ended from outside, as rules of the model: SIGKILL at a named crash
point (``crash``), and a clean stop by SIGTERM or SIGINT at one (``stop_by_signal``).

Both run the operations in a child process (``benchmarks.model.child``), which opens the
system, ingests a new batch, runs, collects garbage (and checkpoints, weak durability), and
gets the signal at the ``hit``-th pass of a crash point (``sstore.base.faults``:
``SSTORE_CRASH_AT``, ``SSTORE_CRASH_SIGNAL``). Then this process opens the system again and
sends the batch again, as a client that does not know whether it got in would, and runs.

One rule (``crash``) draws the signal: SIGKILL (switch ``crash``) or SIGTERM / SIGINT
(switch ``signal_stop``). A SIGKILL is a crash: the state must open and hold every committed batch
once. A signal asks for a clean stop (``sstore.execution.stopping.command_stops``, as the CLI runs a
dataflow): the child must end with 0 (the stop came after its last step) or 128 + the signal's
number and the "stopped" message, never a traceback or a halt; a continuous sink it had attached
(when the target holds rows) detaches after its chunk in flight, and what it had not delivered is
still held for the next run. A mixin of ``benchmarks.model.machine.ModelMachine``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from benchmarks.model import child
from benchmarks.model.context import Violation, ctx
from benchmarks.model.dataflow import Record
from benchmarks.model.inputs import shaped
from benchmarks.model.warehouse import WarehouseRules, quick_retry

ROOT = Path(__file__).resolve().parents[2]
RECORDS = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 99_999),
                             st.sampled_from([0, 600_000, 999_999, 123_456, 500_000])),
                   min_size=1, max_size=4)
POINTS = {
    "full": ("ingest.before_commit", "ingest.after_commit", "te.before_commit",
             "te.after_commit", "gc.before_commit", "procedure.body"),
    "weak": ("log.after_append", "ingest.before_commit", "te.before_commit",
             "te.after_commit", "checkpoint.after_snapshot", "procedure.body"),
}
SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT}


class ProcessRules(WarehouseRules):
    """The crash and stop rules (module docstring)."""

    dir: Path
    stopped: str | None
    #: ``machine.ModelMachine``'s helpers these rules use
    records: Callable[..., list[Record]]
    floats: Callable[[], bool]
    acks_after_restart: Callable[[], None]

    @precondition(lambda self: self.stopped is None and (ctx().switches.on("crash") or
                                                         ctx().switches.on("signal_stop")))
    @rule(spec=RECORDS, fused=st.booleans(), data=st.data(), hit=st.integers(1, 2),
          sig=st.sampled_from(["KILL", "TERM", "INT"]), sink=st.booleans())
    def crash(self, spec: list[tuple[int, int, int]], fused: bool, data: st.DataObject,
              hit: int, sig: str = "KILL", sink: bool = False) -> None:
        """The child ended by ``sig`` at a crash point drawn for the durability mode: one
        rule for SIGKILL and the clean stops, so that programs spend no more of their steps
        on child processes (a second or more each) than on any other rule."""
        if not self.ctx.switches.on("signal_stop"):
            sig = "KILL"
        elif not self.ctx.switches.on("crash") and sig == "KILL":
            sig = "TERM"
        point = data.draw(st.sampled_from(POINTS[self.sys.mode]), label="point")
        if sig == "KILL":
            self.do_crash(spec, fused, point, hit)
        else:
            self.do_stop(spec, fused, point, hit, sig, sink)

    def do_crash(self, spec: list[tuple[int, int, int]], fused: bool, point: str,
                 hit: int) -> None:
        """SIGKILL of the child at ``point`` (module docstring)."""
        self.step(f"crash_{self.sys.mode}")
        self.in_child(spec, fused, point, hit, "KILL", sink=False)

    def do_stop(self, spec: list[tuple[int, int, int]], fused: bool, point: str, hit: int,
                sig: str, sink: bool) -> None:
        """A clean stop of the child by SIGTERM or SIGINT at ``point``, with a continuous
        sink attached in it when the target holds rows (module docstring)."""
        sink = sink and bool(self.model.target) and not self.lowprec and \
            self.ctx.switches.on("attached_sink")
        self.step(f"sig{sig.lower()}_{self.sys.mode}" + ("_sink" if sink else ""))
        self.in_child(spec, fused, point, hit, sig, sink)

    def in_child(self, spec: list[tuple[int, int, int]], fused: bool, point: str, hit: int,
                 sig: str, sink: bool) -> None:
        fused = fused and self.ctx.switches.on("ingest_and_run")
        records = self.records(spec)
        batch_id = records[-1].rec
        ops: list[dict[str, Any]] = [
            {"op": "ingest_and_run" if fused else "ingest", "batch_id": batch_id,
             "rows": child.encode(records)}, {"op": "run"}, {"op": "gc"}]
        if self.sys.mode == "weak" and self.ctx.switches.on("checkpoint"):
            ops.append({"op": "checkpoint"})
        spec_path = self.dir / "child.json"
        spec_path.write_text(json.dumps({
            "mode": self.sys.mode, "workdir": str(self.dir), "url": self.sys.url,
            "table": self.sys.table, "program": self.program.to_json(), "ops": ops,
            "sink": sink}))
        reader_before = self.model.reader_acked
        self.sys.close()
        env = dict(os.environ, PYTHONPATH=str(ROOT), SSTORE_CRASH_AT=f"{point}:{hit}",
                   SSTORE_CRASH_SIGNAL=sig)
        proc = subprocess.run([sys.executable, "-m", "benchmarks.model.child", str(spec_path)],
                              cwd=ROOT, env=env, capture_output=True, timeout=120)
        self.judge_exit(proc, sig, point, hit)
        if sink and self.sys.mode == "weak":
            # the child's GC (logged, replayed here) may remove what the reader had read and
            # the child's sink delivered, while their acknowledgements are not logged; the
            # delivery after the child must then meet no gap (``after_child_sink``)
            self.model.released = max(self.model.released, reader_before)
        try:
            self.open(self.program)
        except Exception as exc:
            raise Violation(f"the state did not open after SIG{sig} at {point}:{hit}: "
                            f"{type(exc).__name__}: {exc}") from exc
        if self.stopped is not None:
            return
        try:
            self.sys.e.ingest("orders", shaped(records, "tuples", self.floats(),
                                               self.program.appended),
                              batch_id=batch_id)
            self.sys.e.run_until_idle()
        except Exception as exc:
            raise Violation(f"after SIG{sig} at {point}:{hit}, sending batch {batch_id} "
                            f"again and running failed: {type(exc).__name__}: {exc}") from exc
        self.model.commit(batch_id, records)
        self.model.run_all()
        self.acks_after_restart()
        if sink:
            self.after_child_sink()

    def judge_exit(self, proc: subprocess.CompletedProcess[bytes], sig: str, point: str,
                   hit: int) -> None:
        """The child's end: killed (SIGKILL), stopped cleanly (a signal), or done."""
        from sstore.execution.stopping import STOPPED_MESSAGE
        stderr = proc.stderr.decode(errors="replace")
        if sig == "KILL" and proc.returncode == -signal.SIGKILL:
            self.ctx.fault("sigkill")
            return
        if sig != "KILL" and proc.returncode == 128 + SIGNALS[sig]:
            if STOPPED_MESSAGE not in stderr or "Traceback" in stderr:
                self.sys.open(self.program)
                raise Violation(f"SIG{sig} at {point}:{hit}: exit {proc.returncode} without "
                                f"a clean stop:\n{stderr[-2000:]}")
            self.ctx.fault(f"sig{sig.lower()}")
            return
        if proc.returncode != 0:
            self.sys.open(self.program)
            raise Violation(f"the child (SIG{sig} at {point}:{hit}) failed (exit "
                            f"{proc.returncode}):\n{stderr[-2000:]}")

    def after_child_sink(self) -> None:
        """The child's sink delivered some of the batches after the target's watermark: a
        one-shot sink delivers the rest, and the target must then hold each of them once; a
        gap would mean the child's GC removed a batch its sink had not delivered."""
        from migrators import StreamToPostgres
        expected = self.continued()
        sink = StreamToPostgres(self.sys.e, "enriched", self.sys.url, self.sys.table,
                                accept_gap=False, retry=quick_retry())
        try:
            sink.run_once()
        except Exception as exc:
            raise Violation(f"after a stop with a sink attached, the next delivery failed: "
                            f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.sys.e.unregister_sink(sink)
        self.delivered(expected)
