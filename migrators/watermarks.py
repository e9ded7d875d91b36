"""The watermark table ``sstore.watermarks``: its columns, the names a row is keyed on, and
every question asked of it outside a delivery.

One row per (source, stream, target) says which batches a target holds
(``migrators.delivery`` has the protocol that writes it, with the rows). This module and that
one are the only code that names the table in SQL
(``tests/migrators/test_watermark_owner.py``): how a row is matched to a table is decided here
once.

- the table's DDL and ``ensure_watermarks``, which adds the columns later releases added;
- a target's canonical name (``canonical_target``: ``x``, ``public.x`` and ``"public"."x"``
  are one watermark of one table) and the ``spellings`` an older sstore recorded it under;
- ``reset`` (``sstore migrate --reset``, refused while redelivered rows would double) and
  ``refuse_replaced_target`` (a table rebuilt under the name that holds rows);
- readers and upkeep: status, the polystore's probes and freshness checks, the maintenance
  report, dropping a warehouse (``EXISTS_SQL``, ``TARGET_ROWS``, ``watermark_of``,
  ``forget_targets``, ``move_statement``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from migrators.errors import (
    MigrationError,
    ResetRefused,
    TargetMissingError,
    TargetReplacedError,
)
from migrators.postgres import parse_name
from sstore.base.sql import ident, literal, qualified

WATERMARKS = "sstore.watermarks"
WATERMARK_DDL = (
    "CREATE SCHEMA IF NOT EXISTS sstore",
    """CREATE TABLE IF NOT EXISTS sstore.watermarks (
        source TEXT NOT NULL, stream TEXT NOT NULL, target TEXT NOT NULL,
        batch_id BIGINT NOT NULL DEFAULT 0, target_oid OID,
        rows_total BIGINT NOT NULL DEFAULT 0,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        merge_key TEXT, epoch BIGINT NOT NULL DEFAULT 0, writer TEXT, fingerprint TEXT,
        PRIMARY KEY (source, stream, target))""",
)
#: Added after the first release (``ensure_watermarks`` adds it to an older table): the key
#: columns of a writer that merges by key (NULL: it appends). A split object over the stream
#: and such a table cannot be a UNION ALL (``sstore.polystore.delivered``).
MERGE_KEY_DDL = "ALTER TABLE sstore.watermarks ADD COLUMN IF NOT EXISTS merge_key TEXT"
#: Added with fenced writers (issue 38): bumped by each writer that claims the row at its
#: start (``claim``) unless the row's ``writer`` is its own; a writer whose claim is older
#: finds it moved and writes nothing.
EPOCH_DDL = ("ALTER TABLE sstore.watermarks ADD COLUMN IF NOT EXISTS epoch BIGINT NOT NULL "
             "DEFAULT 0, ADD COLUMN IF NOT EXISTS writer TEXT")
#: Added with drift checks (issue 38): what the writer delivered, as its ``claim`` recorded
#: it (``migrators.drift``); NULL: a writer that records none
FINGERPRINT_DDL = "ALTER TABLE sstore.watermarks ADD COLUMN IF NOT EXISTS fingerprint TEXT"


@dataclass(frozen=True)
class Target:
    """A target resolved in PostgreSQL: its canonical ``name`` (``schema.table``) and the
    ``oid`` of the table under it (None: no such table yet)."""

    name: str
    oid: int | None
    current_schema: str | None


def canonical_target(cur: psycopg.Cursor, target: str) -> Target:
    """The one name a watermark is keyed on, whatever spelling ``target`` is (``x``,
    ``public.x``, ``"public"."x"``): the schema and name of the table PostgreSQL finds under
    it (a bare name through ``search_path``, as every statement of the writer would), else
    for a table not created yet the given schema or ``current_schema()``, the first schema
    of ``search_path``, where ``CREATE TABLE`` of a bare name puts it. Keyed on the
    spelling, ``x`` and ``public.x`` were two watermarks of one table, and the second
    delivered every batch again. One round trip, in the caller's transaction."""
    schema, name = parse_name(target)
    spelt = ".".join(ident(part) for part in ((schema, name) if schema is not None
                                             else (name,)))
    found = cur.execute(
        "SELECT (SELECT ARRAY[n.nspname::text, c.relname::text] FROM pg_class c JOIN "
        "pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)), "
        "to_regclass(%s)::oid, current_schema()::text", (spelt, spelt)).fetchone()
    assert found is not None
    parts, oid, current = found
    if parts is not None:
        return Target(f"{parts[0]}.{parts[1]}", int(oid), current)
    if schema is None:
        if current is None:
            raise TargetMissingError(
                f"table {target} does not exist and no schema of search_path exists to create "
                f"it in: name its schema (SCHEMA.TABLE)")
        schema = current
    return Target(f"{schema}.{name}", None, current)


