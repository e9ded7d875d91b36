"""BigDAWG's island syntax around plain SQL: ``bdrel(...)``, ``bdstream(...)``, ``bdcast(...)``.

- ``bdrel(SQL)``: the relational island; the SQL may name any catalog object (the same as plain
  SQL without a wrapper).
- ``bdstream(SQL | stream | CALL procedure(v, ...))``: the streaming island. SQL there sees only
  the streaming engine's fragments (of a split object: its freshest rows); a bare name reads a
  stream; ``CALL`` sends one row to a stored procedure's input stream as a batch, runs the
  dataflow and returns the procedure's output for that batch.
- ``bdcast(QUERY, name, engine)`` (or BigDAWG's four-argument form ``bdcast(QUERY, name,
  'schema', island)``, whose schema text is not needed: Arrow carries the types): runs QUERY,
  stores its rows in ``engine`` as a new table in its scratch schema
  (``sstore_scratch.name``, see ``scratch``) and registers ``name`` in the catalog. It may stand
  where a table name stands, so a later part of the query reads the cast result.

The wrappers are not SQL, so they are found by a small scanner that knows quotes and
parentheses; the SQL inside them is parsed by sqlglot like any other query.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from sstore.polystore.sqltext import QueryError

WRAPPERS = ("bdrel", "bdstream", "bdcast")
_CALL = re.compile(r"\s*call\s+", re.IGNORECASE)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


@dataclass(frozen=True)
class Cast:
    query: IslandQuery
    name: str
    engine: str          # an engine name, or an island name (``relational``, ``streaming``)


@dataclass(frozen=True)
class IslandQuery:
    sql: str                          # plain SQL (bdcast calls replaced by their names)
    island: str = "relational"        # or "streaming"
    casts: tuple[Cast, ...] = ()      # to run first, in order
    call: tuple[str, str] | None = field(default=None)  # (procedure, argument SQL) for CALL


@functools.lru_cache(maxsize=512)
def parse_island(text: str) -> IslandQuery:
    """Split ``text`` into casts to run first and the query that remains (kept by text: a
    repeated query is split once; the result is immutable)."""
    body = text.strip().rstrip(";").strip()
    island = "relational"
    outer = _whole_call(body)
    if outer is not None and outer[0] in ("bdrel", "bdstream"):
        island = "streaming" if outer[0] == "bdstream" else "relational"
        body = outer[1].strip()
    if island == "streaming":
        call = _CALL.match(body)
        if call is not None:
            return IslandQuery(body, island, (), _procedure_call(body[call.end():]))
        if _NAME.fullmatch(body):
            body = f"SELECT * FROM {body}"
    casts: list[Cast] = []
    while True:
        found = _first_call(body, "bdcast")
        if found is None:
            break
        start, end, inner = found
        casts.append(_cast(inner))
        body = body[:start] + casts[-1].name + body[end:]
    return IslandQuery(body, island, tuple(casts))


def _cast(inner: str) -> Cast:
    args = _split_args(inner)
    if len(args) not in (3, 4):
        raise QueryError("bdcast takes (query, name, engine) or (query, name, 'schema', island); "
                         f"got {len(args)} arguments")
    name = args[1].strip()
    if not _NAME.fullmatch(name):
        raise QueryError(f"bdcast: {name!r} is not a table name")
    engine = args[-1].strip().strip("'\"")
    return Cast(parse_island(args[0]), name.lower(), engine)


def _procedure_call(text: str) -> tuple[str, str]:
    match = _NAME.match(text.strip())
    rest = text.strip()[match.end():].strip() if match else ""
    if match is None or not (rest.startswith("(") and rest.endswith(")")):
        raise QueryError("bdstream(CALL procedure(value, ...)): a procedure name and its values")
    return match.group(0), rest[1:-1]


def _whole_call(text: str) -> tuple[str, str] | None:
    """``name(...)`` spanning all of ``text``: (name, inside)."""
    for name in WRAPPERS:
        found = _first_call(text, name)
        if found is not None and found[0] == 0 and found[1] == len(text):
            return name, found[2]
    return None


def _scan(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """(position, character, parenthesis depth before it) of every character outside
    quotes, from ``start``."""
    depth, quote = 0, ""
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
            continue
        yield i, ch, depth
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1


def _first_call(text: str, name: str) -> tuple[int, int, str] | None:
    """The first ``name(`` outside quotes: (start, end after its ``)``, text inside)."""
    lowered = text.lower()
    for i, _ch, _depth in _scan(text):
        if lowered.startswith(name, i) and (i == 0 or not (text[i - 1].isalnum()
                                                           or text[i - 1] == "_")):
            j = i + len(name)
            while j < len(text) and text[j].isspace():
                j += 1
            if j < len(text) and text[j] == "(":
                close = _matching(text, j)
                return i, close + 1, text[j + 1:close]
    return None


def _matching(text: str, open_at: int) -> int:
    for i, ch, depth in _scan(text, open_at):
        if ch == ")" and depth == 1:
            return i
    raise QueryError(f"unbalanced parentheses after position {open_at}: {text[open_at:][:60]!r}")


def _split_args(text: str) -> list[str]:
    """Top-level comma-separated arguments."""
    cuts = [i for i, ch, depth in _scan(text) if ch == "," and depth == 0]
    bounds = [-1, *cuts, len(text)]
    return [text[a + 1:b] for a, b in itertools.pairwise(bounds)]
