"""Split objects count each row once while a sink delivers one fragment into another.

The usual split object is an engine stream (fresh batches) and the PostgreSQL table a sink
(``migrators.engine_to_postgres.StreamToPostgres``, ``batch_column="_batch_id"``) delivers that
stream into. The sink commits a batch into PostgreSQL together with its watermark row in
``sstore.watermarks`` (``migrators.delivery``); garbage collection drops the batch from the
stream later, on its own schedule. In between the batch is in both fragments, and a plain
UNION ALL counts it twice, whatever the plan.

How the answer is kept exact:

1. Planning (``links``): for each engine stream of a split object (a fragment with a
   ``_batch_id``) and each PostgreSQL fragment of the same object, the sink's watermark row is
   looked for (stream name, target table, and the engine's identity as the row's ``source``).
   Found: every read of the stream, or of its cached copy, keeps only ``_batch_id > W`` where
   ``W`` is a placeholder in the plan's SQL (``Plan.guards``). Not found: the polystore cannot
   tell which batches are in both, so the query is refused (``UnlinkedFragmentsError``) unless
   the object was declared ``disjoint`` (the user's word that no rows move between them).
2. Running (``run_guarded``): the watermarks are read, bound into the SQL, the plan runs, and
   the watermarks are read again. Equal (same batch, rows written and time of the last
   delivery): no delivery committed while the plan ran, so every read of PostgreSQL saw
   exactly the batches up to ``W``, and no batch above ``W`` was collected from the stream
   (garbage collection drops only delivered batches), so the stream's reads held every batch
   above ``W`` that had arrived: each row is counted once. Different: the plan runs again
   (a cached copy is only topped up), at most ``ATTEMPTS`` times, then ``DeliveryRaced``
   (transient): a loud error, never a double count.

The order of the reads inside the plan does not matter (the moves of "migrate into stream"
read PostgreSQL before the stream, those of "migrate into pg" the stream first), which is why
the check brackets the plan instead of ordering its reads. A watermark written for a table
since dropped and recreated under the same name (another OID) counts no batch while that table
is empty: it holds none of the sink's batches until the sink delivers into it again. Holding
rows (rebuilt by copy, restored), it may hold any of them: ``TargetReplacedError``, as the sink
refuses it (``migrators.watermarks.refuse_replaced_target``).

A target emptied by hand (``TRUNCATE``, ``DELETE`` without WHERE: the same table, no row left)
while its watermark counts delivered rows holds none of the batches the watermark says it has:
read past that watermark, the split object would lack them all, with no error, until the
sink's next delivery noticed (``migrators.delivery._emptied``). Every watermark read asks the
table for one row in the same question (``with_rows``), and planning reads the answer the
probe already has, so an emptied target is ``TargetEmptiedError`` at no round trip of its own.
A plan that reads such a target but not its stream (the stream was empty when planned, so it
was left out) reads the watermark once before it runs (``checks``): one small question.
Rows deleted from a table that keeps others are not seen (the watermark counts rows written,
not the rows still there; knowing would take a count of the table on every query).

Batches the table does not hold must still be in the stream. A table dropped and created
again empty under the target's name counts none of the sink's batches, and a sink that finds
its table dropped or emptied starts its watermark over at 0 (then refuses with ``GapError``
if the engine collected batches it would need): either way the stream is read from its first
batch on, and batches garbage collection already removed were missing from the answer, with
no error. So the first watermark read of each run is preceded by one question to the engine,
the highest batch it collected from the stream (``checked_marks``); past the batch the
watermark counts, those batches are in neither fragment: ``BatchesLostError``. Where the
engine still holds them, the stream's reads find them and the answer is whole.

A target dropped and not created again has no table to read at all. Its watermark row
outlives it, so the run's read (the ``EXISTS`` answers NULL: no table has the name) and
planning's probe (``refuse_dropped_fragment``, when PostgreSQL says the table is undefined)
raise ``TargetDroppedError`` with the batches the sink had delivered into it and those the
engine already collected, instead of PostgreSQL's ``UndefinedTable``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from migrators.errors import TargetReplacedError
from sstore.base.errors import DeclarationError, TerminalError, TransientError
from sstore.polystore.catalog import CatalogObject, EngineKind, Fragment
from sstore.polystore.connectors import Connector, PostgresConnector, StreamingConnector
from sstore.polystore.plan import Delivered, Plan
from sstore.polystore.planning import PlanningInput
from sstore.storage.streams import BATCH_COLUMN

GROWING_COLUMN = BATCH_COLUMN
ATTEMPTS = 5  # runs of one plan while sinks keep delivering, before DeliveryRaced

T = TypeVar("T")
#: (batch_id, rows_total, updated_at, the watermark's table is this one, the target has a row)
Mark = tuple[Any, ...]


class UnlinkedFragmentsError(DeclarationError):
    """A split object has an engine stream and a PostgreSQL table, and no sink's watermark
    says which of the stream's batches the table already holds: refused, not guessed."""