def spellings(target: Target, given: str) -> list[str]:
    """The names an older sstore may have recorded the same table under: the canonical one,
    the spelling given now, and the bare name when the table's schema is the first of
    ``search_path`` (a bare name then named it)."""
    names = [target.name, given]
    schema, _dot, bare = target.name.partition(".")
    if schema == target.current_schema:
        names.append(bare)
    return list(dict.fromkeys(names))


def ensure_watermarks(con: psycopg.Connection) -> None:
    """Create ``sstore.watermarks`` if it is missing (own transaction, committed).

    A table left by an older sstore (without the source identity) is refused: its rows cannot
    be matched to a state file safely, and guessing is how rows get skipped. The table is
    looked for first: a sink starts often (each ``sstore migrate``), and the DDL of an existing
    table still takes locks and a commit."""
    columns = _watermark_columns(con)
    if not columns:
        try:
            for statement in WATERMARK_DDL:
                con.execute(statement)
            con.commit()
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject):
            con.rollback()  # a concurrent writer created it first
        columns = _watermark_columns(con)
    for column, ddl in (("merge_key", MERGE_KEY_DDL), ("epoch", EPOCH_DDL),
                        ("fingerprint", FINGERPRINT_DDL)):
        if columns and column not in columns and "stream" in columns:
            try:
                con.execute(ddl)
                con.commit()
            except (psycopg.errors.DuplicateColumn, psycopg.errors.UniqueViolation):
                con.rollback()  # a concurrent writer added it first
    if "stream" not in columns or "target_oid" not in columns:
        raise MigrationError(
            "sstore.watermarks was made by an older sstore (no source identity or target "
            "check); its rows cannot be matched to a state file safely. Rename it (ALTER TABLE "
            "sstore.watermarks RENAME TO watermarks_old) and load the targets again, into "
            "emptied tables")


def _watermark_columns(con: psycopg.Connection) -> set[str]:
    """The columns of ``sstore.watermarks`` (none: it does not exist); no transaction left.
    Asked of ``pg_attribute``: ``information_schema.columns`` took 2-3 ms here, a tenth of
    a sink's start."""
    columns = {r[0] for r in con.execute(
        "SELECT attname::text FROM pg_attribute WHERE attrelid = "
        "to_regclass('sstore.watermarks') AND attnum > 0 AND NOT attisdropped").fetchall()}
    con.rollback()
    return columns


def refuse_replaced_target(cur: psycopg.Cursor, stream: str, target: str,
                           delivered: int) -> None:
    """The table under ``target``'s name is not the one the watermark (at batch ``delivered``)
    was written for: ``TargetReplacedError`` if it holds rows. Taken for a table holding none
    of the stream's batches, a table rebuilt by copy (or restored) got every batch the
    engine still had again, and a split object counted them twice. Empty, it is refilled."""
    if not has_rows(cur, target):
        return
    raise TargetReplacedError(
        f"{target} is not the table the sink of stream {stream!r} delivered batches up to "
        f"{delivered} into (it was dropped and created again, or rebuilt under its name) and "
        f"it holds rows: which of the stream's batches they are cannot be known, so nothing "
        f"is delivered into it or counted from it. If it holds exactly the old table's rows "
        f"(rebuilt by copy), adopt it: UPDATE {WATERMARKS} SET target_oid = "
        f"to_regclass('{qualified(target)}')::oid WHERE stream = '{stream}' AND target = "
        f"'{target}'; otherwise empty it (TRUNCATE) and the engine delivers the batches it "
        f"still has again")


def reset(con: psycopg.Connection, stream: str, target: str,
          merge_key: Sequence[str] = ()) -> int:
    """Forget every source's watermark of ``stream`` in ``target`` (committed), under any
    spelling of its name (``_spellings``) or written for the table now under it; the rows
    in the target are left as they are. Returns the number of watermarks removed.

    What follows a reset delivers every batch the engine still has again, over the rows the
    target holds. ``merge_key``: the key columns the next delivery merges by (empty: it
    appends). A target holding rows is refused (``ResetRefused``, nothing forgotten) unless
    that delivery merges by a key the table has a primary key or unique constraint on:
    appended again, each row still there would be there twice (a user who deleted 1 of 9
    rows and reset got 17 rows, 9 distinct); merged without such a constraint, the delivery
    fails after the reset, and the next plain run appends from batch 0. The table is locked
    against writes until the reset commits, so no row lands between the check and it."""
    with con.cursor() as cur:
        found = canonical_target(cur, target)
        if found.oid is not None:
            _check_redeliverable(cur, found.name, found.oid, merge_key)
        cur.execute(f"DELETE FROM {WATERMARKS} WHERE stream = %s AND (target = ANY(%s) OR "
                    f"(%s::oid IS NOT NULL AND target_oid = %s))",
                    (stream, spellings(found, target), found.oid, found.oid))
        removed = cur.rowcount
    con.commit()
    return removed


