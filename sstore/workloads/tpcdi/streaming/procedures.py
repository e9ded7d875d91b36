"""The five stored procedures of streaming DimTrade (S-Store's split, docs/tpcdi.md rules).

    trade_lines ─SP1 parse─▶ trade_events ─SP2 status/type, date/time keys─▶ trades_timed
      ─SP3 security and company keys─▶ trades_secured ─SP4 account, customer, broker keys─▶
      trades_keyed ─SP5 alerts and DimTrade versions─▶ dimtrade_changes, dimessages_out,
                                                   trade_rejects

Each procedure is one set-oriented statement over the whole batch (SP5: a second one only for
the rare batch with alerts), as each statement costs its planning time. A row that fails a step
keeps flowing with its ``reason`` and leaves through ``trade_rejects``: nothing is dropped
silently. Dimension lookups read DuckDB copies of the warehouse dimensions
(``statustype``, ``tradetype``, ``dimsecurity``, ``dimaccount``), replicated from PostgreSQL.
DimTrade's state is append only: ``dimtrade_versions`` holds every version of every trade (the
engine batch that wrote it in ``version``) and the view ``dimtrade`` the current ones (see
``APPEND_SQL`` for why).
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from sstore.base.sql import ident, literal
from sstore.engine import Engine
from sstore.execution.transaction import Transaction
from sstore.workloads.tpcdi.dimtrade_rules import (
    ALERTS,
    CLOSING,
    MESSAGE_SOURCE,
    MESSAGE_TYPE,
)
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

_CLOSING = ", ".join(literal(c) for c in CLOSING)
TIMED_SQL = """
SELECT e.* REPLACE (coalesce(e.reason,
           CASE WHEN st.st_id IS NULL THEN 'unknown status ' || e.t_st_id
                WHEN tt.tt_id IS NULL THEN 'unknown trade type ' || e.t_tt_id END) AS reason),
       st.st_name AS status, tt.tt_name AS type,
       CASE WHEN e.cdc_flag = 'I' THEN strftime(e.t_dts, '%Y%m%d')::BIGINT END
           AS sk_createdateid,
       CASE WHEN e.cdc_flag = 'I' THEN strftime(e.t_dts, '%H%M%S')::BIGINT END
           AS sk_createtimeid,
       CASE WHEN e.t_st_id IN ({closing}) THEN strftime(e.t_dts, '%Y%m%d')::BIGINT END
           AS sk_closedateid,
       CASE WHEN e.t_st_id IN ({closing}) THEN strftime(e.t_dts, '%H%M%S')::BIGINT END
           AS sk_closetimeid
FROM batch e LEFT JOIN statustype st ON st.st_id = e.t_st_id
             LEFT JOIN tradetype tt ON tt.tt_id = e.t_tt_id
""".replace("{closing}", _CLOSING)


def lookup_sql(dimension: str, natural_key: str, event_column: str, keys: tuple[str, ...],
               what: str, ordered: bool = False) -> str:
    """One slowly-changing lookup for new trades (docs/tpcdi.md rule 2): Batch1 takes the
    version valid on the create date, later batches the current version; no match is a reject.
    Only names defined in this module reach the SQL text. ``ordered``: rows in line order."""
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
{"ORDER BY e.line_no" if ordered else ""}
"""


SECURED_SQL = lookup_sql("dimsecurity", "symbol", "t_s_symb", ("sk_securityid", "sk_companyid"),
                         "symbol")
# Only the last step orders its rows (by line): inside the chained statement the earlier
# steps' ORDER BY sorted rows that the next join shuffles again (1-1.5 ms per 251-line batch).
KEYED_SQL = lookup_sql("dimaccount", "accountid", "t_ca_id",
                       ("sk_accountid", "sk_customerid", "sk_brokerid"), "account", ordered=True)

