"""Issue 38, step 1: a stream evolves by being redeclared on its existing state file.

New columns appended and widened types evolve the stream's table, recorded as a version with
the first batch that carries it; every other change is refused with the explicit call that
makes it (``Engine.evolve``), which is tested here too; a SIGKILL in the middle of an evolution
leaves the old table or the new one."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner

from sstore import Engine
from sstore.base.errors import DeclarationError, ResendMismatchError
from sstore.cli import main as cli_main

V1 = {"id": "INTEGER", "amount": "DECIMAL(10,2)"}
V2 = {"id": "BIGINT", "amount": "DECIMAL(14,2)", "note": "VARCHAR",
      "channel": "VARCHAR DEFAULT 'web'"}


def first_run(path: str, batches: int = 2) -> None:
    with Engine(path) as engine:
        engine.stream("orders", V1)
        for i in range(batches):
            engine.ingest("orders", [(i, Decimal("1.25") + i)])


def rows(engine: Engine, sql: str) -> list[tuple]:
    return [tuple(r.values()) for r in engine.query(sql).to_pylist()]


def columns(path: str, table: str = "orders") -> list[tuple]:
    with Engine.open_existing(path) as engine:
        return rows(engine, f"SELECT column_name, data_type FROM information_schema.columns "
                            f"WHERE table_name = '{table}' ORDER BY ordinal_position")


def test_appended_columns_and_widened_types_evolve_the_stream(state_path: str) -> None:
    first_run(state_path)
    seen: list[tuple[int, list[str]]] = []
    with Engine(state_path) as engine:
        engine.stream("orders", V2)

        @engine.procedure(input="orders")
        def look(tx, batch):
            seen.append((tx.batch_id, batch.column_names))

        engine.ingest("orders", [(2**40, Decimal("123456789012.50"), "big", "shop")])
        engine.run_until_idle()
        assert rows(engine, "SELECT _batch_id, id, amount, note, channel FROM orders "
                            "ORDER BY _batch_id") == [
            (1, 0, Decimal("1.25"), None, "web"), (2, 1, Decimal("2.25"), None, "web"),
            (3, 2**40, Decimal("123456789012.50"), "big", "shop")]
        versions = engine.stream_versions("orders")
    assert seen[-1] == (3, ["id", "amount", "note", "channel"])  # from that batch on
    assert [(v["version"], v["first_batch"]) for v in versions] == [(1, 1), (2, 3)]
    assert versions[0]["columns"] == [("id", "INTEGER"), ("amount", "DECIMAL(10,2)")]
    assert versions[1]["columns"][-1] == ("channel", "VARCHAR")
    assert "widen id INTEGER -> BIGINT" in versions[1]["change"]
    assert "add note VARCHAR" in versions[1]["change"]
    with Engine(state_path) as engine:  # declared the same again: no new version
        engine.stream("orders", V2)
        engine.ingest("orders", [(5, 1, None, None)])
        assert len(engine.stream_versions("orders")) == 2


def test_status_shows_each_streams_versions(state_path: str) -> None:
    first_run(state_path)
    with Engine(state_path) as engine:
        engine.stream("orders", {**V1, "note": "VARCHAR"})
        engine.ingest("orders", [(9, 1, "x")])
        status = engine.status()
    orders = next(s for s in status.streams if s.name == "orders")
    assert [(v["version"], v["first_batch"]) for v in orders.versions] == [(1, 1), (2, 3)]
    result = CliRunner().invoke(cli_main, ["status", state_path])
    assert result.exit_code == 0, result.output
    shown = result.output
    assert "v2 from batch 3" in shown and "add note VARCHAR" in shown


@pytest.mark.parametrize("declared, refusal", [
    ({"amount": "DECIMAL(10,2)", "id": "INTEGER"}, r"reorder is not an evolution"),
    ({"id": "INTEGER"}, r"Engine.evolve\('orders', drop=\['amount'\]\)"),
    ({"id": "INTEGER", "total": "DECIMAL(10,2)"},
     r"Engine.evolve\('orders', rename=\{'amount': 'total'\}\)"),
    ({"id": "SMALLINT", "amount": "DECIMAL(10,2)"},
     r"column 'id' is stored as INTEGER.*Engine.evolve\('orders', cast=\{'id': 'SMALLINT'\}\)"),
    ({"id": "INTEGER", "amount": "DECIMAL(12,3)"}, r"cast=\{'amount': 'DECIMAL\(12,3\)'\}"),
    ({"id": "INTEGER", "amount": "DOUBLE"}, r"cast=\{'amount': 'DOUBLE'\}"),
])
def test_other_changes_are_refused_naming_engine_evolve(state_path: str, declared: dict,
                                                        refusal: str) -> None:
    first_run(state_path)
    before = columns(state_path)
    with pytest.raises(DeclarationError, match=refusal):
        with Engine(state_path) as engine:
            engine.stream("orders", declared)
            engine.ingest("orders", [(7, 1)])
    assert columns(state_path) == before


def test_a_varchar_of_a_length_becomes_a_varchar(state_path: str) -> None:
    """VARCHAR(n) -> VARCHAR widens: DuckDB keeps no length (both are VARCHAR in its catalog),
    so the redeclaration is the same stream, no version; and back again too."""
    for declared, value in (("VARCHAR(4)", "abcd"), ("VARCHAR", "longer than four"),
                            ("VARCHAR(8)", "x")):
        with Engine(state_path) as engine:
            engine.stream("tags", {"tag": declared})
            engine.ingest("tags", [(value,)])
            assert engine.stream_versions() == []
    with Engine.open_existing(state_path) as engine:
        assert rows(engine, "SELECT tag FROM tags ORDER BY _batch_id") == [
            ("abcd",), ("longer than four",), ("x",)]


def test_a_real_column_is_not_widened_to_double(state_path: str) -> None:
    """REAL -> DOUBLE is refused: 0.1 stored as REAL would read 0.10000000149011612."""
    with Engine(state_path) as engine:
        engine.stream("m", {"v": "REAL"})
        engine.ingest("m", [(0.1,)])
    with pytest.raises(DeclarationError, match=r"stored as FLOAT.*Engine.evolve"):
        with Engine(state_path) as engine:
            engine.stream("m", {"v": "DOUBLE"})
            engine.ingest("m", [(0.2,)])


def test_engine_evolve_renames_drops_and_casts_in_one_step(state_path: str) -> None:
    with Engine(state_path) as engine:
        engine.stream("readings", {"patient": "INTEGER", "level": "VARCHAR", "junk": "VARCHAR"})
        engine.ingest("readings", [(1, "7", "a"), (2, "50", "b")])
    declared = {"patient_id": "INTEGER", "level": "INTEGER", "unit": "VARCHAR"}
    for _ in range(2):  # the second start finds it done: a no-op, the program keeps the call
        with Engine(state_path) as engine:
            engine.stream("readings", declared)
            engine.evolve("readings", rename={"patient": "patient_id"}, drop=["junk"],
                          cast=["level"])
            engine.ingest("readings", [(3, 9, "mg")])
            assert engine.query("SELECT max(level) AS m FROM readings"
                                ).column("m")[0].as_py() == 50
            versions = engine.stream_versions("readings")
    assert [v["version"] for v in versions] == [1, 2]
    assert versions[1]["change"].startswith("rename patient -> patient_id; drop junk; "
                                            "cast level")
    assert columns(state_path, "readings") == [
        ("_batch_id", "BIGINT"), ("patient_id", "INTEGER"), ("level", "INTEGER"),
        ("unit", "VARCHAR")]


def test_a_cast_that_fails_changes_nothing(state_path: str) -> None:
    with Engine(state_path) as engine:
        engine.stream("readings", {"level": "VARCHAR"})
        engine.ingest("readings", [("7",), ("high",)])
    before = columns(state_path, "readings")
    with pytest.raises(DeclarationError, match=r"could not evolve.*cast level.*Nothing was "
                                               r"changed"):
        with Engine(state_path) as engine:
            engine.stream("readings", {"level": "INTEGER", "unit": "VARCHAR"})
            engine.evolve("readings", cast=["level"])
            engine.ingest("readings", [(8, "mg")])
    assert columns(state_path, "readings") == before
    with Engine(state_path) as engine:
        assert engine.stream_versions("readings") == []


def test_a_window_over_an_evolved_stream_carries_the_new_column(state_path: str) -> None:
    def program(columns: dict, batch: tuple) -> list[tuple]:
        with Engine(state_path) as engine:
            engine.stream("events", columns)
            engine.window("recent", "events", rows=2, slide=1)
            engine.execute("CREATE TABLE IF NOT EXISTS seen (n BIGINT, cols VARCHAR)")
            engine.procedure(input="recent", name="count_recent")(
                lambda tx, b: tx.execute("INSERT INTO seen VALUES (?, ?)", b.num_rows,
                                         ",".join(b.column_names)))
            engine.ingest("events", [batch])
            engine.run_until_idle()
            return rows(engine, "SELECT n, cols FROM seen ORDER BY ALL")
    program({"id": "INTEGER"}, (1,))
    assert program({"id": "INTEGER", "tag": "VARCHAR"}, (2, "x"))[-1] == (2, "id,tag")


def test_an_evolution_killed_before_its_commit_leaves_the_old_table(state_path: str) -> None:
    """SIGKILL at ``evolve.before_commit`` (the ALTERs and the version record done, not
    committed): the file has the old table and no version; the next start evolves it."""
    first_run(state_path)
    before = columns(state_path)
    for point, expected in (("evolve.before_commit", before), ("evolve.after_commit", None)):
        code = (f"from sstore import Engine\n"
                f"e = Engine({state_path!r})\n"
                f"e.stream('orders', {{**{V1!r}, 'note': 'VARCHAR'}})\n"
                f"e.ingest('orders', [(9, 1, 'x')])\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "SSTORE_CRASH_AT": point})
        assert done.returncode == -9, done.stderr
        found = columns(state_path)
        with Engine.open_existing(state_path) as engine:
            versions = engine.stream_versions("orders")
            batches = engine.batches("orders")
        if expected is not None:
            assert found == expected and versions == [] and len(batches) == 2
        else:
            assert found[-1] == ("note", "VARCHAR") and [v["version"] for v in versions] == [
                1, 2] and len(batches) == 2
    with Engine(state_path) as engine:  # the program again: evolved once, the batch goes in
        engine.stream("orders", {**V1, "note": "VARCHAR"})
        engine.ingest("orders", [(9, 1, "x")])
        assert len(engine.stream_versions("orders")) == 2
        assert rows(engine, "SELECT count(*), count(note) FROM orders") == [(3, 1)]


def test_a_state_file_path_is_all_it_takes(tmp_path: Path) -> None:
    """A stream that never evolved has no versions, and a state file made before versions
    existed reads the same way (the table is made on first use)."""
    path = str(tmp_path / "s.duckdb")
    first_run(path)
    with Engine.open_existing(path) as engine:
        assert engine.stream_versions() == []


def test_weak_durability_evolves_after_a_checkpoint_only(tmp_path: Path) -> None:
    """Batches in the input log were logged with the old columns: replayed into the evolved
    table they would get other values than a state file's rows got. Refused, with what to
    do; after a checkpoint (the snapshot holds them) the same declaration evolves."""
    log = str(tmp_path / "in.log")
    with Engine(":memory:", input_log=log) as engine:
        engine.stream("s", {"a": "INTEGER"})
        engine.ingest("s", [(1,)])
    def start_evolved() -> None:
        with Engine(":memory:", input_log=log) as engine:
            engine.stream("s", {"a": "BIGINT", "b": "VARCHAR"})
            engine.run_until_idle()

    with pytest.raises(DeclarationError, match=r"int32.*Engine.checkpoint"):  # no snapshot
        start_evolved()
    with Engine(":memory:", input_log=log) as engine:
        engine.stream("s", {"a": "INTEGER"})
        engine.checkpoint()
        engine.ingest("s", [(2,)])  # in the log, after the snapshot
    with pytest.raises(DeclarationError, match=r"cannot evolve \(widen a INTEGER -> BIGINT; "
                                               r"add b VARCHAR\).*1 batch.*Engine.checkpoint"):
        start_evolved()
    with Engine(":memory:", input_log=log) as engine:
        engine.stream("s", {"a": "INTEGER"})
        engine.checkpoint()
    for _ in range(2):
        with Engine(":memory:", input_log=log) as engine:
            engine.stream("s", {"a": "BIGINT", "b": "VARCHAR"})
            engine.ingest("s", [(2**40, "x")])
            assert [v["version"] for v in engine.stream_versions("s")] == [1, 2]
    with Engine(":memory:", input_log=log) as engine:  # replayed over the evolved snapshot?
        engine.stream("s", {"a": "BIGINT", "b": "VARCHAR"})
        assert rows(engine, "SELECT a, b FROM s ORDER BY _batch_id") == [
            (1, None), (2, None), (2**40, "x"), (2**40, "x")]


def test_a_cast_names_the_declared_type_or_is_refused(state_path: str) -> None:
    with Engine(state_path) as engine:
        engine.stream("readings", {"level": "VARCHAR"})
        engine.ingest("readings", [("7",)])
    with pytest.raises(DeclarationError, match=r"declaration gives 'level' the type INTEGER; "
                                               r"cast to the declared type"):
        with Engine(state_path) as engine:
            engine.stream("readings", {"level": "INTEGER"})
            engine.evolve("readings", cast={"level": "BIGINT"})
            engine.ingest("readings", [(8,)])
    with Engine(state_path) as engine:
        engine.stream("readings", {"level": "INTEGER"})
        engine.evolve("readings", cast={"level": "int"})  # the same type, other words
        engine.ingest("readings", [(8,)])
        assert rows(engine, "SELECT level FROM readings ORDER BY ALL") == [(7,), (8,)]


def test_a_batch_sent_before_the_evolution_is_still_a_resend(state_path: str) -> None:
    """A client that does not know of the evolution sends batch 2 again, as it sent it: the
    same rows, a no-op; other rows, or a value in the new column, refused (the model found the
    same rows refused as a mismatch)."""
    first_run(state_path)
    with Engine(state_path) as engine:
        engine.stream("orders", {**V1, "id": "BIGINT", "note": "VARCHAR"})
        assert engine.ingest("orders", [(1, Decimal("2.25"), None)], batch_id=2).duplicate
        assert engine.ingest("orders", [{"id": 1, "amount": Decimal("2.25"), "note": None}],
                             batch_id=2).duplicate
        with pytest.raises(ResendMismatchError):
            engine.ingest("orders", [(1, Decimal("2.25"), "x")], batch_id=2)
        with pytest.raises(ResendMismatchError):
            engine.ingest("orders", [(1, Decimal("2.30"), None)], batch_id=2)
        assert rows(engine, "SELECT count(*) FROM orders") == [(2,)]


def program_with_a_window(path: str, columns: dict, size: int, batch: tuple | None = None
                          ) -> list[tuple]:
    """``orders`` (``columns``) and an event window of ``size`` over another stream."""
    with Engine(path) as engine:
        engine.stream("orders", columns)
        engine.stream("clicks", {"t": "BIGINT"})
        engine.event_window("per_ten", "clicks", time="t", size=size)
        if batch is not None:
            engine.ingest("orders", [batch])
        return rows(engine, "SELECT * EXCLUDE (_batch_id) FROM orders ORDER BY _batch_id")


def test_a_start_refused_after_an_accepted_evolution_keeps_nothing_of_it(
        state_path: str) -> None:
    """The evolution of ``orders`` is accepted, then the same start is refused (the event
    window is declared with another size): the file keeps the old table and no version, and
    the program before it still starts and ingests (an evolution committed on its own made
    the old program's declaration a dropped column, refused)."""
    program_with_a_window(state_path, V1, 10, (1, Decimal("1.25")))
    before = columns(state_path)
    with pytest.raises(DeclarationError, match="event window 'per_ten' is declared "
                                               "differently"):
        program_with_a_window(state_path, {**V1, "note": "VARCHAR"}, 20)
    assert columns(state_path) == before
    with Engine.open_existing(state_path) as engine:
        assert engine.stream_versions() == []
    assert program_with_a_window(state_path, V1, 10, (2, Decimal("2.25"))) == [
        (1, Decimal("1.25")), (2, Decimal("2.25"))]
    assert program_with_a_window(state_path, {**V1, "note": "VARCHAR"}, 10, (3, 1, "x")) == [
        (1, Decimal("1.25"), None), (2, Decimal("2.25"), None), (3, Decimal("1.00"), "x")]
    with Engine.open_existing(state_path) as engine:
        assert [(v["version"], v["first_batch"]) for v in engine.stream_versions()] == [
            (1, 1), (2, 3)]


def test_a_start_killed_after_its_evolution_before_its_commit_keeps_nothing(
        state_path: str) -> None:
    """SIGKILL at ``start.before_commit``: the evolution, its record, the procedure switch
    and the rest of the start were done in the start's transaction, not committed; the file
    is as the last start left it."""
    first_run(state_path)
    before = columns(state_path)
    code = (f"from sstore import Engine\n"
            f"e = Engine({state_path!r})\n"
            f"e.stream('orders', {{**{V1!r}, 'note': 'VARCHAR'}})\n"
            f"e.procedure(input='orders', name='look', version=2)(lambda tx, b: None)\n"
            f"e.ingest('orders', [(9, 1, 'x')])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "SSTORE_CRASH_AT": "start.before_commit"})
    assert done.returncode == -9, done.stderr
    assert columns(state_path) == before
    with Engine.open_existing(state_path) as engine:
        assert engine.stream_versions() == [] and engine.procedure_versions() == []
        assert len(engine.batches("orders")) == 2
    first_run(state_path, batches=1)  # the program before it starts on the file
    assert columns(state_path) == before
