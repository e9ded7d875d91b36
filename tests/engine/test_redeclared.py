"""A state file opened again by a changed program, or by two engines at once.

Found by a hostile pass (2026-11-29), each with exit 0 and rows doubled or skipped: a renamed
procedure ran again on every kept batch; a procedure pointed at a renamed stream skipped that
stream's first batches; a window moved to another source left the file unopenable; a resized
window mixed tuples of both sizes; two engines on one file in one process ran the same
batches twice; two processes on one input log erased each other's batches."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sstore import Engine
from sstore.base.errors import DeclarationError


def run(path: str, name: str, source: str = "orders") -> None:
    """A later run of ``first_run``'s program, its procedure named ``name`` on ``source``."""
    with Engine(path) as engine:
        engine.stream(source, {"id": "INTEGER"})
        engine.procedure(input=source, name=name)(
            lambda tx, batch: tx.execute("INSERT INTO revenue SELECT id FROM batch"))
        engine.run_until_idle()


def booked(path: str) -> list[tuple]:
    with Engine.open_existing(path) as engine:
        return [tuple(r.values()) for r in engine.query(
            "SELECT count(*), count(DISTINCT id) FROM revenue").to_pylist()]


def first_run(path: str) -> None:
    with Engine(path) as engine:
        engine.stream("orders", {"id": "INTEGER"})
        engine.execute("CREATE TABLE revenue (id INTEGER)")
        engine.procedure(input="orders", name="book")(
            lambda tx, batch: tx.execute("INSERT INTO revenue SELECT id FROM batch"))
        for i in range(3):
            engine.ingest("orders", [(i,)])
        engine.run_until_idle()


def test_a_renamed_procedure_is_refused_not_run_again(state_path: str) -> None:
    first_run(state_path)
    with pytest.raises(DeclarationError, match="'book_v2' is new and reads orders, like "
                                               "procedure 'book'.*name='book'"):
        run(state_path, name="book_v2")
    assert booked(state_path) == [(3, 3)]  # nothing ran twice
    run(state_path, name="book")  # the old name: its progress carries on, nothing again
    assert booked(state_path) == [(3, 3)]


def test_a_retired_procedure_lets_a_new_one_process_every_kept_batch(state_path: str) -> None:
    first_run(state_path)
    with Engine(state_path) as engine:
        engine.stream("orders", {"id": "INTEGER"}, retain="all")
        with pytest.raises(DeclarationError, match="only one it no longer declares"):
            engine.procedure(input="orders", name="book")(lambda tx, batch: None)
            engine.retire("book")
    with Engine(state_path) as engine:
        engine.stream("orders", {"id": "INTEGER"})
        engine.execute("CREATE TABLE audit (id INTEGER)")
        engine.retire("book")
        engine.procedure(input="orders", name="audit_orders")(
            lambda tx, batch: tx.execute("INSERT INTO audit SELECT id FROM batch"))
        engine.run_until_idle()
        kept = engine.query("SELECT count(*) AS n FROM audit").column("n")[0].as_py()
        assert kept >= 1  # the kept batches of orders, processed on purpose


def test_a_procedure_moved_to_another_input_is_refused(state_path: str) -> None:
    first_run(state_path)
    with pytest.raises(DeclarationError, match="'book' read orders through batch 3.*"
                                               "declares it on orders_v2"):
        run(state_path, name="book", source="orders_v2")
    assert booked(state_path) == [(3, 3)]


def window_program(path: str, source: str, rows: int, slide: int, ingest: int) -> None:
    with Engine(path) as engine:
        engine.stream(source, {"id": "INTEGER"})
        engine.execute("CREATE TABLE IF NOT EXISTS pairs (lo INTEGER, hi INTEGER)")
        engine.window("recent", source, rows=rows, slide=slide)
        engine.procedure(input="recent", name="pair")(
            lambda tx, batch: tx.execute("INSERT INTO pairs SELECT min(id), max(id) FROM batch"))
        for i in range(ingest):
            engine.ingest(source, [(i,)])
        engine.run_until_idle()


@pytest.mark.parametrize("source, rows, slide, refusal", [
    ("events_v2", 2, 2, "window 'recent' read events through batch 4.*events_v2"),
    ("events", 6, 3, "window 'recent' was declared with rows=2, slide=2 .* rows=6, slide=3")])
