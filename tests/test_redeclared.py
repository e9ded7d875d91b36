"""A state file opened again by a changed program, or by two engines at once.

Found by a hostile pass (2026-11-29), each with exit 0 and rows doubled or skipped: a renamed
procedure ran again on every kept batch; a procedure pointed at a renamed stream skipped that
stream's first batches; a window moved to another source left the file unopenable; a resized
window mixed tuples of both sizes; two engines on one file in one process ran the same
batches twice; two processes on one input log erased each other's batches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sstore import Engine
from sstore.errors import DeclarationError


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
