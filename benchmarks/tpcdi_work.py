"""The work a streaming DimTrade batch costs, counted so that a loaded machine does not change it:
DuckDB statements and process CPU milliseconds per batch, sstore's engine against the
hand-written reference's DuckDB half, side by side (interleaved), on the same batches.

Why: ``benchmarks.tpcdi``'s trades/s and latencies move with the machine's load (2 shared
cores, load 5-15), so an A/B of a change to the per-batch work must be read from counts. No
Spark and no PostgreSQL here: the lookups are ``tpcdi_procs``' stand-ins, the engine keeps its
outputs (no sinks: what they cost is the same COPY the reference makes), and the reference
runs ``ReferenceDimTrade.process``'s DuckDB statements (``JUDGE_SQL``, ``APPLY_SQL``, the
alerts when ``may_alert`` finds a candidate, ``merge_outcome``) in an in-memory DuckDB, as it
does. Statements are counted by DuckDB itself (``enable_logging('QueryLog')``: every statement
the connection runs, the engine's commit records, stream appends and view registrations
included). Both must end with the same DimTrade (a digest of the current rows).

    python -m benchmarks.tpcdi_work [--sf 0.1] [--batch-trades 100 1000 10000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from benchmarks.tpcdi_procs import digest, stand_in_dimensions
from benchmarks.tpcdi_reference import ALERTS_SQL, APPLY_SQL, JUDGE_SQL
from sstore import Engine
from sstore.base.duck import arrow
from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.streaming.batch_ids import engine_batch_id
from sstore.workloads.tpcdi.streaming.events import (
    BatchEvents,
    batch1_events,
    incremental_events,
)
from sstore.workloads.tpcdi.streaming.procedures import (
    DIMTRADE_VERSIONS_DDL,
    DIMTRADE_VIEW_DDL,
    LOOKUPS,
    declare,
    merge_outcome,
)

EVENTS_PER_TRADE = 2.51  # SF 1's events per trade (benchmarks.tpcdi's batch sizes)


@dataclass
class Work:
    """What one system spent over the measured batches."""

    batches: int = 0
    cpu_seconds: float = 0.0
    statements: Counter[str] = field(default_factory=Counter)
    state: str = ""  # digest of DimTrade's current rows at the end

    def per_batch(self) -> tuple[float, float]:
        """(CPU ms, DuckDB statements) per batch."""
        n = max(1, self.batches)
        return self.cpu_seconds * 1000 / n, sum(self.statements.values()) / n


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _logged(con: duckdb.DuckDBPyConnection) -> Counter[str]:
    """Statements DuckDB logged since logging was enabled, by their first words."""
    rows = con.execute("SELECT message FROM duckdb_logs WHERE type = 'QueryLog'").fetchall()
    return Counter(" ".join(str(m).split())[:72] for (m,) in rows)


def _chunks(events: list[BatchEvents], size: int) -> list[tuple[int, pa.Table]]:
    out = []
    for ev in events:
        for start in range(0, ev.lines.num_rows, size):
            chunk = ev.lines.slice(start, size)
            out.append((engine_batch_id(ev.tpcdi_batch, int(chunk["line_no"][-1].as_py())),
                        chunk))
    return out


def run_engine(data: Path, chunks: list[tuple[int, pa.Table]], tmp: str) -> tuple[Work, dict[
        str, pa.Table]]:
    """The streaming dataflow (``procedures.declare``) on a state file, every batch through
    ``ingest_and_run`` as ``StreamingDimTrade.stream`` sends it. Returns the work and the
    lookup tables (for the reference)."""
    engine = Engine(os.path.join(tmp, "state.duckdb"))
    try:
        declare(engine)
        stand_in_dimensions(engine, data)
        lookups = {t: engine.query(f"SELECT {c} FROM {t}") for t, c in LOOKUPS.items()}
        work = Work()
        with engine.lock:
            engine.connection.execute("CALL enable_logging('QueryLog')")
        began = _cpu()
        for batch_id, chunk in chunks:
            engine.ingest_and_run("trade_lines", chunk, batch_id=batch_id)
        work.cpu_seconds, work.batches = _cpu() - began, len(chunks)
        with engine.lock:
            work.statements = _logged(engine.connection)
            engine.connection.execute("CALL disable_logging()")
        work.state = digest(engine.query("SELECT * FROM dimtrade"), ["tradeid"])
    finally:
        engine.close()
    return work, lookups


def run_reference(lookups: dict[str, pa.Table], chunks: list[tuple[int, pa.Table]]) -> Work:
    """``ReferenceDimTrade.process`` without its PostgreSQL transaction: the same DuckDB
    statements, one DuckDB transaction per chunk, in memory."""
    con = duckdb.connect(":memory:")
    try:
        con.execute(DIMTRADE_VERSIONS_DDL)
        con.execute(DIMTRADE_VIEW_DDL)
        for table, rows in lookups.items():
            con.register("rows", rows)
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM rows")
            con.unregister("rows")
        work = Work()
        con.execute("CALL enable_logging('QueryLog')")
        began = _cpu()
        for chunk_id, chunk in chunks:
            con.begin()
            con.register("chunk", chunk)
            judged = arrow(con, JUDGE_SQL)
            con.register("keyed", judged)
            changed = arrow(con, APPLY_SQL, [chunk_id])

            def alerts_of(applied: pa.Table) -> pa.Table:
                con.register("applied", applied)
                return arrow(con, ALERTS_SQL)

            merge_outcome(judged, changed, alerts_of)
            con.commit()
        work.cpu_seconds, work.batches = _cpu() - began, len(chunks)
        work.statements = _logged(con)
        con.execute("CALL disable_logging()")
        work.state = digest(con.execute("SELECT * EXCLUDE (version) FROM dimtrade_versions "
                                        "QUALIFY row_number() OVER (PARTITION BY tradeid "
                                        "ORDER BY version DESC) = 1").to_arrow_table(),
                            ["tradeid"])
    finally:
        con.close()
    return work


def measure(data: Path, events: list[BatchEvents], trades: int, rounds: int
            ) -> dict[str, list[Work]]:
    """``rounds`` interleaved runs of both systems at ``trades`` trades per batch."""
    chunks = _chunks(events, max(1, round(trades * EVENTS_PER_TRADE)))
    got: dict[str, list[Work]] = {"sstore": [], "reference": []}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            engine, lookups = run_engine(data, chunks, tmp)
        got["sstore"].append(engine)
        got["reference"].append(run_reference(lookups, chunks))
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=0.1)
    ap.add_argument("--batch-trades", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--statements", action="store_true", help="list each system's statements")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        generate(args.sf, data, seed=3, bad_rows=7)
        events = [batch1_events(data), incremental_events(data, 2), incremental_events(data, 3)]
        print(f"SF {args.sf:g}, load {os.getloadavg()[0]:.1f}; per batch: process CPU ms "
              f"(median of {args.rounds} rounds), DuckDB statements")
        for trades in args.batch_trades:
            got = measure(data, events, trades, args.rounds)
            cells = []
            for system, works in got.items():
                cpu = statistics.median(w.per_batch()[0] for w in works)
                cells.append(f"{system} {cpu:7.1f} ms {works[0].per_batch()[1]:5.1f} stmts")
            same = len({w.state for ws in got.values() for w in ws}) == 1
            print(f"{trades:>6} trades ({got['sstore'][0].batches} batches): "
                  + " | ".join(cells) + f" | same DimTrade: {same}", flush=True)
            if args.statements:
                for system, works in got.items():
                    n = works[0].batches
                    for text, count in works[0].statements.most_common():
                        print(f"    {system:9} {count / n:5.2f}  {text}")


if __name__ == "__main__":
    main()
