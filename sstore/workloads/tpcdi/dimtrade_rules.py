"""The DimTrade rules of docs/tpcdi.md as data: the one definition the three engines read.

The engine's five procedures (``streaming.procedures``, DuckDB SQL), the Spark bulk pipeline
and the Spark Structured Streaming mode (``dimtrade_spark_rules``, Spark DataFrames) all
build DimTrade and DImessages from these definitions: which statuses close a trade, which
columns the creating event fixes and which every event sets, which alerts exist, and the
field layout of an event line (``streaming.parse.FIELDS``). Changing a rule here changes it
for every engine; the tests compare the engines' warehouses row for row.

Where the engines legitimately differ (how state and lookups are held, how a batch is cut),
``DIFFERENCES`` says so, one row per difference, instead of ``if`` branches spread over the
code: none of them changes a DimTrade or DImessages row.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Statuses that close a trade: their event sets SK_CloseDateID / SK_CloseTimeID (rule 3).
CLOSING: tuple[str, ...] = ("CMPT", "CNCL")

#: Columns set by the creating ``I`` event only and never changed afterwards (rule 2).
CREATED: tuple[str, ...] = (
    "sk_createdateid", "sk_createtimeid", "cashflag", "quantity", "bidprice", "executedby",
    "sk_securityid", "sk_companyid", "sk_accountid", "sk_customerid", "sk_brokerid")
#: Columns every applied event sets, the last event of a trade winning (rule 3).
EVERY: tuple[str, ...] = ("status", "type", "tradeprice", "fee", "commission", "tax")
#: Columns the last closing event sets; kept when no event of the batch closes the trade.
CLOSE: tuple[str, ...] = ("sk_closedateid", "sk_closetimeid")

#: Event field -> DimTrade column, for the fields copied as they are.
RENAMED: dict[str, str] = {
    "t_is_cash": "cashflag", "t_qty": "quantity", "t_bid_price": "bidprice",
    "t_exec_name": "executedby", "t_trade_price": "tradeprice", "t_chrg": "fee",
    "t_comm": "commission", "t_tax": "tax"}


@dataclass(frozen=True)
class Alert:
    """Rule 4: a DImessages row when event field ``field`` exceeds T_TRADE_PRICE * T_QTY."""

    field: str   # event column
    text: str    # MessageText
    label: str   # how MessageData names the field


ALERTS: tuple[Alert, ...] = (
    Alert("t_comm", "Invalid trade commission", "T_COMM"),
    Alert("t_chrg", "Invalid trade fee", "T_CHRG"),
)
MESSAGE_SOURCE = "DimTrade"
MESSAGE_TYPE = "Alert"


@dataclass(frozen=True)
class Difference:
    """One way the engines do a rule differently, and why the output stays the same."""

    aspect: str
    engine: str          # the engine's five procedures (DuckDB)
    spark_streaming: str  # Spark Structured Streaming, one micro-batch per file
    spark_bulk: str      # Spark bulk, one job per TPC-DI batch
    why_equal: str


DIFFERENCES: tuple[Difference, ...] = (
    Difference("unit of work", "an engine batch of N events", "a micro-batch (one file of N "
               "events)", "a whole TPC-DI batch",
               "events of a trade apply in CDC_DSN order within a unit, units in line order"),
    Difference("DimTrade state the rules read",
               "the engine's own DimTrade versions (append only; the view dimtrade)",
               "the micro-batch's trades read back from PostgreSQL over JDBC",
               "the batch's trades read back from PostgreSQL over JDBC (none for Batch1)",
               "every unit is in PostgreSQL before the next one is computed"),
    Difference("dimension lookups", "DuckDB copies refreshed per TPC-DI batch",
               "JDBC reads cached per TPC-DI batch", "JDBC reads per TPC-DI batch",
               "Batch1 picks the version valid on the create date, later batches the current"),
    Difference("reject reasons (text)", "'unknown status X', 'unknown symbol X', ...",
               "'unknown T_ST_ID ''X''', 'no DimSecurity row for ...', ...",
               "the rules' reasons as Spark Structured Streaming; parse reasons from the "
               "bulk readers (``dimtrade_spark_events``)",
               "the same lines are rejected; only the wording of the reason differs"),
    Difference("exactly once", "engine batch-id in the watermark (continuous sink)",
               "Spark's batchId in the watermark, per checkpoint",
               "TPC-DI batch number in the watermark",
               "all through migrators.delivery: rows and watermark in one transaction"),
)