class MergedFragmentsError(DeclarationError):
    """The sink of a split object's stream merges its batches into the table by key: the table
    holds one row per key, and a key the stream changed above the watermark would be counted
    twice (old row in the table, new one in the stream). Refused, not guessed."""


class DeliveryLostError(TerminalError):
    """The sink's watermark the plan was made with is gone (a reset sink): plan again."""


class TargetEmptiedError(DeliveryLostError):
    """The sink's target has no row while its watermark says batches with rows were delivered
    into it (emptied by hand: ``TRUNCATE``, ``DELETE`` without WHERE): the rows of those
    batches are lost to the split object, which would answer without them. Refused until the
    sink delivers again (it notices the emptied table and starts over from what the engine
    still holds) or the watermark is reset."""


class BatchesLostError(DeliveryLostError):
    """Batches of the stream that the engine's garbage collection already removed are not in
    the sink's target either: the table was dropped and created again empty (or emptied, or
    its watermark reset) after they were delivered and acknowledged, or the sink's hold was
    dropped before it delivered them. Read past a watermark that no longer counts them, the
    split object would answer without their rows; refused until the loss is accepted (the
    sink's ``accept_gap`` moves its watermark past them) or their rows are restored."""


class TargetDroppedError(DeliveryLostError):
    """No table under the sink's target name (dropped by hand, or its schema): the split
    object cannot be read, and PostgreSQL's own ``UndefinedTable`` named neither the sink
    nor what was lost with the table. Refused, naming the batches the sink had delivered
    into it and, of those, the ones the engine already collected (no sink can deliver them
    again), until the sink creates the table again (it then delivers what the engine still
    has, or refuses with ``GapError``) or a restored table is adopted."""


class DeliveryRaced(TransientError):
    """A sink delivered while the plan ran, every time it ran: try again later."""


def links(inp: PlanningInput, connector_for: Callable[[str], Connector]
          ) -> dict[Fragment, Delivered]:
    """Each engine stream of a split object that a sink delivers into another fragment of the
    same object, with where its watermark is; ``UnlinkedFragmentsError`` for a stream and a
    table no watermark links, unless the object is declared disjoint."""
    found: dict[Fragment, Delivered] = {}
    for obj in inp.objects:
        streams = [f for f in obj.fragments if inp.kind(f.engine) is EngineKind.STREAMING
                   and f in inp.stats and GROWING_COLUMN in inp.stats[f].columns]
        tables = [f for f in obj.fragments if inp.kind(f.engine) is EngineKind.POSTGRES]
        for stream in streams if tables else ():
            reader = connector_for(stream.engine)
            source = reader.identity() if isinstance(reader, StreamingConnector) else None
            name = _stream_name(stream.physical)
            linked = []
            for table in tables:
                pg = connector_for(table.engine)
                assert isinstance(pg, PostgresConnector)
                rows = pg.sink_watermarks(name, table.physical, source)
                if source is None and len({r[0] for r in rows}) > 1:
                    raise UnlinkedFragmentsError(
                        f"{obj.name}: several engines deliver a stream {name!r} into "
                        f"{table.engine}:{table.physical}, and the identity of engine "
                        f"{stream.engine!r} is not known: attach the running engine")
                merged = sorted({str(r[5]) for r in rows if r[5]})
                if merged:
                    raise MergedFragmentsError(
                        f"{obj.name}: the sink of stream {stream.engine}:{stream.physical} "
                        f"merges its batches into {table.engine}:{table.physical} by key "
                        f"({'; '.join(merged)}): the table holds one row per key, so a key "
                        f"the stream changed in a batch not delivered yet would be counted "
                        f"twice (its old row there, its new one in the stream). Query the "
                        f"table and the stream on their own, or feed the split object with "
                        f"an appending sink")
                if rows:
                    linked.append(table)
                    probed = inp.stats.get(table)
                    if probed is not None and probed.rows == 0:  # the probe asked the table
                        for row in rows:
                            refuse_emptied(stream.physical, table.engine, table.physical,
                                           int(row[1]), int(row[2]), bool(row[4]), False)
            if len(linked) > 1:
                raise UnlinkedFragmentsError(
                    f"{obj.name}: stream {stream.engine}:{stream.physical} is delivered into "
                    f"{len(linked)} of its fragments "
                    f"({', '.join(f'{t.engine}:{t.physical}' for t in linked)}): its batches "
                    f"are in several of them; make the object of one of them")
            if linked:
                found[stream] = Delivered(f"sstore_delivered_{len(found)}", linked[0].engine,
                                          linked[0].physical, name, source, stream.engine)
            elif not obj.disjoint:
                raise UnlinkedFragmentsError(_unlinked(obj.name, stream, tables))
    return found


