"""Fail closed on silent drift: a sink refuses to start when what it delivers changed under it.

Each sink records, with its watermark (``sstore.watermarks.fingerprint``, written by
``delivery.claim`` at every start), a fingerprint of three things:

- its stream's **schema version** (``sstore.storage.evolution``: the version number and its
columns);
- its **query**: how it writes (mode, merge key, batch column);
- its target's **layout**: each column's name, type and position (``attnum``).

At the next start the stored fingerprint is compared with the present one (``check``). What is
allowed: the same; a stream that evolved from the version recorded (a recorded evolution leads
from it to the present one); target columns added or widened (by the sink following the
stream, ``migrators.follow``, or by hand: the columns are checked for the rows anyway). What is
an error (``DriftError``, terminal, nothing written), naming what changed:

- a stream whose version or columns differ without a recorded evolution from the ones
  delivered (a state file restored from an older copy, a stream recreated under its name);
- another mode, merge key or batch column than the rows already in the target were written
  with;
- a target column the sink delivered into that was dropped, or dropped and added again (the
  values it held are gone, while the watermark says they were delivered).

A target that was dropped, recreated or emptied starts over (``delivery.lock``): its layout is
not compared. A watermark row from before fingerprints has none: nothing to compare.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from migrators.errors import IncompatibleSchemaError
from sstore.base.sql import qualified


class DriftError(IncompatibleSchemaError):
    """What a sink delivers changed since it last started, and not by an allowed evolution."""


@dataclass(frozen=True)
class Fingerprint:
    version: int
    columns: list[list[str]]
    query: dict[str, Any]
    layout: list[list[Any]]

    def dumps(self) -> str:
        return json.dumps({"version": self.version, "columns": self.columns,
                           "query": self.query, "layout": self.layout})

    @classmethod
    def loads(cls, text: str) -> Fingerprint:
        data = json.loads(text)
        return cls(int(data["version"]), data["columns"], data["query"], data["layout"])


def layout(cur: psycopg.Cursor, target: str) -> list[list[Any]]:
    """The target's columns as [name, type, attnum], in the caller's transaction."""
    return [[str(name), str(kind), int(num)] for name, kind, num in cur.execute(
        "SELECT attname::text, format_type(atttypid, atttypmod), attnum FROM pg_attribute "
        "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (qualified(target),)).fetchall()]


def check(stored: Fingerprint, now: Fingerprint, versions: Sequence[dict[str, Any]],
          what: str, compare_layout: bool) -> None:
    """Raise ``DriftError`` naming the first change from ``stored`` to ``now`` that is not
    allowed (module docstring). ``versions``: the stream's recorded versions;
    ``compare_layout``: False when the target starts over (dropped, recreated, emptied)."""
    if (stored.version, stored.columns) != (now.version, now.columns):
        recorded = {int(v["version"]): [list(c) for c in v["columns"]] for v in versions}
        if not (now.version > stored.version and recorded.get(stored.version) == stored.columns):
            raise DriftError(
                f"{what}: the stream changed since this sink last started, and no recorded "
                f"evolution leads there: it delivered version {stored.version} with columns "
                f"{_show(stored.columns)}, the state file now has version {now.version} with "
                f"{_show(now.columns)} (a state file restored from an older copy, or a stream "
                f"recreated under its name?). Nothing was written. Evolve the stream "
                f"(Engine.evolve), or deliver it into a new table")
    changed = [f"{key} {stored.query.get(key)!r} -> {now.query.get(key)!r}"
               for key in sorted(set(stored.query) | set(now.query))
               if stored.query.get(key) != now.query.get(key)]
    if changed:
        raise DriftError(
            f"{what}: the sink's query changed since it last started ({'; '.join(changed)}); "
            f"the rows in the target were written the old way. Nothing was written. Deliver "
            f"into a new table, or empty the target and reset the sink (sstore migrate "
            f"--reset) to write every kept batch the new way")
    if not compare_layout:
        return
    columns = {str(c[0]): int(c[2]) for c in now.layout}
    for name, kind, attnum in stored.layout:
        if name not in columns:
            raise DriftError(
                f"{what}: column {name!r} ({kind}) was dropped from the target since this sink "
                f"last started; the values delivered into it are gone. Nothing was written. "
                f"Restore the column and its values, or empty the target (TRUNCATE): the "
                f"engine then delivers again what it still has")
        if columns[name] != int(attnum):
            raise DriftError(
                f"{what}: column {name!r} of the target was dropped and added again since this "
                f"sink last started (position {attnum} -> {columns[name]}); the values "
                f"delivered into it are gone. Nothing was written. Restore its values, or "
                f"empty the target (TRUNCATE): the engine then delivers again what it still "
                f"has")


def _show(columns: list[list[str]]) -> str:
    return "[" + ", ".join(f"{c} {t}" for c, t in columns) + "]"