def _check_redeliverable(cur: psycopg.Cursor, table: str, oid: int,
                         merge_key: Sequence[str]) -> None:
    """``reset``'s refusal: ``table`` (OID ``oid``) holds rows and the batches delivered again
    would not merge into them by ``merge_key``."""
    cur.execute(f"LOCK TABLE {qualified(table)} IN SHARE MODE")
    if not has_rows(cur, table):
        return
    if merge_key:
        if _unique_on(cur, oid, merge_key):
            return
        reason = (f"the next delivery merges by ({', '.join(merge_key)}), and {table} has no "
                  f"primary key or unique constraint on ({', '.join(merge_key)}): the merge "
                  f"would fail after the reset, and the next plain run would append every "
                  f"batch over the rows there")
    else:
        row = cur.execute(f"SELECT count(*) FROM {qualified(table)}").fetchone()
        reason = (f"it holds {row[0] if row else 0} row(s), and a reset delivers every batch "
                  f"the engine still has again: appended over them, each row still there "
                  f"would be there twice")
    raise ResetRefused(
        f"refusing to reset the sink of {table}: {reason}. Nothing was forgotten. To deliver "
        f"every batch again (rows deleted by hand put back): empty the table first "
        f"(TRUNCATE {table}), then reset; the engine must still hold every batch (sstore "
        f"status). Or reset a sink that merges by key (--mode merge --key COLUMNS, "
        f"StreamToPostgres(mode='merge', key=...)) into a table with a primary key or unique "
        f"constraint on those columns: it puts back what is missing and leaves the rest")


def _unique_on(cur: psycopg.Cursor, oid: int, columns: Sequence[str]) -> bool:
    """Whether table ``oid`` has a valid unique index (a primary key or unique constraint)
    on exactly ``columns``, in any order: the one ``INSERT ... ON CONFLICT`` needs."""
    row = cur.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = %s AND i.indisunique "
        "AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL AND "
        "i.indnkeyatts = cardinality(%s::text[]) AND (SELECT array_agg(a.attname::text) "
        "FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n) JOIN pg_attribute a "
        "ON a.attrelid = i.indrelid AND a.attnum = k.attnum WHERE k.n <= i.indnkeyatts) "
        "@> %s::text[])", (oid, list(columns), list(columns))).fetchone()
    return bool(row and row[0])


def has_rows(cur: psycopg.Cursor, target: str) -> bool:
    """Whether ``target`` holds any row (reads one at most)."""
    row = cur.execute(f"SELECT EXISTS (SELECT 1 FROM {qualified(target)})").fetchone()
    return row is not None and bool(row[0])



# ---------------------------------------------------------------- for readers and upkeep

#: A SQL expression, true when the watermark table exists (a reader may run before any sink).
EXISTS_SQL = f"to_regclass('{WATERMARKS}') IS NOT NULL"

#: The watermark rows of the sinks feeding one table, with four parameters
#: (``target_params``): rows under its name written for it (or before any table was), and
#: any row written for the table now under its name whatever spelling it was recorded under
#: (an older sstore recorded the target as the writer spelt it; ``lock`` adopts such rows at
#: the sink's next start, and until then the table is still the sink's).
TARGET_ROWS = ("((target IN (%s, %s) AND (target_oid IS NULL OR target_oid = to_regclass(%s))) "
               "OR target_oid = to_regclass(%s))")

#: (max batch, rows written, sinks) of one table's watermark rows (``TARGET_ROWS``): how far
#: a sink-fed table reaches; as one query, and as a text-array subquery for a larger question.
GROWTH_SQL = (f"SELECT max(batch_id), sum(rows_total), count(*) FROM {WATERMARKS} "
              f"WHERE {TARGET_ROWS}")
GROWTH_ARRAY_SQL = ("(SELECT ARRAY[max(batch_id)::text, sum(rows_total)::text, count(*)::text] "
                    f"FROM {WATERMARKS} WHERE {TARGET_ROWS})")
#: How many sinks write one table (``TARGET_ROWS``), as a subquery.
WRITERS_SQL = f"(SELECT count(*) FROM {WATERMARKS} WHERE {TARGET_ROWS})"

