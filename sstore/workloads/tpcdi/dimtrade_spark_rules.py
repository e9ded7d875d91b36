"""The DimTrade rules of docs/tpcdi.md applied to one batch of trade events, set-oriented.

The rules are sequential ("apply the events in order"), but the only state an event depends on
is whether its trade exists when it comes, so one window per trade replays them exactly:

- an event is refused on its own (``reason`` already set; unknown status or type code; an
  ``I`` event whose symbol or account has no dimension row);
- of the others, the first ``I`` event of a trade that did not exist before the batch creates
  it; a ``U`` event applies if the trade existed before the batch or an earlier ``I`` event of
  the batch created it, else it is refused ("a U event for a trade that does not exist");
- an ``I`` event for a trade that exists by then is not refused (rule 5 does not list it): it
  acts by rule 3 only, like an update, and the create fields and SKs stay (rule 2: "never
  change afterwards"). The streaming pipeline's new version does the same;
- the applied events of a trade then fold into one row: the creating event gives the create
  SKs, the unchanging fields and the dimension SKs, the last event the status, type and
  amounts, the last CMPT/CNCL event the close SKs; what no event of the batch set keeps its
  value.

Rows are shaped exactly like ``<schema>.dimtrade`` and ``<schema>.dimessages``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sstore.workloads.tpcdi.dimtrade_rules import (
    ALERTS,
    CLOSE,
    CLOSING,
    CREATED,
    EVERY,
    MESSAGE_SOURCE,
    MESSAGE_TYPE,
    RENAMED,
)

DIMTRADE = pa.schema([
    ("tradeid", pa.int64()), ("sk_brokerid", pa.int64()), ("sk_createdateid", pa.int64()),
    ("sk_createtimeid", pa.int64()), ("sk_closedateid", pa.int64()),
    ("sk_closetimeid", pa.int64()), ("status", pa.string()), ("type", pa.string()),
    ("cashflag", pa.bool_()), ("sk_securityid", pa.int64()), ("sk_companyid", pa.int64()),
    ("quantity", pa.int32()), ("bidprice", pa.decimal128(8, 2)), ("sk_customerid", pa.int64()),
    ("sk_accountid", pa.int64()), ("executedby", pa.string()),
    ("tradeprice", pa.decimal128(8, 2)), ("fee", pa.decimal128(10, 2)),
    ("commission", pa.decimal128(10, 2)), ("tax", pa.decimal128(10, 2)),
    ("batchid", pa.int32())])
DIMESSAGES = pa.schema([
    ("messagedateandtime", pa.timestamp("us")), ("batchid", pa.int32()),
    ("messagesource", pa.string()), ("messagetext", pa.string()),
    ("messagetype", pa.string()), ("messagedata", pa.string())])
# The rule definitions shared with the engine (``dimtrade_rules``).
_CREATED, _EVERY, _CLOSE = CREATED, EVERY, CLOSE


@dataclass
class Dimensions:
    """What the lookups read: status and type names (code -> name); DimSecurity rows (symbol,
    sk_securityid, sk_companyid, effectivedate, enddate); DimAccount rows (accountid,
    sk_accountid, sk_customerid, sk_brokerid, effectivedate, enddate). ``current``: the rows
    are the current versions (Batch2/3) and match whatever the create date; else a row matches
    when EffectiveDate <= create date < EndDate."""

    status: dict[str, str]
    types: dict[str, str]
    securities: DataFrame
    accounts: DataFrame
    current: bool


def date_sk(ts: Column) -> Column:
    return (F.year(ts) * 10000 + F.month(ts) * 100 + F.dayofmonth(ts)).cast("long")


def time_sk(ts: Column) -> Column:
    return (F.hour(ts) * 10000 + F.minute(ts) * 100 + F.second(ts)).cast("long")


def _versions(dim: DataFrame, key: str, sk: str, current: bool) -> DataFrame:
    """The dimension's versions of each key, made disjoint so that a lookup matches at most one
    (a no-op on a well-built dimension): current rows, the latest (EffectiveDate, SK) per key;
    else per key and EffectiveDate the highest SK, ending where the next version starts."""
    if current:
        latest = Window.partitionBy(key).orderBy(F.col("effectivedate").desc(), F.col(sk).desc())
        return dim.withColumn("_rn", F.row_number().over(latest)).where("_rn = 1").drop("_rn")
    following = F.lead("effectivedate").over(Window.partitionBy(key).orderBy("effectivedate",
                                                                             sk))
    return (dim.withColumn("_next", following)
            .where(F.col("_next").isNull() | (F.col("_next") > F.col("effectivedate")))
            .withColumn("enddate", F.least("enddate", F.coalesce("_next", "enddate")))
            .drop("_next"))


def _lookup(events: DataFrame, dim: DataFrame, key: str, dim_key: str, current: bool,
            keep: tuple[str, ...]) -> DataFrame:
    """Left-join the I events to the dimension version they use (broadcast: dimensions are
    small next to the events). Current rows match whatever the create date."""
    p = f"_{dim_key}"
    d = _versions(dim, dim_key, keep[0], current).select(
        F.col(dim_key).alias(p), F.col("effectivedate").alias(f"{p}_eff"),
        F.col("enddate").alias(f"{p}_end"), *keep)
    cond = (F.col(key) == F.col(p)) & (F.col("cdc_flag") == "I") & F.col("reason").isNull()
    if not current:
        cond = cond & (F.col(f"{p}_eff") <= F.col("create_date")) & \
            (F.col("create_date") < F.col(f"{p}_end"))
    return events.join(F.broadcast(d), cond, "left")


def _name(names: dict[str, str], code: str) -> Column:
    """The name of a code (NULL if unknown), from a literal map: no join, no Spark job."""
    pairs = [F.lit(x) for kv in sorted(names.items()) for x in kv]
    return F.try_element_at(F.create_map(*pairs), F.col(code))


def evaluate(events: DataFrame, existing: DataFrame | None, dims: Dimensions) -> DataFrame:
    """Every event with its names, lookups, ``creates`` and ``applied`` flags and (if refused)
    ``reason``. ``existing``: the DimTrade rows of the batch's trades (None: there are none)."""
    status, type_ = _name(dims.status, "t_st_id"), _name(dims.types, "t_tt_id")
    ev = events.select(
        *[c for c in events.columns if c != "reason"], status.alias("status"),
        type_.alias("type"), F.to_date("t_dts").alias("create_date"),
        F.coalesce(F.col("reason"),
                   F.when(status.isNull(), F.format_string("unknown T_ST_ID '%s'", "t_st_id")),
                   F.when(type_.isNull(), F.format_string("unknown T_TT_ID '%s'", "t_tt_id")))
        .alias("reason"))
    ev = _lookup(ev, dims.securities, "t_s_symb", "symbol", dims.current,
                 ("sk_securityid", "sk_companyid"))
    ev = _lookup(ev, dims.accounts, "t_ca_id", "accountid", dims.current,
                 ("sk_accountid", "sk_customerid", "sk_brokerid"))
    when_ = "current" if dims.current else "valid on %s"
    on_date = () if dims.current else (F.col("create_date").cast("string"),)
    insert = (F.col("cdc_flag") == "I") & F.col("reason").isNull()
    reason = F.coalesce(
        F.col("reason"),
        F.when(insert & F.col("sk_securityid").isNull(), F.format_string(
            f"no DimSecurity row for T_S_SYMB '%s' {when_}", "t_s_symb", *on_date)),
        F.when(insert & F.col("sk_accountid").isNull(), F.format_string(
            f"no DimAccount row for T_CA_ID %d {when_}", "t_ca_id", *on_date)))
    if existing is None:
        existed = F.lit(False)
    else:
        before = existing.select(F.col("tradeid").alias("_old_id"))
        ev = ev.join(F.broadcast(before), F.col("t_id") == F.col("_old_id"), "left")
        existed = F.col("_old_id").isNotNull()
    ev = ev.withColumns({"reason": reason, "existed": existed})
    ok, is_i = F.col("reason").isNull(), F.col("cdc_flag") == "I"
    ev = ev.withColumn("created_at", F.min(F.when(ok & is_i, F.col("k"))).over(
        Window.partitionBy("t_id")))
    creates = ok & is_i & ~F.col("existed") & (F.col("k") == F.col("created_at"))
    exists_by_then = F.col("existed") | F.coalesce(F.col("created_at") < F.col("k"),
                                                   F.lit(False))
    applied = ok & (is_i | exists_by_then)
    return ev.select(
        *_KEPT, creates.alias("creates"), applied.alias("applied"),
        F.when(ok & ~applied, F.format_string("U event for trade %d, which does not exist",
                                              "t_id")).otherwise(F.col("reason")).alias("reason"))