def _unlinked(name: str, stream: Fragment, tables: list[Fragment]) -> str:
    where = ", ".join(f"{t.engine}:{t.physical}" for t in tables)
    parts = ", ".join(f"{f.engine!r}: {f.physical!r}" for f in [stream, *tables])
    return (f"{name}: fragment {stream.engine}:{stream.physical} is an engine stream and {where} "
            f"a PostgreSQL table, but no sink's watermark (sstore.watermarks) links them, so "
            f"the polystore cannot tell which batches are in both and would count them twice. "
            f"If a sink (StreamToPostgres, sstore migrate) delivers the stream into the table, "
            f"let it run once from this engine (it records its watermark there); if no rows "
            f"ever move between them, declare it: Polystore.split({name!r}, {{{parts}}}, "
            f"disjoint=True) or `sstore polystore split --disjoint`")


def uses(plan: Plan, guard: Delivered) -> bool:
    """Whether any SQL of ``plan`` names the guard's placeholder."""
    pattern = _pattern(guard.placeholder)
    return any(pattern.search(sql) for sql in _sqls(plan))


def run_guarded(plan: Plan, connectors: Mapping[str, Connector], run: Callable[[Plan], T]) -> T:
    """``run`` the plan with its watermarks bound, bracketed by two reads of them (see the
    module docstring); again while a delivery commits in between. The first read of each
    run also checks that no batch past the watermark is gone from the stream
    (``checked_marks``); a run again after a race reads afresh for that check."""
    before = checked_marks(plan, connectors)
    for _attempt in range(ATTEMPTS):
        answer = run(bind(plan, before))
        after = read_marks(plan, connectors)
        if after == before:
            return answer
        before = checked_marks(plan, connectors)
    streams = ", ".join(f"{g.stream} -> {g.engine}.{g.target}" for g in plan.guards)
    raise DeliveryRaced(f"a sink delivered ({streams}) during each of {ATTEMPTS} runs of plan "
                        f"{plan.name!r}: its answer could count a batch twice or miss one, so "
                        f"none is given; run the query again")


def _marks_with_rows(connectors: Mapping[str, Connector], engine: str, stream: str,
                     target: str, source: str | None) -> list[tuple[Any, ...]] | None:
    """The sink's watermark rows for ``target`` with whether it has a row (the ``EXISTS`` in
    the same question); None when PostgreSQL has no watermarks table (any more)."""
    import psycopg
    pg = connectors[engine]
    assert isinstance(pg, PostgresConnector)
    try:
        return list(pg.sink_watermarks(stream, target, source, known=True, with_rows=True))
    except psycopg.errors.UndefinedTable:
        return None


