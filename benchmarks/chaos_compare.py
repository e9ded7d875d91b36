"""Is the chaos warehouse the reference's, row for row?

Each DimTrade output table is compared as a multiset of rows over its columns (``rejects``
without ``reject_id`` and ``rejected_at``, which PostgreSQL fills in at load time), two ways:

- a fingerprint: ``count(*)`` and the md5 of every row as text, sorted (cheap, one number);
- the rows themselves, counted: ``lost`` rows of the reference the chaos warehouse lacks (with
  multiplicity), ``duplicates`` extra copies of reference rows, ``unexpected`` rows the
  reference does not have at all (a DimTrade row with another status, say: that is a lost row
  and an unexpected one). Their keys are listed, so a difference names the trades it hit.

A warehouse is identical when, for every table, the fingerprints match and nothing is lost,
duplicated or unexpected.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg

from sstore.base.sql import ident

#: table -> the columns that name a row in reports
KEYS = {"dimtrade": ("tradeid",), "dimessages": ("batchid", "messagetext", "messagedata"),
        "rejects": ("batch_id", "line_number", "reason")}
NOT_COMPARED = {"rejects": ("reject_id", "rejected_at")}
LISTED = 50  # keys listed per kind of difference (the counts are always complete)


@dataclass
class TableDiff:
    table: str
    reference_rows: int
    chaos_rows: int
    lost: int = 0
    duplicates: int = 0
    unexpected: int = 0
    lost_keys: list[Any] = field(default_factory=list)
    duplicate_keys: list[Any] = field(default_factory=list)
    unexpected_keys: list[Any] = field(default_factory=list)
    reference_md5: str = ""
    chaos_md5: str = ""

    @property
    def identical(self) -> bool:
        return (self.lost == self.duplicates == self.unexpected == 0
                and self.reference_rows == self.chaos_rows
                and self.reference_md5 == self.chaos_md5)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "identical": self.identical}


def diff_rows(table: str, key_positions: Sequence[int], reference: Sequence[tuple[Any, ...]],
              chaos: Sequence[tuple[Any, ...]]) -> TableDiff:
    """The multiset difference of two lists of rows (see the module docstring)."""
    want, got = Counter(reference), Counter(chaos)
    missing, extra = want - got, got - want
    diff = TableDiff(table, len(reference), len(chaos))
    diff.lost = sum(missing.values())
    diff.duplicates = sum(n for row, n in extra.items() if row in want)
    diff.unexpected = sum(n for row, n in extra.items() if row not in want)

    def keys(rows: Sequence[tuple[Any, ...]]) -> list[Any]:
        named = sorted({tuple(row[i] for i in key_positions) for row in rows},
                       key=lambda k: tuple((v is None, v if v is not None else 0) for v in k))
        shown = [tuple(str(v) for v in k) for k in named[:LISTED]]
        return [k[0] if len(k) == 1 else list(k) for k in shown]

    diff.lost_keys = keys(list(missing))
    diff.duplicate_keys = keys([row for row in extra if row in want])
    diff.unexpected_keys = keys([row for row in extra if row not in want])
    return diff


def compared_columns(con: psycopg.Connection, schema: str, table: str) -> list[str]:
    rows = con.execute("SELECT column_name FROM information_schema.columns WHERE "
                       "table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                       (schema, table)).fetchall()
    return [r[0] for r in rows if r[0] not in NOT_COMPARED.get(table, ())]


def fetch(con: psycopg.Connection, schema: str, table: str, columns: Sequence[str]
          ) -> tuple[list[tuple[Any, ...]], str]:
    """The rows (``columns`` of ``schema.table``) and their md5 fingerprint; no rows if the
    table does not exist."""
    exists = con.execute("SELECT to_regclass(%s) IS NOT NULL",
                         (f"{ident(schema)}.{ident(table)}",)).fetchone()
    if not exists or not exists[0]:
        return [], "(no table)"
    cols = ", ".join(ident(c) for c in columns)
    source = f"(SELECT {cols} FROM {ident(schema)}.{ident(table)}) r"
    rows = con.execute(f"SELECT {cols} FROM {source}").fetchall()
    md5 = con.execute(f"SELECT md5(coalesce(string_agg(r::text, E'\\n' ORDER BY r::text), ''))"
                      f" FROM {source}").fetchone()
    return rows, str(md5[0]) if md5 else ""


def compare_warehouses(url: str, reference_schema: str, chaos_schema: str,
                       tables: Sequence[str] = tuple(KEYS)) -> list[TableDiff]:
    """Compare every DimTrade output table of the two schemas (of one database)."""
    diffs = []
    with psycopg.connect(url, application_name="chaos-compare") as con:
        for table in tables:
            columns = compared_columns(con, reference_schema, table)
            if not columns:
                raise ValueError(f"the reference has no table {reference_schema}.{table}")
            ref_rows, ref_md5 = fetch(con, reference_schema, table, columns)
            got_rows, got_md5 = fetch(con, chaos_schema, table, columns)
            diff = diff_rows(table, [columns.index(k) for k in KEYS[table]], ref_rows,
                             got_rows)
            diff.reference_md5, diff.chaos_md5 = ref_md5, got_md5
            diffs.append(diff)
    return diffs