#: What a batch says about each of its trades: one row per trade (create-time fields from its
#: insert, everything else from its last event), over the rows fine so far; ``inserts``: the
#: batch creates the trade.
TRADE_CHANGES_SQL = """
SELECT t_id AS tradeid,
       max(sk_brokerid) FILTER (cdc_flag = 'I') AS sk_brokerid,
       max(sk_createdateid) FILTER (cdc_flag = 'I') AS sk_createdateid,
       max(sk_createtimeid) FILTER (cdc_flag = 'I') AS sk_createtimeid,
       arg_max(sk_closedateid, cdc_dsn) FILTER (sk_closedateid IS NOT NULL) AS sk_closedateid,
       arg_max(sk_closetimeid, cdc_dsn) FILTER (sk_closetimeid IS NOT NULL) AS sk_closetimeid,
       arg_max(status, cdc_dsn) AS status, arg_max(type, cdc_dsn) AS type,
       bool_or(t_is_cash) FILTER (cdc_flag = 'I') AS cashflag,
       max(sk_securityid) FILTER (cdc_flag = 'I') AS sk_securityid,
       max(sk_companyid) FILTER (cdc_flag = 'I') AS sk_companyid,
       max(t_qty) FILTER (cdc_flag = 'I') AS quantity,
       max(t_bid_price) FILTER (cdc_flag = 'I') AS bidprice,
       max(sk_customerid) FILTER (cdc_flag = 'I') AS sk_customerid,
       max(sk_accountid) FILTER (cdc_flag = 'I') AS sk_accountid,
       max(t_exec_name) FILTER (cdc_flag = 'I') AS executedby,
       arg_max_null(t_trade_price, cdc_dsn) AS tradeprice,
       arg_max_null(t_chrg, cdc_dsn) AS fee, arg_max_null(t_comm, cdc_dsn) AS commission,
       arg_max_null(t_tax, cdc_dsn) AS tax, arg_max(tpcdi_batch, cdc_dsn) AS batchid,
       bool_or(cdc_flag = 'I') AS inserts
FROM batch WHERE reason IS NULL GROUP BY t_id"""

#: What an update of an existing trade takes from the batch (rule 3); every other column keeps
#: the trade's current version.
UPDATED = {"sk_closedateid": "coalesce(s.sk_closedateid, o.sk_closedateid)",
           "sk_closetimeid": "coalesce(s.sk_closetimeid, o.sk_closetimeid)",
           **{c: f"s.{c}" for c in ("status", "type", "tradeprice", "fee", "commission", "tax",
                                     "batchid")}}


def _new_version(column: str) -> str:
    return (f"CASE WHEN o.tradeid IS NULL THEN s.{column} "
            f"ELSE {UPDATED.get(column, 'o.' + column)} END AS {column}")


# DimTrade is kept as the versions of its rows (``dimtrade_versions``, append only; the view
# ``dimtrade`` shows each trade's current one), and SP5 is ONE statement: it reads the current
# version of the batch's trades, appends a new version of each trade the batch changes (an
# update of an existing trade, or a trade the batch inserts; an update of a trade that is
# neither stays out) and returns them. A row of the batch was applied exactly when its trade
# came back. Why versions and not a MERGE in place: a batch updates ~550 trades created up to
# 90 days before, so at SF 10 its updates touch ten times as many of DuckDB's vectors as at
# SF 1, and an in-place update (plus RETURNING's one-by-one fetch of the updated rows, plus the
# primary key's index) cost SP5 +34% from SF 1 to SF 10; appending costs the same at any scale
# (+12%), and less at SF 1 too (docs/tpcdi.md, "DimTrade as versions"). The current versions
# are found by a join that DuckDB prunes with the batch's trade ids (zone maps: versions are
# appended in time order, so only the last ~90 days' row groups are read). ``$1``: the version
# to write, the engine batch's id (increasing).
APPEND_SQL = """
INSERT INTO dimtrade_versions
WITH s AS ({changes}),
o AS (SELECT d.* FROM dimtrade_versions d WHERE d.tradeid IN (SELECT tradeid FROM s)
      QUALIFY row_number() OVER (PARTITION BY d.tradeid ORDER BY d.version DESC) = 1)
SELECT {values}, $1 AS version
FROM s LEFT JOIN o ON o.tradeid = s.tradeid
WHERE o.tradeid IS NOT NULL OR s.inserts
RETURNING {columns}
""".format(changes=TRADE_CHANGES_SQL, values=", ".join(_new_version(c) for c in DIMTRADE),
           columns=", ".join(DIMTRADE))