def check_targets(plan: Plan, connectors: Mapping[str, Connector]) -> None:
    """The targets ``plan`` reads without their stream (``Plan.checks``: the stream was empty
    when planned) still hold what their watermarks count: the stream's collected mark, then
    one watermark read each, the ``EXISTS`` in the same question (``TargetEmptiedError``,
    ``TargetReplacedError``, ``BatchesLostError``, or ``TargetDroppedError`` when no table
    has the target's name). Nothing is bound and nothing is compared after the run: the
    plan's SQL does not depend on the watermark, so a watermark gone since planning (a reset
    sink) is not this check's error."""
    for check in plan.checks:
        collected = stream_collected(connectors, check)  # first: see checked_marks
        found = _marks_with_rows(connectors, check.engine, check.stream, check.target,
                                 check.source)
        for row in found or ():
            mark = (*row[1:5], row[6])
            if mark[4] is None:
                refuse_dropped(check, int(mark[0]), collected)
            refuse_changed(check, mark)
            refuse_lost(check, mark, collected)


def read_marks(plan: Plan, connectors: Mapping[str, Connector]) -> dict[str, Mark]:
    """Each guard's watermark row (without its source, with whether the target has a row):
    ``DeliveryLostError`` when it is gone since planning, ``TargetEmptiedError`` when the
    target it counts rows in is empty, ``TargetDroppedError`` when no table has its name."""
    marks = {}
    for guard in plan.guards:
        found = _marks_with_rows(connectors, guard.engine, guard.stream, guard.target,
                                 guard.source)
        rows = [(*r[1:5], r[6]) for r in found or ()]
        if len(rows) != 1:
            raise DeliveryLostError(
                f"the watermark of the sink of {guard.stream} into {guard.engine}.{guard.target} "
                f"{'is gone (a reset sink?)' if not rows else 'is not one row'}: this plan "
                f"cannot tell which batches are in both; query again (planning looks for the "
                f"link anew)")
        mark = rows[0]
        if mark[4] is None:  # no table under the target's name
            refuse_dropped(guard, int(mark[0]), stream_collected(connectors, guard))
        refuse_changed(guard, mark)
        marks[guard.placeholder] = tuple(rows[0])
    return marks


def checked_marks(plan: Plan, connectors: Mapping[str, Connector]) -> dict[str, Mark]:
    """``read_marks``, and no batch of a guard's stream past its watermark collected from the
    engine (``BatchesLostError``). The collected marks are read first: garbage collection
    removes only batches a sink acknowledged, after its watermark passed them, and a
    watermark only grows until it starts over, so a mark read before the watermark is at
    most that watermark unless batches are lost. Read after it, a delivery and a collection
    in between would look like a loss."""
    collected = {g.placeholder: stream_collected(connectors, g) for g in plan.guards}
    marks = read_marks(plan, connectors)
    for guard in plan.guards:
        refuse_lost(guard, marks[guard.placeholder], collected[guard.placeholder])
    return marks


def stream_collected(connectors: Mapping[str, Connector], link: Delivered) -> int:
    """The highest batch of the link's stream that its engine's garbage collection removed
    (one small question to the engine: ``StreamingConnector.collected_through``)."""
    reader = connectors[link.stream_engine]
    assert isinstance(reader, StreamingConnector)
    return reader.collected_through(link.stream)


def refuse_changed(link: Delivered, mark: Mark) -> None:
    """The target under the link's name, as ``mark`` (a watermark read with whether the
    table has a row) finds it, is not the table holding the delivered batches: emptied by hand
    (``TargetEmptiedError``) or another table that holds rows (``TargetReplacedError``)."""
    batch_id, rows_total, _, same_table, has_rows = mark
    refuse_emptied(link.stream, link.engine, link.target, int(batch_id), int(rows_total),
                   bool(same_table), bool(has_rows))
    if not same_table and int(batch_id) > 0 and has_rows:
        # another table under the target's name (rebuilt by copy, restored): it may
        # hold any of the sink's batches, so counting none of them could count twice
        raise TargetReplacedError(
            f"{link.engine}.{link.target} is not the table the sink of {link.stream} "
            f"delivered batches up to {batch_id} into (dropped and created again, or "
            f"rebuilt under its name) and it holds rows: which of the stream's batches "
            f"they are cannot be known, so the split object is not read (see "
            f"migrators.watermarks.refuse_replaced_target for what to do)")


