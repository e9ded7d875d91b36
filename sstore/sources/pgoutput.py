"""PostgreSQL's ``pgoutput`` logical decoding messages (protocol version 1), as the SQL function
``pg_logical_slot_peek_binary_changes`` returns them: decoded into transactions of row changes
with Python values.

Only what a table source needs: Begin, Commit, Relation, Insert, Update, Delete, Truncate (Type
and Origin are read past). Values come as PostgreSQL's text; ``value_of`` turns the common types
into the Python values psycopg gives for the same column (so a snapshot read through psycopg
and a change read here store the same value), and leaves any other type as text for the
engine's input value rule to convert or refuse.

Layout reference: PostgreSQL's documentation, "Logical Replication Message Formats".
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
from dataclasses import dataclass, field
from typing import Any

#: a value a replica identity did not send (an unchanged TOASTed column)
UNCHANGED = object()


def lsn_int(text: str) -> int:
    """``'16/B374D848'`` as an integer."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


@dataclass
class Relation:
    oid: int
    schema: str
    name: str
    identity: str  # d default, n nothing, f full, i index
    columns: list[tuple[str, int]]  # (name, type oid)


@dataclass
class Change:
    op: str  # insert, update, delete, truncate
    relation: int
    lsn: int
    new: list[Any] | None = None
    old: list[Any] | None = None


@dataclass
class Txn:
    xid: int
    end_lsn: int = 0
    changes: list[Change] = field(default_factory=list)


class Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        end = self.data.index(b"\0", self.at)
        text = self.data[self.at:end].decode()
        self.at = end + 1
        return text

    def tuple_data(self) -> list[Any]:
        values: list[Any] = []
        for _ in range(self.take("!h")):
            kind = self.take("!c")
            if kind == b"n":
                values.append(None)
            elif kind == b"u":
                values.append(UNCHANGED)
            else:
                length = self.take("!i")
                values.append(self.data[self.at:self.at + length].decode())
                self.at += length
        return values


class Decoder:
    """Turns the peeked messages, in order, into whole transactions; keeps the relations."""

    def __init__(self) -> None:
        self.relations: dict[int, Relation] = {}
        self._open: Txn | None = None

    def feed(self, lsn: int, data: bytes) -> Txn | None:
        """One message; returns a transaction when its Commit arrives."""
        r = Reader(data)
        kind = r.take("!c")
        if kind == b"B":
            _final, _ts, xid = r.take("!qqI")
            self._open = Txn(xid)
        elif kind == b"C":
            _flags, _commit, end, _ts = r.take("!bqqq")
            txn, self._open = self._open, None
            assert txn is not None, "a Commit without its Begin"
            txn.end_lsn = end
            return txn
        elif kind == b"R":
            oid = r.take("!I")
            schema, name = r.string(), r.string()
            identity = chr(r.take("!b"))
            columns = []
            for _ in range(r.take("!h")):
                _flags = r.take("!b")
                column = r.string()
                type_oid, _mod = r.take("!Ii")
                columns.append((column, type_oid))
            self.relations[oid] = Relation(oid, schema, name, identity, columns)
        elif kind in (b"I", b"U", b"D"):
            assert self._open is not None
            oid = r.take("!I")
            old = new = None
            marker = r.take("!c")
            if marker in (b"K", b"O"):
                old = r.tuple_data()
                if kind == b"U":
                    marker = r.take("!c")
            if marker == b"N":
                new = r.tuple_data()
            op = {b"I": "insert", b"U": "update", b"D": "delete"}[kind]
            self._open.changes.append(Change(op, oid, lsn, new, old))
        elif kind == b"T":
            assert self._open is not None
            count, _options = r.take("!ib")
            for _ in range(count):
                self._open.changes.append(Change("truncate", r.take("!I"), lsn))
        return None  # Type, Origin, Message: nothing a table's rows need


def value_of(text: Any, type_oid: int) -> Any:
    """PostgreSQL's text of a value as the Python value psycopg gives (common types), else
    the text itself."""
    if text is None or text is UNCHANGED:
        return text
    convert = CONVERT.get(type_oid)
    return text if convert is None else convert(text)


def _timestamp(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def _timestamptz(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text if len(text) < 3 or text[-3] not in "+-"
                                     else text + ":00")


CONVERT: dict[int, Any] = {
    16: lambda t: t == "t",                      # boolean
    20: int, 21: int, 23: int,                   # bigint, smallint, integer
    700: float, 701: float,                      # real, double precision
    1700: decimal.Decimal,                       # numeric
    1082: dt.date.fromisoformat,                 # date
    1083: dt.time.fromisoformat,                 # time
    1114: _timestamp,                            # timestamp
    1184: _timestamptz,                          # timestamptz
}