# What the fold, the alerts and the rejects read of an evaluated event (the rest is dropped
# before the evaluation is cached).
_KEPT = ("eid", "k", "t_id", "t_dts", "t_st_id", "status", "type", "t_is_cash", "t_qty",
         "t_bid_price", "t_exec_name", "t_trade_price", "t_chrg", "t_comm", "t_tax",
         "sk_securityid", "sk_companyid", "sk_accountid", "sk_customerid", "sk_brokerid")


_RENAMED = RENAMED


def dimtrade_rows(evaluated: DataFrame, existing: DataFrame | None, batch_id: int
                  ) -> DataFrame:
    """The new state of every trade that an applied event touched (DimTrade's columns, plus
    ``existed``)."""
    ev = evaluated.where("applied").select(
        "t_id", "k", "creates", F.col("t_st_id").isin(*CLOSING).alias("closing"),
        date_sk(F.col("t_dts")).alias("sk_createdateid"),
        time_sk(F.col("t_dts")).alias("sk_createtimeid"), "status", "type",
        "sk_securityid", "sk_companyid", "sk_accountid", "sk_customerid", "sk_brokerid",
        *[F.col(source).alias(name) for source, name in _RENAMED.items()])
    rows = ev.groupBy("t_id").agg(
        F.max(F.when(F.col("creates"), F.struct("k", *_CREATED))).alias("ins"),
        F.max(F.struct("k", *_EVERY)).alias("last"),
        F.max(F.when(F.col("closing"), F.struct(
            "k", F.col("sk_createdateid").alias("sk_closedateid"),
            F.col("sk_createtimeid").alias("sk_closetimeid")))).alias("close"))
    types = {f.name: _spark_type(f.type) for f in DIMTRADE}
    if existing is None:
        old = {c: F.lit(None).cast(t) for c, t in types.items()}
    else:
        renamed = existing.select(*[F.col(c).alias(f"old_{c}") for c in existing.columns])
        rows = rows.join(F.broadcast(renamed), F.col("t_id") == F.col("old_tradeid"), "left")
        old = {c: F.col(f"old_{c}") for c in types}
    created, closed = F.col("ins").isNotNull(), F.col("close").isNotNull()
    values = {"tradeid": F.col("t_id"), "batchid": F.lit(batch_id)}
    values |= {c: F.when(created, F.col(f"ins.{c}")).otherwise(old[c]) for c in _CREATED}
    values |= {c: F.col(f"last.{c}") for c in _EVERY}
    values |= {c: F.when(closed, F.col(f"close.{c}")).otherwise(old[c]) for c in _CLOSE}
    return rows.select(*[values[c].cast(t).alias(c) for c, t in types.items()],
                       old["tradeid"].isNotNull().alias("existed"))


def alerts(evaluated: DataFrame, batch_id: int) -> DataFrame:
    """Rule 4: a DImessages row per applied event and invalid commission or fee."""
    gross = F.col("t_trade_price") * F.col("t_qty")
    parts = []
    for alert in ALERTS:
        column = alert.field
        parts.append(evaluated.where(F.col("applied") & (F.col(column) > gross)).select(
            F.col("t_dts").alias("messagedateandtime"), F.lit(batch_id).alias("batchid"),
            F.lit(MESSAGE_SOURCE).alias("messagesource"), F.lit(alert.text).alias("messagetext"),
            F.lit(MESSAGE_TYPE).alias("messagetype"),
            F.format_string(f"T_ID = %d, {alert.label} = %s", F.col("t_id"),
                            F.col(column).cast("decimal(10,2)").cast("string"))
            .alias("messagedata")))
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out


def _spark_type(type_: pa.DataType) -> str:
    if pa.types.is_decimal(type_):
        return f"decimal({type_.precision},{type_.scale})"
    return {pa.int64(): "long", pa.int32(): "int", pa.string(): "string",
            pa.bool_(): "boolean"}[type_]