def refuse_lost(link: Delivered, mark: Mark, collected: int) -> None:
    """``BatchesLostError`` when the engine collected (``collected``) batches past the one
    the watermark counts in the table now under the target's name: they are in neither
    fragment. A table dropped and created again empty counts none, and so does a watermark
    that started over at 0 (the sink found its table dropped or emptied, then refused with
    ``GapError``): the stream would be read from its first batch on, without the collected
    ones. The message names them and both ways out (restore and move the watermark, or
    accept the gap); ``sstore migrate --reset`` is no way out, the engine lacks them."""
    counted = _counted(mark)
    if collected <= counted:
        return
    batch_id, same_table = int(mark[0]), bool(mark[3])
    table = f"{link.engine}.{link.target}"
    why = (f"it is not the table the sink delivered batches up to {batch_id} into: dropped "
           f"and created again" if not same_table and batch_id > 0 else
           f"the sink's watermark there is at batch {counted}" + (
               " (a sink starts over at 0 when its table was dropped, emptied or its "
               "watermark reset)" if counted == 0 else ""))
    lost = f"batch {collected}" if collected == counted + 1 else \
        f"batches {counted + 1}..{collected}"
    raise BatchesLostError(
        f"{lost} of stream {link.stream} are in neither part of the split object: the "
        f"engine's garbage collection removed them (the sink had acknowledged them, or no "
        f"consumer held them any more), and the sink's watermark says {table} does not "
        f"hold them ({why}). Their rows would be missing from the answer, so the split "
        f"object is not read. The engine cannot deliver them again (`sstore "
        f"migrate --reset` re-delivers only the batches it still holds, and those are read "
        f"from the stream already). Either restore their rows into {link.target} (from a "
        f"backup) and move the watermark past them: {move_watermark(link, collected)}; "
        f"or accept the loss: run the "
        f"sink once with accept_gap=True (`sstore migrate STATE --stream {link.stream} "
        f"--table {link.target} --accept-gap`), which records the gap (`sstore status` shows "
        f"it) and moves the watermark past it, and the split object answers without them")


def refuse_dropped(link: Delivered, delivered: int, collected: int) -> None:
    """``TargetDroppedError``: no table has the link's target name. ``delivered``: the batch
    the sink's watermark (written for the dropped table) counts; ``collected``: the highest
    batch the engine collected. The message says which batches went with the table for good
    (collected: in neither fragment, whatever the sink does next) and what to do."""
    table = f"{link.engine}.{link.target}"
    what = (f"; the sink's watermark says batches up to {delivered} had been delivered into "
            f"it" if delivered > 0 else "")
    command = f"sstore migrate STATE --stream {link.stream} --table {link.target}"
    if collected <= 0:
        then = (f"The engine still holds every batch of the stream: run the sink again (the "
                f"program's StreamToPostgres, or `{command}`), which creates the table and "
                f"delivers them, and query again")
    else:
        lost = "Batch 1" if collected == 1 else f"Batches 1..{collected}"
        adopt = (f" (holding exactly the batches up to {delivered}, adopt it: "
                 f"{move_watermark(link, delivered)})" if delivered > 0 else "")
        then = (f"{lost} of the stream went with it: the engine's garbage collection already "
                f"removed them, so no sink can deliver them again, and a split object would "
                f"answer without their rows. Either restore the table from a backup{adopt}, "
                f"or accept the loss: run the sink once with accept_gap=True (`{command} "
                f"--accept-gap`), which creates the table, records the gap (`sstore status` "
                f"shows it) and delivers what the engine still holds; the split object then "
                f"answers without them")
    raise TargetDroppedError(
        f"{table} does not exist: the table the sink of stream {link.stream} delivers into "
        f"was dropped{what}, and the split object cannot be read without it. {then}")


