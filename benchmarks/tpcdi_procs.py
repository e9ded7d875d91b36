"""Milliseconds per DimTrade procedure per engine batch, early vs late in a run, for one or more
versions of the procedures side by side (interleaved rounds), plus a check that they agree.

Why: the streaming DimTrade procedures (``sstore.workloads.tpcdi.streaming.procedures``) must
cost the same per batch however much DimTrade state has piled up; this shows whether a TE's
time grows from the first tenth of Batch1 to the last. No Spark, no PostgreSQL: the lookups are
stand-ins (one always-valid row per symbol and account the Trade files use, as in
``tests/workloads/tpcdi/test_tpcdi_streaming.py``), the outputs are collected from the engine, and
every version
must produce the same DimTrade state, changes, alerts and rejects (a SHA-256 over each).

    python -m benchmarks.tpcdi_procs --sf 1 --batch 1000 \
        [--variant other.module ...]   # modules with a ``declare(engine)`` to compare
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import importlib
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from sstore import Engine
from sstore.execution.runtime import CommitEvent
from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.sources import (
    read_status_type,
    read_trade,
    read_trade_incremental,
    read_trade_type,
)
from sstore.workloads.tpcdi.streaming.events import (
    BatchEvents,
    batch1_events,
    incremental_events,
)

DEFAULT = "sstore.workloads.tpcdi.streaming.procedures"
OUTPUTS = ("dimtrade_changes", "dimessages_out", "trade_rejects")


def stand_in_dimensions(engine: Engine, data: Path) -> None:
    """Lookups that always match (but for nothing): the procedures' cost, not Spark's rows."""
    batch1 = data / "Batch1"
    engine.load_table("statustype", read_status_type(batch1 / "StatusType.txt").table, "replace")
    engine.load_table("tradetype", read_trade_type(batch1 / "TradeType.txt").table, "replace")
    both = pa.concat_tables(
        [read_trade(batch1 / "Trade.txt").table.select(["t_s_symb", "t_ca_id"])]
        + [read_trade_incremental(data / f"Batch{b}" / "Trade.txt").table.select(
            ["t_s_symb", "t_ca_id"]) for b in (2, 3)])
    for table, key, names in (("dimsecurity", "t_s_symb", ("sk_securityid", "sk_companyid")),
                              ("dimaccount", "t_ca_id", ("sk_accountid", "sk_customerid",
                                                         "sk_brokerid"))):
        values = pc.unique(both[key]).drop_null()
        n = len(values)
        cols = {name: pa.array(range(1, n + 1), pa.int64()) for name in names}
        cols["symbol" if key == "t_s_symb" else "accountid"] = values
        cols.update(effectivedate=pa.array([dt.date(1950, 1, 1)] * n),
                    enddate=pa.array([dt.date(9999, 12, 31)] * n),
                    iscurrent=pa.array([True] * n))
        engine.load_table(table, pa.table(cols), "replace")


def digest(table: pa.Table, keys: list[str]) -> str:
    """Order-independent fingerprint of a table's rows."""
    rows = table.sort_by([(k, "ascending") for k in keys]).to_pylist()
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:12]


