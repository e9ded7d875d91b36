"""The five stored procedures of streaming DimTrade (S-Store's split, docs/tpcdi.md rules).

    trade_lines ─SP1 parse─▶ trade_events ─SP2 status/type, date/time keys─▶ trades_timed
      ─SP3 security and company keys─▶ trades_secured ─SP4 account, customer, broker keys─▶
      trades_keyed ─SP5 alerts and DimTrade upsert─▶ dimtrade_changes, dimessages_out,
                                                   trade_rejects

Each procedure is one set-oriented statement (SP5: a few) over the whole batch. A row that
fails a step keeps flowing with its ``reason`` and leaves through ``trade_rejects``: nothing is
dropped silently. Dimension lookups read DuckDB copies of the warehouse dimensions
(``statustype``, ``tradetype``, ``dimsecurity``, ``dimaccount``), replicated from PostgreSQL.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from sstore.engine import Engine
from sstore.transaction import Transaction
from sstore.workloads.tpcdi.streaming.events import LINE_SCHEMA
from sstore.workloads.tpcdi.streaming.parse import EVENT_COLUMNS, PARSE_SQL

TIMED = {**EVENT_COLUMNS, "status": "VARCHAR", "type": "VARCHAR",
         "sk_createdateid": "BIGINT", "sk_createtimeid": "BIGINT",
         "sk_closedateid": "BIGINT", "sk_closetimeid": "BIGINT"}
SECURED = {**TIMED, "sk_securityid": "BIGINT", "sk_companyid": "BIGINT"}
KEYED = {**SECURED, "sk_accountid": "BIGINT", "sk_customerid": "BIGINT", "sk_brokerid": "BIGINT"}

DIMTRADE = {"tradeid": "BIGINT", "sk_brokerid": "BIGINT", "sk_createdateid": "BIGINT",
            "sk_createtimeid": "BIGINT", "sk_closedateid": "BIGINT", "sk_closetimeid": "BIGINT",
            "status": "VARCHAR", "type": "VARCHAR", "cashflag": "BOOLEAN",
            "sk_securityid": "BIGINT", "sk_companyid": "BIGINT", "quantity": "INTEGER",
            "bidprice": "DECIMAL(8,2)", "sk_customerid": "BIGINT", "sk_accountid": "BIGINT",
            "executedby": "VARCHAR", "tradeprice": "DECIMAL(8,2)", "fee": "DECIMAL(10,2)",
            "commission": "DECIMAL(10,2)", "tax": "DECIMAL(10,2)", "batchid": "INTEGER"}
DIMESSAGES = {"messagedateandtime": "TIMESTAMP", "batchid": "INTEGER", "messagesource": "VARCHAR",
              "messagetext": "VARCHAR", "messagetype": "VARCHAR", "messagedata": "VARCHAR"}
REJECTS = {"source_file": "VARCHAR", "batch_id": "INTEGER", "line_number": "BIGINT",
           "raw_line": "VARCHAR", "reason": "VARCHAR"}

#: The dimension copies the lookups read, with the columns they need.
LOOKUPS = {
    "statustype": "st_id, st_name",
    "tradetype": "tt_id, tt_name",
    "dimsecurity": "sk_securityid, sk_companyid, symbol, effectivedate, enddate, iscurrent",
    "dimaccount": "sk_accountid, sk_customerid, sk_brokerid, accountid, effectivedate, enddate, "
                  "iscurrent",
}

TIMED_SQL = """
SELECT e.* REPLACE (coalesce(e.reason,
           CASE WHEN st.st_id IS NULL THEN 'unknown status ' || e.t_st_id
                WHEN tt.tt_id IS NULL THEN 'unknown trade type ' || e.t_tt_id END) AS reason),
       st.st_name AS status, tt.tt_name AS type,
       CASE WHEN e.cdc_flag = 'I' THEN strftime(e.t_dts, '%Y%m%d')::BIGINT END
           AS sk_createdateid,
       CASE WHEN e.cdc_flag = 'I' THEN strftime(e.t_dts, '%H%M%S')::BIGINT END
           AS sk_createtimeid,
       CASE WHEN e.t_st_id IN ('CMPT', 'CNCL') THEN strftime(e.t_dts, '%Y%m%d')::BIGINT END
           AS sk_closedateid,
       CASE WHEN e.t_st_id IN ('CMPT', 'CNCL') THEN strftime(e.t_dts, '%H%M%S')::BIGINT END
           AS sk_closetimeid
