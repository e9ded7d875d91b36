"""SP1's SQL: parse incremental-Trade.txt lines, typed, with a reason for every bad line.

The fields are one declarative table; the SQL is generated from it once. Every row keeps its
raw line, source, line number and batch, and gets ``reason`` (NULL when it parsed), so a bad
row travels on to the end of the dataflow and lands in the reject table instead of vanishing.
"""

from __future__ import annotations

from dataclasses import dataclass

from sstore.base.sql import ident, literal


@dataclass(frozen=True)
class Field:
    name: str
    sql_type: str  # DuckDB type of the parsed column
    required: bool
    parse: str  # how: "text", "int", "decimal", "timestamp", "flag", "bool01"


FIELDS: tuple[Field, ...] = (
    Field("cdc_flag", "VARCHAR", True, "flag"),
    Field("cdc_dsn", "BIGINT", True, "int"),
    Field("t_id", "BIGINT", True, "int"),
    Field("t_dts", "TIMESTAMP", True, "timestamp"),
    Field("t_st_id", "VARCHAR", True, "text"),
    Field("t_tt_id", "VARCHAR", True, "text"),
    Field("t_is_cash", "BOOLEAN", True, "bool01"),
    Field("t_s_symb", "VARCHAR", True, "text"),
    Field("t_qty", "INTEGER", True, "int"),
    Field("t_bid_price", "DECIMAL(8,2)", True, "decimal"),
    Field("t_ca_id", "BIGINT", True, "int"),
    Field("t_exec_name", "VARCHAR", False, "text"),
    Field("t_trade_price", "DECIMAL(8,2)", False, "decimal"),
    Field("t_chrg", "DECIMAL(10,2)", False, "decimal"),
    Field("t_comm", "DECIMAL(10,2)", False, "decimal"),
    Field("t_tax", "DECIMAL(10,2)", False, "decimal"),
)

#: Columns every stream of the dataflow carries to the end: where the row came from and why
#: it was rejected (NULL while it is fine).
ORIGIN = {"tpcdi_batch": "INTEGER", "source": "VARCHAR", "line_no": "BIGINT",
          "line": "VARCHAR", "reason": "VARCHAR"}

EVENT_COLUMNS: dict[str, str] = {**{f.name: f.sql_type for f in FIELDS}, **ORIGIN}


def _raw(i: int) -> str:
    """Field ``i``'s text, trimmed, NULL when empty: computed once per line (``r1`` ..)."""
    return f"r{i + 1}"


def _value(i: int, field: Field) -> str:
    raw = _raw(i)
    if field.parse == "timestamp":
        return f"try_strptime({raw}, '%Y-%m-%d %H:%M:%S')"
    if field.parse == "bool01":
        return f"CASE {raw} WHEN '1' THEN true WHEN '0' THEN false END"
    if field.parse in ("int", "decimal"):
        return f"TRY_CAST({raw} AS {field.sql_type})"
    if field.parse == "flag":
        return f"CASE WHEN {raw} IN ('I', 'U') THEN {raw} END"
    return raw


def _checks(i: int, field: Field) -> list[str]:
    """Why field ``i`` is bad, as CASE branches over the raw text and the typed column (each
    typed once, in the previous step)."""
    raw, label = _raw(i), field.name.upper()
    checks = []
    if field.required:
        checks.append(f"WHEN {raw} IS NULL THEN {literal(f'missing {label}')}")
    if field.parse != "text":  # a required field's NULL took the branch above
        present = "" if field.required else f"{raw} IS NOT NULL AND "
        checks.append(f"WHEN {present}{ident(field.name)} IS NULL THEN "
                      f"{literal(f'bad {label}: ')} || {raw}")
    return checks


def parse_sql() -> str:
    """One statement over the batch's lines: typed columns plus ``reason``.

    Three steps, each computing its expressions once per line (a field used by the value and
    by two checks used to be split, trimmed and cast up to four times): split the line, trim
    each field, type each field; the reason then only compares what is already computed."""
    n = len(FIELDS)
    raws = ",\n             ".join(f"nullif(trim(f[{i + 1}]), '') AS {_raw(i)}" for i in range(n))
    values = ",\n       ".join(f"CASE WHEN nf = {n} THEN {_value(i, fld)} END "
                               f"AS {ident(fld.name)}" for i, fld in enumerate(FIELDS))
    names = ", ".join(ident(fld.name) for fld in FIELDS)
    checks = "\n            ".join(c for i, fld in enumerate(FIELDS) for c in _checks(i, fld))
    return f"""
WITH split AS (SELECT tpcdi_batch, source, line_no, line, string_split(line, '|') AS f
               FROM batch),
     raw AS (SELECT tpcdi_batch, source, line_no, line, len(f) AS nf, {raws} FROM split),
     typed AS (SELECT *, {values} FROM raw)
SELECT {names},
       tpcdi_batch, source, line_no, line,
       CASE WHEN nf <> {n} THEN 'expected {n} fields, found ' || nf
            {checks}
       END AS reason
FROM typed
"""


PARSE_SQL = parse_sql()