def run_once(module: str, data: Path, events: list[BatchEvents], batch: int,
             group_commit: bool) -> tuple[dict[str, dict[str, float]], dict[str, str], float]:
    """One full run: {phase: {procedure: mean ms per TE}}, output digests, seconds."""
    declare = importlib.import_module(module).declare
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(os.path.join(tmp, "state.duckdb"), group_commit=group_commit)
        declare(engine)
        stand_in_dimensions(engine, data)
        got: dict[str, list[pa.Table]] = defaultdict(list)
        for stream in OUTPUTS:
            engine.subscribe(stream, lambda b, t, s=stream: got[s].append(
                t.append_column("_b", pa.array([b] * t.num_rows, pa.int64()))))
        te: dict[int, dict[str, float]] = defaultdict(dict)
        cpu: dict[int, dict[str, float]] = defaultdict(dict)
        last = [time.process_time()]

        def observe(e: CommitEvent) -> None:
            """Wall ms of each TE (its own seconds) and the process CPU ms since the previous
            commit (closed loop: that TE's work in every thread, whatever else loads the
            machine). In a group commit the members' events come together after the one
            COMMIT: the first gets the whole batch's CPU, so read only the sum then."""
            now = time.process_time()
            if e.kind == "te":
                te[e.batch_id][e.node] = e.seconds * 1000
                cpu[e.batch_id][e.node] = (now - last[0]) * 1000
            last[0] = now

        engine.observe(observe)
        phase_of: dict[int, str] = {}
        batch_id = 0
        began = time.perf_counter()
        for ev in events:
            chunks = list(ev.chunks(batch))
            full = sum(1 for c in chunks if c.num_rows == batch)  # the last may be short
            tenth = max(1, full // 10)
            for i, chunk in enumerate(chunks):
                batch_id += 1
                phase_of[batch_id] = (f"B{ev.tpcdi_batch} " + (
                    "tail" if i >= full else "early" if i < tenth
                    else "late" if i >= full - tenth else "mid")
                    if ev.tpcdi_batch == 1 else f"B{ev.tpcdi_batch}")
                engine.ingest("trade_lines", chunk, batch_id=batch_id)
                engine.run_until_idle()
        seconds = time.perf_counter() - began
        state = engine.query("SELECT * FROM dimtrade")
        engine.close()
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for kind, table in (("wall", te), ("cpu", cpu)):
        for b, nodes in table.items():
            for node, ms in nodes.items():
                per[f"{kind} {phase_of[b]}"][node].append(ms)
                per[f"{kind} all"][node].append(ms)
    means = {ph: {n: statistics.fmean(v) for n, v in nodes.items()} for ph, nodes in per.items()}
    digests = {"dimtrade": digest(state, ["tradeid"]),
               "changes": digest(pa.concat_tables(got["dimtrade_changes"]), ["_b", "tradeid"]),
               "alerts": digest(pa.concat_tables(got["dimessages_out"]),
                                ["_b", "messagedata"]),
               "rejects": digest(pa.concat_tables(got["trade_rejects"]),
                                 ["batch_id", "line_number"])}
    counts = f"{state.num_rows} trades"
    digests["rows"] = counts
    return means, digests, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--data", type=Path, help="a generated data set (default: generate one)")
    ap.add_argument("--batch", type=int, default=1000, help="event lines per engine batch")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--variant", action="append", default=[],
                    help="module with declare(engine); repeatable (default: the current one)")
    ap.add_argument("--quick", action="store_true", help="SF 0.1, one round")
    ap.add_argument("--te-commit", action="store_true",
                    help="one commit per TE (Engine(group_commit=False)): per-procedure CPU")
    args = ap.parse_args()
    if args.quick:
        args.sf, args.rounds = 0.1, 1
    variants = args.variant or [DEFAULT]
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or Path(tmp) / "data"
        if args.data is None:
            generate(args.sf, data, seed=3, bad_rows=7)
        events = [batch1_events(data), incremental_events(data, 2), incremental_events(data, 3)]
        results: dict[str, list[tuple[dict[str, dict[str, float]], float]]] = defaultdict(list)
        digests: dict[str, dict[str, str]] = {}
        for r in range(args.rounds):
            for v in variants:  # interleaved: every round runs every variant once
                means, dig, secs = run_once(v, data, events, args.batch,
                                            group_commit=not args.te_commit)
                results[v].append((means, secs))
                digests[v] = dig
                print(f"round {r + 1} {v}: {secs:.1f} s, load {os.getloadavg()[0]:.2f}",
                      flush=True)
    print(f"\nms per TE, mean over rounds (batch {args.batch} lines; early/late = first/last "
          f"tenth of Batch1's full engine batches; wall = the TE's own time, cpu = process CPU time"
          + ("" if args.te_commit else "; group commit: cpu per procedure is not "
             "attributed, read the sum") + ")")
    phases = [f"{k} {p}" for k in ("wall", "cpu") for p in ("B1 early", "B1 late", "all")]
    for v in variants:
        print(f"\n{v}  total {statistics.fmean(s for _, s in results[v]):.1f} s")
        nodes = list(results[v][0][0]["wall all"])
        print(f"  {'procedure':26}" + "".join(f"{p:>14}" for p in phases))
        for node in nodes + ["sum"]:
            cells = []
            for p in phases:
                vals = [sum(m[p].values()) if node == "sum" else m[p].get(node, float("nan"))
                        for m, _ in results[v]]
                cells.append(f"{statistics.fmean(vals):14.2f}")
            print(f"  {node:26}" + "".join(cells))
        print(f"  outputs: {digests[v]}")
    same = len({tuple(sorted(d.items())) for d in digests.values()}) == 1
    print(f"\noutputs identical across variants: {same}")


if __name__ == "__main__":
    main()