def test_a_window_moved_or_resized_is_refused_and_the_file_stays_usable(
        state_path: str, source: str, rows: int, slide: int, refusal: str) -> None:
    window_program(state_path, "events", 2, 2, ingest=4)
    with pytest.raises(DeclarationError, match=refusal):
        window_program(state_path, source, rows, slide, ingest=2)
    window_program(state_path, "events", 2, 2, ingest=2)  # as before: opens and carries on
    with Engine.open_existing(state_path) as engine:
        assert engine.query("SELECT count(*) AS n FROM pairs").column("n")[0].as_py() == 3


def test_a_second_engine_on_an_open_state_file_is_refused(state_path: str) -> None:
    first = Engine(state_path)
    with pytest.raises(DeclarationError, match="already open in this process"):
        Engine(state_path)
    with pytest.raises(DeclarationError, match="already open in this process"):
        Engine(str(Path(state_path).parent / "." / Path(state_path).name))  # another spelling
    first.close()
    Engine(state_path).close()  # once closed, free


def test_an_engine_dropped_without_close_frees_its_file(state_path: str) -> None:
    import gc
    engine = Engine(state_path)
    engine.stream("s", {"x": "INTEGER"})
    del engine
    gc.collect()
    Engine(state_path).close()


def test_one_engine_per_input_log_in_this_and_other_processes(tmp_path: Path) -> None:
    log = str(tmp_path / "in.log")
    first = Engine(":memory:", input_log=log)
    with pytest.raises(DeclarationError, match="input log .* is in use by another engine"):
        Engine(":memory:", input_log=log)
    other = subprocess.run([sys.executable, "-c", f"from sstore import Engine\n"
                            f"Engine(':memory:', input_log={log!r})"],
                           capture_output=True, text=True, timeout=120)
    assert other.returncode == 1 and "is in use by another engine" in other.stderr
    first.close()
    Engine(":memory:", input_log=log).close()