#: The state table of DimTrade's versions and the view of its current rows (``version``: the
#: engine batch that wrote the row; 0 for rows seeded from the warehouse).
DIMTRADE_VERSIONS_DDL = "CREATE TABLE IF NOT EXISTS dimtrade_versions ({columns}, " \
    "version BIGINT NOT NULL DEFAULT 0)".format(
        columns=", ".join(f"{name} {sql_type}" for name, sql_type in DIMTRADE.items()))
DIMTRADE_VIEW_DDL = ("CREATE VIEW IF NOT EXISTS dimtrade AS SELECT * EXCLUDE (version) "
                     "FROM dimtrade_versions QUALIFY row_number() OVER "
                     "(PARTITION BY tradeid ORDER BY version DESC) = 1")


def alerts_sql() -> str:
    """Rule 4 over the ``applied`` rows, one SELECT per alert of ``dimtrade_rules.ALERTS``
    (the table the Spark pipelines read too)."""
    selects = []
    for alert in ALERTS:
        column = ident(alert.field)
        selects.append(
            f"SELECT t_dts AS messagedateandtime, tpcdi_batch AS batchid, "
            f"{literal(MESSAGE_SOURCE)} AS messagesource, {literal(alert.text)} AS messagetext, "
            f"{literal(MESSAGE_TYPE)} AS messagetype,\n"
            f"       'T_ID = ' || t_id || {literal(', ' + alert.label + ' = ')} || "
            f"{column}::VARCHAR AS messagedata\n"
            f"FROM applied WHERE {column} > t_trade_price * t_qty")
    return "\n".join(selects[:1] + [f"UNION ALL\n{s}" for s in selects[1:]]) + "\n"


ALERTS_SQL = alerts_sql()


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
    engine.execute(DIMTRADE_VERSIONS_DDL)
    upgrade_dimtrade_table(engine)
    engine.execute(DIMTRADE_VIEW_DDL)

    # SP1-SP4 are one SELECT each: the engine chains them into one statement per batch
    # (sstore.dataflow.fusion), as the hand-written reference writes them by hand
    engine.sql_procedure("parse_trades", PARSE_SQL, input="trade_lines", output="trade_events",
                         doc="SP1: split and type each line; malformed lines get a reason.")
    engine.sql_procedure("resolve_status_and_times", TIMED_SQL, input="trade_events",
                         output="trades_timed",
                         doc="SP2: status and type names; create and close date/time keys.")
    engine.sql_procedure("resolve_security", SECURED_SQL, input="trades_timed",
                         output="trades_secured",
                         doc="SP3: security and company keys of new trades, by symbol.")
    engine.sql_procedure("resolve_account", KEYED_SQL, input="trades_secured",
                         output="trades_keyed",
                         doc="SP4: account, customer and broker keys of new trades, by account.")

    @engine.procedure(input="trades_keyed",
                      output=("dimtrade_changes", "dimessages_out", "trade_rejects"))
    def apply_dimtrade(tx: Transaction, batch: pa.Table) -> dict[str, pa.Table]:
        """SP5: alerts, DimTrade's new versions, the changed rows and the rejects of the batch."""
        changed = tx.sql(APPEND_SQL, tx.batch_id)

        def alerts_of(applied: pa.Table) -> pa.Table:
            tx.register("applied", applied)
            return tx.sql(ALERTS_SQL)

        alerts, rejects = merge_outcome(batch, changed, alerts_of)
        return {"dimtrade_changes": changed, "dimessages_out": alerts, "trade_rejects": rejects}