def refuse_dropped_fragment(obj: CatalogObject, table: Fragment,
                            kind: Callable[[str], EngineKind],
                            connector_for: Callable[[str], Connector]) -> None:
    """Planning could not probe PostgreSQL fragment ``table`` of ``obj`` (no such table):
    ``TargetDroppedError`` when a sink's watermark says it delivers an engine stream of the
    same object into it (the watermark outlives the table), so the error names the sink and
    the lost batches as a plan's run does; otherwise nothing (the caller re-raises
    PostgreSQL's error: a table no sink feeds is not this module's)."""
    if kind(table.engine) is not EngineKind.POSTGRES:
        return
    pg = connector_for(table.engine)
    assert isinstance(pg, PostgresConnector)
    for stream in obj.fragments:
        if kind(stream.engine) is not EngineKind.STREAMING:
            continue
        reader = connector_for(stream.engine)
        if not isinstance(reader, StreamingConnector):
            continue
        source, name = reader.identity(), _stream_name(stream.physical)
        rows = pg.sink_watermarks(name, table.physical, source)
        if rows:
            link = Delivered("", table.engine, table.physical, name, source, stream.engine)
            refuse_dropped(link, max(int(r[1]) for r in rows),
                           reader.collected_through(name))


def move_watermark(link: Delivered, batch_id: int) -> str:
    """The one ``UPDATE`` a user runs by hand to say that the table now under the link's
    target name holds its stream's batches up to ``batch_id`` (restored from a backup).

    It matches the sink's row as the polystore reads it: by the engine's identity, the
    stream, and the target under both spellings (a sink records ``public.orders``, an
    older sstore recorded a bare name bare; the catalog may say either), so it
    moves that row and no other. ``rows_total`` becomes the table's count: a watermark that
    started over counts no rows, and a table emptied later would not be noticed
    (``refuse_emptied``) while it counts none."""
    from migrators import watermarks
    from migrators.postgres import split_name
    schema, name = split_name(link.target)
    return watermarks.move_statement(link.source, link.stream, schema, name, batch_id)


def refuse_emptied(stream: str, engine: str, target: str, batch_id: int, rows_total: int,
                   same_table: bool, has_rows: bool) -> None:
    """``TargetEmptiedError`` when the table the watermark was written for (``same_table``)
    has no row (``has_rows``) while the watermark counts delivered rows: the sink's test
    (``migrators.delivery._emptied``), with answers the caller already has. A table the
    watermark was not written for counts no batch (``bind``): its emptiness loses nothing."""
    if not same_table or has_rows or batch_id <= 0 or rows_total <= 0:
        return
    raise TargetEmptiedError(
        f"{engine}.{target} has no rows, but the watermark of the sink of {stream} into it "
        f"says batches up to batch {batch_id} were delivered there ({rows_total} rows in "
        f"all): it was emptied by hand (TRUNCATE, DELETE), so a split object reading those "
        f"batches from it would answer without them. Let the sink deliver again (its next "
        f"delivery notices the emptied table and delivers again the batches the engine still "
        f"holds; batches the engine already collected are a gap it refuses unless accepted), "
        f"or forget its watermark with `sstore migrate --reset`; if another process empties "
        f"this table on purpose (drained_target), query the stream and the table on their "
        f"own: a split object cannot count rows that left it")


def bind(plan: Plan, marks: Mapping[str, Mark]) -> Plan:
    """``plan`` with each placeholder replaced by its watermark (an integer: a watermark
    written for another table than the one now under the target's name counts none)."""
    values = {name: str(_counted(mark)) for name, mark in marks.items()}

    def fill(sql: str) -> str:
        for name, value in values.items():
            sql = _pattern(name).sub(value, sql)
        return sql

    steps = tuple(replace(s, sql=fill(s.sql)) for s in plan.steps)
    return replace(plan, steps=steps, final=replace(plan.final, sql=fill(plan.final.sql)))


def _counted(mark: Mark) -> int:
    """The batch up to which the table now under the target's name holds the stream: the
    watermark, or 0 when it was written for another table (dropped and created again)."""
    return int(mark[0]) if mark[3] else 0


def _sqls(plan: Plan) -> list[str]:
    return [s.sql for s in plan.steps] + [plan.final.sql]


def _pattern(name: str) -> re.Pattern[str]:
    """The placeholder as each dialect prints it: ``$name`` (DuckDB), ``%(name)s``
    (PostgreSQL), ``:name`` (Spark)."""
    word = re.escape(name)
    return re.compile(rf"(?:\$|:){word}\b|%\({word}\)s")


def _stream_name(physical: str) -> str:
    """The stream's name as a sink records it (without DuckDB's default schema)."""
    schema, dot, name = physical.rpartition(".")
    return name if dot and schema.lower() == "main" else physical
