"""Dead letters: the input batches that a procedure declared with ``on_error="dead_letter"``
gave up on, and how to send them through again.

Where they are: when procedure P fails on batch b, the executor (``executor._dead_letter``)
copies P's input batch b of each input N into the table ``N__dead_letter``, with three leading
columns ``_batch_id`` (b), ``_procedure`` (P) and ``_error``, and commits P's empty outputs for
b, so that downstream goes on. ``summary`` and ``read`` show them; ``replay`` sends them again;
``discard`` deletes them once handled by hand.

What replay does, and why only this. The engine's exactly-once rests on "P did b" being
recorded once: P will never run on b again. So a replay is a NEW batch: the dead-lettered rows
of N are ingested into N again with the next batch-id, and P processes that batch like any
other (in the program that owns the state file, with the fix in place). That is safe only
when nothing but P sees N's batches, or the others would see the rows twice:

- N is a border stream (no procedure writes it): a stream that a procedure Q writes holds
  Q's output of each batch, and a batch appended beside Q would break that (and Q's own later
  batches); such rows can only be replayed by running P on them again, which needs P's code
  and a second run of P on b, which exactly-once forbids. ``replay`` refuses and says so: fix
  the cause, handle the rows (``read``), then ``discard`` them;
- P reads N alone (with several inputs, batch b of the others would not come along);
- no other procedure reads N, no window follows it, no trigger fires on it, and no consumer
  (a sink into PostgreSQL) holds it: they processed b already;
- the engine keeps full durability (weak durability's input log would replay b, not the
  replay's deletion).

Protocol of ``replay`` (input N, each dead-lettered batch b of P, in batch order):

1. Check the conditions above (``replay_refusal``); refuse with the reason otherwise.
2. Read b's dead-lettered rows of N (without the three columns), in the order they came.
3. One engine transaction (``Engine.ingest(..., along=...)``): append them to N as the next
   batch b', then delete b's dead letters and record b' in ``sstore_sys.replays`` (a client
   that numbers its own batches may send one under b' later: ``Engine.ingest`` refuses it
   with ``BatchIdTakenError`` instead of taking it for a no-op re-send), commit records,
   COMMIT. A crash before COMMIT leaves the dead letters and no b'; after it, b' and no dead
   letters: never both, never neither.
4. P runs on b' when its program next runs the dataflow (``open_existing`` engines, as in
   ``sstore dead-letters replay``, never run procedures).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from sstore.base.errors import TerminalError
from sstore.base.faults import crash_point
from sstore.base.sql import ident

if TYPE_CHECKING:
    from sstore.engine import Engine
    from sstore.execution.transaction import Transaction

log = logging.getLogger(__name__)

SUFFIX = "__dead_letter"
META_COLUMNS = ("_batch_id", "_procedure", "_error")


class Source(Protocol):
    """Where dead letters are read: a live ``Engine`` or a ``statefile.StateFileReader``
    (both answer read-only queries)."""

    def query(self, sql: str, *args: Any) -> pa.Table: ...


class DeadLetterError(TerminalError):
    """No such dead letters, or they cannot be replayed (the message says why)."""


@dataclass(frozen=True)
class DeadBatch:
    """One failed execution: procedure ``procedure`` gave up on batch ``batch_id`` of
    ``input`` (``rows`` rows, kept in ``input + SUFFIX``)."""

    input: str
    procedure: str
    batch_id: int
    rows: int
    error: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Replayed:
    """Batch ``from_batch`` of ``input`` (dead-lettered by ``procedure``) went in again as
    batch ``batch_id``."""

    input: str
    procedure: str
    from_batch: int
    batch_id: int
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def table_of(input_name: str) -> str:
    return input_name + SUFFIX


def inputs(source: Source) -> list[str]:
    """The inputs that have a dead-letter table."""
    names = source.query(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND suffix(table_name, ?) ORDER BY table_name", SUFFIX)
    return [name[: -len(SUFFIX)] for name in names.column(0).to_pylist()]


def summary(source: Source, input_name: str | None = None) -> list[DeadBatch]:
    """Every dead-lettered batch (of ``input_name`` only, if given), by input and batch."""
    found = []
    for name in _inputs_asked(source, input_name):
        rows = source.query(
            f"SELECT _procedure, _batch_id, count(*) AS n, min(_error) AS error "
            f"FROM {ident(table_of(name))} GROUP BY ALL ORDER BY _batch_id, _procedure")
        found += [DeadBatch(name, r["_procedure"], int(r["_batch_id"]), int(r["n"]), r["error"])
                  for r in rows.to_pylist()]
    return found


def read(source: Source, input_name: str, batch_ids: Sequence[int] = ()) -> pa.Table:
    """The dead-lettered rows of ``input_name`` (of ``batch_ids`` only, if given), with the
    three leading columns, in batch order and, inside a batch, in the order they came."""
    _inputs_asked(source, input_name)
    where, params = _batch_filter(batch_ids)
    return source.query(f"SELECT * FROM {ident(table_of(input_name))}{where} "
                        f"ORDER BY _batch_id, rowid", *params)


def discard(engine: Engine, input_name: str, batch_ids: Sequence[int] = ()) -> int:
    """Delete dead letters of ``input_name`` (of ``batch_ids`` only, if given) in one engine
    transaction; return how many rows. For rows handled by hand: nothing else keeps them."""
    _check_batches(engine, input_name, batch_ids)
    where, params = _batch_filter(batch_ids)
    with engine.transaction() as tx:
        gone = tx.fetchone(f"SELECT count(*) FROM {ident(table_of(input_name))}{where}",
                           params=params)
        tx.execute(f"DELETE FROM {ident(table_of(input_name))}{where}", params=params)
    return int(gone[0]) if gone else 0


def replay_refusal(engine: Engine, input_name: str, procedure: str) -> str | None:
    """Why dead letters of ``input_name`` left by ``procedure`` cannot be replayed as a new
    batch (the conditions of the module docstring), or None when they can."""
    graph = engine.graph
    if input_name in graph.windows:
        return (f"{input_name!r} is a window: its dead letters are the window's contents at "
                f"one slide, which only running {procedure!r} on them again could replay")
    if input_name in graph.event_outputs:
        return (f"stream {input_name!r} is written by event window "
                f"{graph.event_outputs[input_name]!r}: its batch b is what the window did "
                f"with its source's batch b, so the rows cannot go in again as a new batch. "
                f"Handle them by hand (sstore dead-letters show), then discard them")
    producer = graph.producer_of(input_name)
    if producer is not None:
        return (f"stream {input_name!r} is written by procedure {producer!r}: its batch b is "
                f"{producer!r}'s output for b, so the rows cannot go in again as a new batch; "
                f"only running {procedure!r} on them again could replay them, and it has "
                f"already done that batch (exactly once). Handle the rows by hand "
                f"(sstore dead-letters show), then discard them (sstore dead-letters discard)")
    decl = graph.procedures.get(procedure)
    if decl is None:
        return f"procedure {procedure!r} is no longer part of the dataflow"
    if decl.inputs != (input_name,):
        return (f"procedure {procedure!r} reads {', '.join(decl.inputs)}: a new batch of "
                f"{input_name!r} alone would not bring the other inputs' rows of that batch")
    others = [f"procedure {p}" for p in graph.consumers_of(input_name) if p != procedure]
    others += [f"window {w.name}" for w in graph.windows_on(input_name)]
    others += ["a trigger"] * bool(graph.triggers_on(input_name))
    others += [f"consumer {c.consumer}" for c in engine.consumers() if c.stream == input_name]
    if others:
        return (f"stream {input_name!r} is also read by {', '.join(others)}, which already "
                f"processed those rows: a new batch would give them the rows twice")
    if engine.durability == "weak":
        return ("the engine keeps weak durability: its input log would replay the original "
                "batch at restart, not this replay's deletion of the dead letters")
    return None


def replay(engine: Engine, input_name: str, batch_ids: Sequence[int] = ()) -> list[Replayed]:
    """Send the dead letters of border stream ``input_name`` (of ``batch_ids`` only, if given)
    through again, each dead-lettered batch as a new batch (protocol in the module
    docstring); return what was replayed, in order. Refuses (``DeadLetterError``, nothing
    done) when any of them cannot be replayed."""
    batches = _check_batches(engine, input_name, batch_ids)
    for dead in batches:  # step 1, for all before any is replayed
        why = replay_refusal(engine, input_name, dead.procedure)
        if why is not None:
            raise DeadLetterError(f"cannot replay the dead letters of {input_name!r}: {why}")
    done = []
    for dead in batches:
        rows = engine.query(  # step 2
            f"SELECT * EXCLUDE ({', '.join(META_COLUMNS)}) FROM {ident(table_of(input_name))} "
            f"WHERE _batch_id = ? AND _procedure = ? ORDER BY rowid",
            dead.batch_id, dead.procedure)
        new_id = engine.ingest(input_name, rows, along=_deleting(input_name, dead))  # step 3
        done.append(Replayed(input_name, dead.procedure, dead.batch_id, int(new_id),
                             rows.num_rows))
        log.info("replayed dead letters of %s batch %d (%d rows, procedure %s) as batch %d",
                 input_name, dead.batch_id, rows.num_rows, dead.procedure, int(new_id),
                 extra=done[-1].to_dict())
    return done


def _deleting(input_name: str, dead: DeadBatch) -> Any:
    """``along`` of step 3: delete what was just appended again, in the same transaction."""
    def delete(tx: Transaction) -> None:
        crash_point("dead_letters.before_delete")
        tx.execute(f"DELETE FROM {ident(table_of(input_name))} WHERE _batch_id = ? AND "
                   f"_procedure = ?", dead.batch_id, dead.procedure)
        # a client that numbers its own batches may send its next one under this id: it
        # must be refused, not taken for a re-send (``Engine.ingest``, BatchIdTakenError)
        assert tx.batch_id is not None
        tx.execute("INSERT INTO sstore_sys.replays (stream, batch_id, from_batch, procedure) "
                   "VALUES (?, ?, ?, ?)", input_name, tx.batch_id, dead.batch_id,
                   dead.procedure)
    return delete


def _check_batches(source: Source, input_name: str, batch_ids: Sequence[int]
                   ) -> list[DeadBatch]:
    """The dead-lettered batches of ``input_name`` asked for; an error naming those that
    have none."""
    batches = [b for b in summary(source, input_name)
               if not batch_ids or b.batch_id in batch_ids]
    missing = sorted(set(batch_ids) - {b.batch_id for b in batches})
    if missing:
        raise DeadLetterError(f"no dead letters of {input_name!r} from batch(es) "
                              f"{', '.join(map(str, missing))}")
    return batches


def _inputs_asked(source: Source, input_name: str | None) -> list[str]:
    known = inputs(source)
    if input_name is None:
        return known
    if input_name not in known:
        raise DeadLetterError(f"no dead letters of {input_name!r}; inputs with dead letters: "
                              f"{', '.join(known) or 'none'}")
    return [input_name]


def _batch_filter(batch_ids: Sequence[int]) -> tuple[str, list[int]]:
    if not batch_ids:
        return "", []
    return (f" WHERE _batch_id IN ({', '.join('?' for _ in batch_ids)})",
            [int(b) for b in batch_ids])