def upgrade_dimtrade_table(engine: Engine) -> int:
    """A state file from before DimTrade was kept as versions has a table ``dimtrade``: its
    rows become version 0 of ``dimtrade_versions`` and the table is dropped (for the view), in
    one transaction. Without this the view's ``CREATE`` would be skipped as a declaration
    already made, and SP5 would write versions that the old table never shows. Returns the
    rows moved (0: nothing to upgrade)."""
    with engine.lock:
        con = engine.connection
        found = con.execute("SELECT table_type FROM information_schema.tables WHERE "
                            "table_catalog = current_database() AND table_schema = 'main' "
                            "AND table_name = 'dimtrade'").fetchall()
        if not found or found[0][0] != "BASE TABLE":
            return 0
        columns = ", ".join(DIMTRADE)
        con.begin()
        try:
            moved = con.execute(f"INSERT INTO dimtrade_versions ({columns}, version) "
                                f"SELECT {columns}, 0 FROM dimtrade").fetchall()[0][0]
            con.execute("DROP TABLE dimtrade")
            con.commit()
        except BaseException:
            con.rollback()
            raise
        return int(moved)


UNKNOWN_TRADE = "unknown trade (update before any insert)"


def merge_outcome(batch: pa.Table, changed: pa.Table,
                  alerts_of: Callable[[pa.Table], pa.Table]) -> tuple[pa.Table, pa.Table]:
    """SP5 after its append (``APPEND_SQL``): a row of ``batch`` was applied exactly when it
    had no reason and its trade came back in ``changed``. Returns (alerts, rejects):
    ``alerts_of(applied)`` runs ``ALERTS_SQL`` only when ``may_alert`` finds a candidate;
    every other row is a reject (an update of a trade that was never inserted, if it had no
    reason yet). Shared with the hand-written reference (``benchmarks.tpcdi_reference``) so
    both apply the same rules."""
    ok = pc.and_(pc.is_null(batch["reason"]),
                 pc.is_in(batch["t_id"], value_set=changed["tradeid"]))
    applied = batch.filter(ok)
    rejected = batch.filter(pc.invert(ok))
    alerts = alerts_of(applied) if may_alert(applied) else NO_ALERTS
    reasons = pc.if_else(pc.is_null(rejected["reason"]), pa.scalar(UNKNOWN_TRADE),
                         rejected["reason"])
    rejects = pa.table({"source_file": rejected["source"], "batch_id": rejected["tpcdi_batch"],
                        "line_number": rejected["line_no"], "raw_line": rejected["line"],
                        "reason": reasons})
    return alerts, rejects


def may_alert(applied: pa.Table) -> bool:
    """Whether ``ALERTS_SQL`` over these applied rows can return anything: some row's
    commission or fee exceeds trade price times quantity (exact decimal arithmetic, the test
    ALERTS_SQL makes). Few batches have an alert, so most skip that statement."""
    value = pc.multiply(applied["t_trade_price"],
                        applied["t_qty"].cast(pa.decimal128(10, 0)))
    suspects = [pc.greater(applied[alert.field], value) for alert in ALERTS]
    return any(bool(pc.any(s).as_py()) for s in suspects)


_ARROW = {"TIMESTAMP": pa.timestamp("us"), "INTEGER": pa.int32(), "VARCHAR": pa.string()}
#: What ``ALERTS_SQL`` returns for a batch without alerts.
NO_ALERTS = pa.table({name: pa.array([], _ARROW[sql_type])
                      for name, sql_type in DIMESSAGES.items()})


def _duck(arrow_type: pa.DataType) -> str:
    return {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.int32(): "INTEGER"}[arrow_type]
