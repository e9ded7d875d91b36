"""``generate``: every step in dependency order, writing one complete TPC-DI source data set.

HR comes first because accounts and trades name brokers; the market and the customers come
before the trades because every trade must use a security and an account that are valid
when it is created. Each step draws from its own named random stream (``rand.substream``).
"""

from __future__ import annotations

import time
from pathlib import Path

from .audit import write_audits
from .badrows import Context, inject_bad_rows, write_manifest
from .customer_files import write_customer_files
from .customer_history import simulate_customers
from .finwire import write_finwire
from .hr import write_hr
from .lifecycles import draw_lifecycles
from .market import simulate_market
from .rand import Draw, substream
from .reference import write_reference
from .report import FileReport, GenerationReport, ProgressCallback
from .scale import Sizes
from .trades import build_trades, trade_lines
from .writer import write_lines

STEPS = ("reference files", "HR", "FINWIRE", "customers and accounts", "trades", "audit files")


def generate(scale_factor: float, output: str | Path, seed: int = 0,
             progress: ProgressCallback | None = None, bad_rows: int = 0) -> GenerationReport:
    """Write the TPC-DI source files for DimTrade at ``scale_factor`` into ``output``.

    ``output`` gets ``Batch1/``, ``Batch2/``, ``Batch3/``, the top-level audit files and
    ``bad_rows.json``; existing files of the same names are overwritten, others are left
    alone. The same arguments always give byte-identical files. ``bad_rows`` malformed rows
    are injected into the incremental Trade.txt files (see ``badrows``). ``progress`` is
    called as ``progress(step, done, total)`` before each step and once at the end.
    """
    sizes = Sizes.for_scale_factor(scale_factor)
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if bad_rows < 0:
        raise ValueError(f"bad_rows must be >= 0, got {bad_rows}")
    root = Path(output)
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    def step(index: int) -> None:
        if progress is not None:
            progress(STEPS[index], index, len(STEPS))

    files: list[FileReport] = []
    step(0)
    files += write_reference(root)
    step(1)
    brokers = write_hr(root, sizes, Draw(substream(seed, "hr")))
    files.append(brokers.file)
    step(2)
    market = simulate_market(sizes, Draw(substream(seed, "market")))
    finwire = write_finwire(root, market, substream(seed, "finwire"))
    files += finwire.files
    step(3)
    customers = simulate_customers(sizes, brokers.ids, Draw(substream(seed, "customers")))
    files += write_customer_files(root, customers)
    step(4)
    life = draw_lifecycles(sizes, substream(seed, "lifecycles"))
    accounts, securities = customers.accounts, market.securities
    book = build_trades(life, accounts.valid_from_day, accounts.valid_to_day,
                        accounts.account_ids, securities.symbols, securities.valid_from_day,
                        securities.valid_to_day, brokers.ids, substream(seed, "trades"))
    lines = trade_lines(book)
    incremental, injected = inject_bad_rows(
        lines.incremental, bad_rows,
        Context(life.n, securities.symbols, accounts.account_ids, brokers.ids),
        substream(seed, "bad_rows"))
    files.append(write_lines(root, "Batch1/Trade.txt", lines.batch1))
    files.append(write_lines(root, "Batch1/TradeHistory.txt", lines.history))
    for batch, batch_lines in incremental.items():
        files.append(write_lines(root, f"Batch{batch}/Trade.txt", batch_lines))
    files.append(write_manifest(root, injected, sizes.scale_factor, seed))
    step(5)
    files += write_audits(root, sizes, len(brokers.ids), finwire, customers,
                          lines.counts, lines.history_counts)
    if progress is not None:
        progress("done", len(STEPS), len(STEPS))
    return GenerationReport(root, sizes.scale_factor, seed, len(injected),
                            tuple(sorted(files, key=lambda f: f.path)), lines.counts,
                            time.perf_counter() - started)