def _tables(path: str) -> list[tuple]:
    with Engine.open_existing(path) as engine:
        return [tuple(r.values()) for r in engine.query(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'main' ORDER BY ALL").to_pylist()]


@pytest.mark.parametrize("stored, shown, declared, values", [
    ("VARCHAR", "VARCHAR", "INTEGER", ["7", "50"]),
    ("REAL", "FLOAT", "DOUBLE", [0.1, 0.25]),  # as the catalog spells it
    ("BIGINT", "BIGINT", "INTEGER", [7, 50]),  # narrowing (widening evolves: test_evolution)
    ("DECIMAL(12,2)", "DECIMAL(12,2)", "DECIMAL(10,3)", [1.5, 2.25]),
])
def test_a_stream_redeclared_with_other_column_types_is_refused(
        state_path: str, stored: str, shown: str, declared: str, values: list) -> None:
    """Issue 34, item 3: only an order change was refused; ``VARCHAR -> INTEGER`` went on and
    ``max(level)`` of [7, 50] came out '7', ``REAL -> DOUBLE`` stored 0.1 as
    0.10000000149011612. Refused before anything is created or run; the file is as it was.
    The message names the explicit conversion (issue 38: ``Engine.evolve``)."""
    with Engine(state_path) as engine:
        engine.stream("readings", {"patient": "INTEGER", "level": stored})
        engine.ingest("readings", [(1, v) for v in values])
    before = _tables(state_path)
    with pytest.raises(DeclarationError, match=rf"stream 'readings'.*column 'level'.*stored "
                                               rf"as {re.escape(shown)}.*declares it "
                                               rf"{re.escape(declared)}.*Engine.evolve\("
                                               rf"'readings', cast="):
        with Engine(state_path) as engine:
            engine.stream("fresh", {"x": "INTEGER"})  # new: not created by a refused start
            engine.stream("readings", {"patient": "INTEGER", "level": declared})
            engine.ingest("readings", [(2, values[0])])
    assert _tables(state_path) == before
    with Engine(state_path) as engine:  # declared as before: carries on
        engine.stream("readings", {"patient": "INTEGER", "level": stored})
        engine.ingest("readings", [(2, values[1])])
        assert engine.query("SELECT count(*) AS n FROM readings").column("n")[0].as_py() == 3


def test_a_stream_redeclared_with_the_same_types_in_other_words_opens(state_path: str) -> None:
    columns = {"k": "INTEGER NOT NULL", "name": "VARCHAR(20)", "price": "DECIMAL(10,2)",
               "at": "TIMESTAMP WITH TIME ZONE", "tags": "VARCHAR[]"}
    same = {"k": "int NOT NULL", "name": "text", "price": "numeric(10, 2)",
            "at": "timestamptz", "tags": "string[]"}
    with Engine(state_path) as engine:
        engine.stream("items", columns)
        engine.ingest("items", [(1, "a", 1.5, None, ["x"])])
    for declared in (columns, same):
        with Engine(state_path) as engine:
            engine.stream("items", declared)
            engine.ingest("items", [(2, "b", 2.5, None, [])])
    with Engine.open_existing(state_path) as engine:
        assert engine.query("SELECT count(*) AS n FROM items").column("n")[0].as_py() == 3


def output_program(path: str, name: str, ingest: int = 0, retire: str | None = None,
                   output: str = "booked") -> None:
    with Engine(path) as engine:
        engine.stream("orders", {"id": "INTEGER"})
        if retire:
            engine.retire(retire)
        engine.procedure(input="orders", output=output, name=name)(
            lambda tx, batch: tx.sql("SELECT id FROM batch"))
        for i in range(ingest):
            engine.ingest("orders", [(i,)])
        engine.run_until_idle()


def _commits(path: str) -> list[tuple]:
    with Engine.open_existing(path) as engine:
        return [tuple(r.values()) for r in engine.query(
            "SELECT node, batch_id FROM sstore_sys.commits ORDER BY ALL").to_pylist()]


def test_a_new_procedure_writing_a_retired_ones_output_is_refused_not_wedged(
        state_path: str) -> None:
    """Issue 34, item 9: ``retire("book")`` and a new procedure writing ``book``'s output
    halted on an internal ``AssertionError: batch 1 recorded after 3`` that ``resume`` could
    not get past: a stream's batch-ids are written once, in order, and ``booked`` already had
    1..3. Refused at start with what to do instead; the file stays as it was."""
    output_program(state_path, "book", ingest=3)
    before = _commits(state_path)
    with pytest.raises(DeclarationError, match=r"procedure 'book_v2' writes stream 'booked'.*"
                                               r"through batch 3.*'book'.*name='book'"):
        output_program(state_path, "book_v2", ingest=1, retire="book")
    assert _commits(state_path) == before
    output_program(state_path, "book_v2", ingest=1, retire="book", output="booked_v2")
    output_program(state_path, "book", ingest=1, retire="book_v2")  # carries on: batch 5
    with Engine.open_existing(state_path) as engine:
        assert engine.batches("booked")[-1][0] == 5
        assert engine.query("SELECT id FROM booked WHERE _batch_id = 5"
                            ).column("id").to_pylist() == [0]


def test_a_procedure_taking_over_an_output_after_its_last_batch_runs(state_path: str) -> None:
    """Not refused: the new producer's first batch comes after every batch the stream has
    (the inputs it would read again were collected), so nothing is written twice."""
    output_program(state_path, "book", ingest=2)
    with Engine(state_path, gc_every=1) as engine:  # book gone: orders keeps its latest
        engine.stream("orders", {"id": "INTEGER"})
        engine.retire("book")
        for i in range(3):
            engine.ingest("orders", [(10 + i,)])
        engine.collect_garbage()
    output_program(state_path, "book_v2", ingest=1, retire="book")
    with Engine.open_existing(state_path) as engine:
        ids = [b for b, _n in engine.batches("booked")]
        assert ids[-1] == 6 and ids == sorted(set(ids))


def test_a_border_stream_turned_into_an_output_is_refused_not_wedged(state_path: str) -> None:
    """The same wedge without retire: ``booked`` was ingested through batch 2, and a procedure
    declared to write it would write batch 1 again."""
    with Engine(state_path) as engine:
        engine.stream("orders", {"id": "INTEGER"})
        engine.stream("booked", {"id": "INTEGER"})
        for i in range(2):
            engine.ingest("orders", [(i,)])
            engine.ingest("booked", [(i,)])
    with pytest.raises(DeclarationError, match=r"procedure 'book' writes stream 'booked', which "
                                               r"already has batches through batch 2 \(ingested"):
        output_program(state_path, "book", ingest=1)
    with Engine.open_existing(state_path) as engine:
        assert [b for b, _n in engine.batches("booked")] == [1, 2]  # as it was
