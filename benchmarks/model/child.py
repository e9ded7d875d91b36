"""The crash child: opens the model's system in a process of its own, runs a few operations, and
is SIGKILLed by ``sstore.base.faults`` at the crash point its environment names
(``SSTORE_CRASH_AT=te.before_commit:1``), or finishes and prints DONE. With
``SSTORE_CRASH_SIGNAL=TERM`` (or ``INT``) it gets that signal there instead and stops cleanly,
as a CLI command does (``sstore.execution.stopping.command_stops``: exit 143 or 130, the "stopped"
message); ``"sink": true`` attaches a continuous sink to the target first (detached on the way
out, as a program's ``finally`` would).

    python -m benchmarks.model.child SPEC.json

SPEC: ``{"mode", "workdir", "url", "table", "program": Program, "ops": [op...], "sink"}``; an op is
``{"op": "ingest" | "ingest_and_run", "batch_id": N, "rows": [[rec, k, "amt", "ts"], ...]}``,
``{"op": "run"}``, ``{"op": "gc"}`` or ``{"op": "checkpoint"}``.
"""

from __future__ import annotations

import datetime
import json
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

from benchmarks.model.dataflow import Record, values
from benchmarks.model.system import Program, System


def encode(records: list[Record]) -> list[list[Any]]:
    return [[r.rec, r.k, str(r.amt), r.ts.isoformat(), r.note, r.channel] for r in records]


def decode(rows: list[list[Any]]) -> list[Record]:
    return [Record(rec, k, Decimal(amt), datetime.datetime.fromisoformat(ts), note, channel)
            for rec, k, amt, ts, note, channel in rows]


def main(spec_path: str) -> None:
    from sstore.execution.stopping import command_stops
    with open(spec_path) as f:
        spec = json.load(f)
    system = System(spec["mode"], Path(spec["workdir"]), spec["url"], spec["table"])
    p = spec["program"]
    with command_stops():
        program = Program(p["enrich_name"], tuple(p["retire"]), p["orders_types"],
                          p.get("evolved", False), p.get("enrich_version", 1),
                          p.get("appended", False))
        engine = system.open(program)
        try:
            if spec.get("sink"):
                from migrators import StreamToPostgres
                system.attached = StreamToPostgres(engine, "enriched", system.url, system.table,
                                                   accept_gap=True)
                system.attached.attach()
            run(engine, spec["ops"], program.appended)
        finally:
            system.close()  # detaches the sink first
    print("DONE", flush=True)


def run(engine: Any, ops: list[dict[str, Any]], appended: bool = False) -> None:
    for op in ops:
        kind = op["op"]
        if kind in ("ingest", "ingest_and_run"):
            rows = [values(r, appended) for r in decode(op["rows"])]
            getattr(engine, kind)("orders", rows, batch_id=op["batch_id"])
        elif kind == "run":
            engine.run_until_idle()
        elif kind == "gc":
            engine.collect_garbage()
        elif kind == "checkpoint":
            engine.checkpoint()
        else:
            raise ValueError(f"unknown op {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1])