FROM batch e LEFT JOIN statustype st ON st.st_id = e.t_st_id
             LEFT JOIN tradetype tt ON tt.tt_id = e.t_tt_id
ORDER BY e.line_no
"""

def lookup_sql(dimension: str, natural_key: str, event_column: str, keys: tuple[str, ...],
               what: str) -> str:
    """One slowly-changing lookup for new trades (docs/tpcdi.md rule 2): Batch1 takes the
    version valid on the create date, later batches the current version; no match is a reject.
    Only names defined in this module reach the SQL text."""
    picked = ", ".join(f"x.{k}" for k in keys)
    return f"""
SELECT e.* REPLACE (coalesce(e.reason, CASE WHEN e.cdc_flag = 'I' AND x.{keys[0]} IS NULL
                                           THEN 'unknown {what} ' || e.{event_column} END)
                    AS reason),
       {picked}
FROM batch e LEFT JOIN {dimension} x
  ON e.cdc_flag = 'I' AND e.reason IS NULL AND x.{natural_key} = e.{event_column}
 AND CASE WHEN e.tpcdi_batch = 1
          THEN x.effectivedate <= e.t_dts::DATE AND e.t_dts::DATE < x.enddate
          ELSE x.iscurrent END
ORDER BY e.line_no
"""


SECURED_SQL = lookup_sql("dimsecurity", "symbol", "t_s_symb", ("sk_securityid", "sk_companyid"),
                         "symbol")
KEYED_SQL = lookup_sql("dimaccount", "accountid", "t_ca_id",
                       ("sk_accountid", "sk_customerid", "sk_brokerid"), "account")

# The rows SP5 applies: fine so far, and an insert or an update of a trade that exists (in the
# state or inserted by this very batch).
ACCEPTED_SQL = """
SELECT b.*, b.reason IS NULL AND (b.cdc_flag = 'I'
        OR EXISTS (SELECT 1 FROM dimtrade d WHERE d.tradeid = b.t_id)
        OR EXISTS (SELECT 1 FROM batch i WHERE i.t_id = b.t_id AND i.cdc_flag = 'I'
                                          AND i.reason IS NULL)) AS accepted
FROM batch b ORDER BY b.line_no
"""

# One row per trade: create-time fields from its insert, everything else from its last event.
UPSERT_SQL = """
INSERT INTO dimtrade AS d
SELECT t_id,
       max(sk_brokerid) FILTER (cdc_flag = 'I'), max(sk_createdateid) FILTER (cdc_flag = 'I'),
       max(sk_createtimeid) FILTER (cdc_flag = 'I'),
       arg_max(sk_closedateid, cdc_dsn) FILTER (sk_closedateid IS NOT NULL),
       arg_max(sk_closetimeid, cdc_dsn) FILTER (sk_closetimeid IS NOT NULL),
       arg_max(status, cdc_dsn), arg_max(type, cdc_dsn),
       bool_or(t_is_cash) FILTER (cdc_flag = 'I'),
       max(sk_securityid) FILTER (cdc_flag = 'I'), max(sk_companyid) FILTER (cdc_flag = 'I'),
       max(t_qty) FILTER (cdc_flag = 'I'), max(t_bid_price) FILTER (cdc_flag = 'I'),
       max(sk_customerid) FILTER (cdc_flag = 'I'), max(sk_accountid) FILTER (cdc_flag = 'I'),
       max(t_exec_name) FILTER (cdc_flag = 'I'),
       arg_max_null(t_trade_price, cdc_dsn), arg_max_null(t_chrg, cdc_dsn),
       arg_max_null(t_comm, cdc_dsn), arg_max_null(t_tax, cdc_dsn), arg_max(tpcdi_batch, cdc_dsn)
FROM applied GROUP BY t_id
ON CONFLICT (tradeid) DO UPDATE SET
    sk_closedateid = coalesce(excluded.sk_closedateid, d.sk_closedateid),
    sk_closetimeid = coalesce(excluded.sk_closetimeid, d.sk_closetimeid),
    status = excluded.status, type = excluded.type, tradeprice = excluded.tradeprice,
    fee = excluded.fee, commission = excluded.commission, tax = excluded.tax,
    batchid = excluded.batchid
