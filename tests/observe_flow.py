"""The dataflow the observability tests watch, and a process that runs it and holds its file.

Names are chosen so that alphabetical order is not dataflow order::

    zz_raw ──▶ z_parse ──▶ m_clean ──▶ b_enrich ──▶ k_enriched ──▶ a_total ──▶ d_totals
                               └──▶ c_recent (window, 2 batches) ──▶ y_watch

``y_watch`` raises on batch ``halt_at`` (it halts: nothing downstream of it, nothing else).

Run as a program (``python -m tests.observe_flow STATE BATCHES [--serve] [--sink URL]``) it
ingests and runs BATCHES batches, prints ``ready <url or ->`` and keeps the state file open
until its standard input closes: the "running pipeline" of the live-status tests.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sstore import Engine, observe

DATAFLOW = ["zz_raw", "z_parse", "m_clean", "b_enrich", "k_enriched", "a_total", "d_totals",
            "c_recent", "y_watch"]
PROCEDURES = ["z_parse", "b_enrich", "a_total", "y_watch"]
INPUTS = {"z_parse": ["zz_raw"], "m_clean": ["z_parse"], "b_enrich": ["m_clean"],
          "k_enriched": ["b_enrich"], "a_total": ["k_enriched"], "d_totals": ["a_total"],
          "c_recent": ["m_clean"], "y_watch": ["c_recent"], "zz_raw": []}
ROWS_PER_BATCH = 3


def declare_flow(engine: Engine, halt_at: int | None = None) -> None:
    """Declare the graph above, procedures in an order that is neither of the two."""
    engine.stream("zz_raw", {"user_id": "INTEGER", "amount": "INTEGER"})
    engine.stream("m_clean", {"user_id": "INTEGER", "amount": "INTEGER"})
    engine.execute("CREATE TABLE IF NOT EXISTS totals (user_id INTEGER PRIMARY KEY, "
                   "total BIGINT)")
    engine.window("c_recent", "m_clean", batches=2)

    @engine.procedure(input="k_enriched", output="d_totals")
    def a_total(tx: Any, batch: Any) -> Any:
        tx.execute("INSERT INTO totals SELECT user_id, sum(amount) FROM batch GROUP BY ALL "
                   "ON CONFLICT (user_id) DO UPDATE SET total = totals.total + excluded.total")
        return tx.sql("SELECT user_id, total FROM totals ORDER BY user_id")

    @engine.procedure(input="c_recent")
    def y_watch(tx: Any, batch: Any) -> None:
        if tx.batch_id == halt_at:
            raise ValueError(f"bad batch {tx.batch_id}")

    @engine.procedure(input="zz_raw", output="m_clean")
    def z_parse(tx: Any, batch: Any) -> Any:
        return tx.sql("SELECT user_id, amount FROM batch WHERE amount >= 0")

    @engine.procedure(input="m_clean", output="k_enriched")
    def b_enrich(tx: Any, batch: Any) -> Any:
        return tx.sql("SELECT user_id, amount * 10 AS amount FROM batch")


def feed(engine: Engine, batches: int, first: int = 1) -> None:
    """Ingest ``batches`` batches of ``ROWS_PER_BATCH`` rows (one negative, dropped by
    z_parse) and run the dataflow after each."""
    for b in range(first, first + batches):
        engine.ingest("zz_raw", [(b % 2, b), (b % 2 + 2, 1), (7, -1)])
        engine.run_until_idle()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("state")
    parser.add_argument("batches", type=int)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--halt-at", type=int, default=None)
    args = parser.parse_args()
    engine = Engine(args.state)
    declare_flow(engine, args.halt_at)
    url = observe.serve(engine, 0) if args.serve else "-"
    feed(engine, args.batches)
    print("ready", url, flush=True)
    sys.stdin.read()
    engine.close()


if __name__ == "__main__":
    main()
