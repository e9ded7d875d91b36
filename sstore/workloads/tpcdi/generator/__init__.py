"""TPC-DI source data for DimTrade, in DIGen's file layouts (DIGen itself may not be shipped).

``generate(scale_factor, output, seed)`` writes Batch1 (history up to 2017-07-07) and the
incremental Batch2 and Batch3 (2017-07-08, 2017-07-09): the reference files, HR.csv, the 203
FINWIRE files, CustomerMgmt.xml, Customer.txt/Account.txt, Trade.txt/TradeHistory.txt and the
audit CSVs, deterministically for a seed, in the layouts and with the rules of the shared
reference notes (tpcdi-source-layouts.md, tpcdi-dimtrade-notes.md). Modules, one job each:

- ``reference``: StatusType, TradeType, Date, Time, Industry, TaxRate, BatchDate
- ``hr``: HR.csv (brokers) - ``market`` + ``finwire``: companies, securities, FINWIRE records
- ``customer_history`` + ``customer_files``: CustomerMgmt.xml, Customer.txt, Account.txt
- ``lifecycles`` + ``trades``: trade states, amounts and the trade files
- ``badrows``: optional malformed rows and their manifest - ``audit``: the audit CSVs
"""

from __future__ import annotations

from .build import STEPS, generate
from .report import FileReport, GenerationReport, ProgressCallback, TradeCounts
from .scale import Sizes

__all__ = ["STEPS", "FileReport", "GenerationReport", "ProgressCallback", "Sizes",
           "TradeCounts", "generate"]