#: One stream's watermark rows in one table, as (source, batch_id, rows_total, updated_at,
#: whether the row was written for the table now under the name, merge_key) plus ``{rows}``
#: (an extra column or nothing); parameters: qualified name, stream, canonical name, bare
#: name (or canonical), qualified name, source, source (None: any source).
SINK_ROWS_SQL = ("SELECT source, batch_id, rows_total, updated_at, "
                 "coalesce(target_oid = to_regclass(%s)::oid, false), "
                 "to_jsonb(w) ->> 'merge_key'{rows} "  # to_jsonb: an older table has no column
                 f"FROM {WATERMARKS} w "
                 "WHERE stream = %s AND (target IN (%s, %s) OR "
                 "target_oid = to_regclass(%s)::oid) AND "
                 "(%s::text IS NULL OR source = %s) ORDER BY source")


def target_params(schema: str, name: str) -> tuple[str, str, str, str]:
    """The parameters of ``TARGET_ROWS`` for table ``schema.name``: its canonical name, the
    bare name an older sstore recorded a ``public`` table under, and its qualified name."""
    full = f"{schema}.{name}"
    return full, name if schema == "public" else full, qualified(full), qualified(full)


def exists(con: psycopg.Connection) -> bool:
    """Whether the watermark table exists (in the caller's transaction)."""
    row = con.execute(f"SELECT {EXISTS_SQL}").fetchone()
    return bool(row and row[0])


def watermark_of(con: psycopg.Connection, stream: str, target: str,
                 source: str | None = None) -> int | None:
    """Where the watermark of ``stream`` in ``target`` stands (found by the name given or by
    the table under it, any spelling): ``source``'s, or with None the most recently advanced
    of any source; None when there is none (or no watermark table). Reports only: a writer
    locks it (``lock``)."""
    if not exists(con):
        return None
    row = con.execute(
        f"SELECT batch_id FROM {WATERMARKS} WHERE stream = %s AND (target = %s OR target_oid "
        f"= to_regclass(%s)::oid) AND (source = %s OR %s::text IS NULL) "
        f"ORDER BY updated_at DESC, batch_id DESC LIMIT 1",
        (stream, target, qualified(target), source, source)).fetchone()
    return int(row[0]) if row else None


def rows_of(con: psycopg.Connection, target: str) -> frozenset[str]:
    """Every watermark row recorded under ``target`` as text (empty without the table):
    compared before and after, any change means a writer committed a delivery."""
    if not exists(con):
        return frozenset()
    rows = con.execute(f"SELECT w::text FROM {WATERMARKS} w WHERE target = %s",
                       (target,)).fetchall()
    return frozenset(r[0] for r in rows)


def lock_rows(con: psycopg.Connection, target: str) -> None:
    """Lock the watermark rows recorded under ``target`` (``FOR UPDATE``, in the caller's open
    transaction): every writer of that table waits until it ends (a fault harness)."""
    if exists(con):
        con.execute(f"SELECT 1 FROM {WATERMARKS} WHERE target = %s FOR UPDATE", (target,))


def forget_target(con: psycopg.Connection, target: str) -> int:
    """Forget every watermark recorded under the name ``target`` (in the caller's
    transaction), after the table was dropped on purpose: a watermark that outlived its table
    would skip every batch it names. Returns the rows removed. ``reset`` is the checked way
    for a table that stays."""
    if not exists(con):
        return 0
    return con.execute(f"DELETE FROM {WATERMARKS} WHERE target = %s", (target,)).rowcount


def forget_targets(con: psycopg.Connection, schema: str) -> int:
    """``forget_target`` for every table of ``schema`` (a warehouse schema dropped whole)."""
    if not exists(con):
        return 0
    return con.execute(f"DELETE FROM {WATERMARKS} WHERE split_part(target, '.', 1) = %s",
                       (schema,)).rowcount


def move_statement(source: str | None, stream: str, schema: str, name: str,
                   batch_id: int) -> str:
    """The one ``UPDATE`` a user runs by hand to say that the table now under
    ``schema.name`` holds ``stream``'s batches up to ``batch_id`` (restored from a backup):
    it matches the sink's row by ``source`` (None: any), the stream and the target under
    both spellings (a sink records ``public.orders``, an older sstore recorded a bare name
    bare), and sets ``rows_total`` to the table's count (a watermark that counts no rows
    would not notice the table emptied later). Literal text, for a message."""
    full = qualified(f"{schema}.{name}")
    names = [f"{schema}.{name}", *([name] if schema == "public" else [])]
    where = [f"stream = {literal(stream)}",
             f"target IN ({', '.join(literal(n) for n in names)})"]
    if source is not None:
        where.insert(0, f"source = {literal(source)}")
    return (f"UPDATE {WATERMARKS} SET batch_id = {int(batch_id)}, target_oid = "
            f"to_regclass({literal(full)})::oid, rows_total = (SELECT count(*) FROM {full}) "
            f"WHERE {' AND '.join(where)}")