"""

ALERTS_SQL = """
SELECT t_dts AS messagedateandtime, tpcdi_batch AS batchid, 'DimTrade' AS messagesource,
       'Invalid trade commission' AS messagetext, 'Alert' AS messagetype,
       'T_ID = ' || t_id || ', T_COMM = ' || t_comm::VARCHAR AS messagedata
FROM applied WHERE t_comm > t_trade_price * t_qty
UNION ALL
SELECT t_dts, tpcdi_batch, 'DimTrade', 'Invalid trade fee', 'Alert',
       'T_ID = ' || t_id || ', T_CHRG = ' || t_chrg::VARCHAR
FROM applied WHERE t_chrg > t_trade_price * t_qty
"""


def declare(engine: Engine) -> None:
    """Declare the dataflow, its state table and the lookup copies' tables on ``engine``."""
    engine.stream("trade_lines", {f.name: _duck(f.type) for f in LINE_SCHEMA})
    engine.stream("trade_events", EVENT_COLUMNS)
    engine.stream("trades_timed", TIMED)
    engine.stream("trades_secured", SECURED)
    engine.stream("trades_keyed", KEYED)
    engine.stream("dimtrade_changes", DIMTRADE)
    engine.stream("dimessages_out", DIMESSAGES)
    engine.stream("trade_rejects", REJECTS)
    cols = ", ".join(f"{name} {sql_type}" for name, sql_type in DIMTRADE.items())
    engine.execute(f"CREATE TABLE IF NOT EXISTS dimtrade ({cols}, PRIMARY KEY (tradeid))")

    @engine.procedure(input="trade_lines", output="trade_events")
    def parse_trades(tx: Transaction, batch: pa.Table) -> pa.Table:
        """SP1: split and type each line; malformed lines get a reason."""
        return tx.sql(PARSE_SQL)

    @engine.procedure(input="trade_events", output="trades_timed")
    def resolve_status_and_times(tx: Transaction, batch: pa.Table) -> pa.Table:
        """SP2: status and type names; create and close date/time keys."""
        return tx.sql(TIMED_SQL)

    @engine.procedure(input="trades_timed", output="trades_secured")
    def resolve_security(tx: Transaction, batch: pa.Table) -> pa.Table:
        """SP3: security and company keys of new trades, by symbol."""
        return tx.sql(SECURED_SQL)

    @engine.procedure(input="trades_secured", output="trades_keyed")
    def resolve_account(tx: Transaction, batch: pa.Table) -> pa.Table:
        """SP4: account, customer and broker keys of new trades, by account."""
        return tx.sql(KEYED_SQL)

    @engine.procedure(input="trades_keyed",
                      output=("dimtrade_changes", "dimessages_out", "trade_rejects"))
    def apply_dimtrade(tx: Transaction, batch: pa.Table) -> dict[str, pa.Table]:
        """SP5: alerts, DimTrade upsert, the changed rows and the rejects of the batch."""
        judged = tx.sql(ACCEPTED_SQL)
        ok = judged["accepted"]
        applied = judged.filter(ok).drop_columns(["accepted"])
        rejected = judged.filter(pc.invert(ok))
        tx.register("applied", applied)
        if applied.num_rows:
            tx.execute(UPSERT_SQL)
        changed = tx.sql("SELECT d.* FROM dimtrade d SEMI JOIN applied a ON a.t_id = d.tradeid")
        alerts = tx.sql(ALERTS_SQL)
        reasons = pc.if_else(pc.is_null(rejected["reason"]),
                             pa.scalar("unknown trade (update before any insert)"),
                             rejected["reason"])
        rejects = pa.table({"source_file": rejected["source"],
                            "batch_id": rejected["tpcdi_batch"],
                            "line_number": rejected["line_no"], "raw_line": rejected["line"],
                            "reason": reasons})
        return {"dimtrade_changes": changed, "dimessages_out": alerts, "trade_rejects": rejects}


def _duck(arrow_type: pa.DataType) -> str:
    return {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.int32(): "INTEGER"}[arrow_type]
