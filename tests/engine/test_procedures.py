"""What procedures see: relations, registered Arrow tables, outputs, and no Python-variable
lookups from SQL."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sstore import DeclarationError, Engine


def test_local_variables_never_shadow_tables(engine: Engine) -> None:
    engine.stream("s", {"x": "INTEGER"})
    engine.execute("CREATE TABLE lookup (x INTEGER, name VARCHAR)")
    engine.execute("INSERT INTO lookup VALUES (1, 'one')")

    @engine.procedure(input="s", output="named")
    def name_it(tx, batch):
        lookup = pa.table({"x": [1], "name": ["shadow"]})  # noqa: F841 - must stay invisible
        return tx.sql("SELECT b.x, l.name FROM batch b JOIN lookup l USING (x)")

    engine.ingest("s", [(1,)])
    engine.run_until_idle()
    assert engine.latest("named")[1].column("name").to_pylist() == ["one"]


def test_registered_tables_live_for_one_transaction(engine: Engine) -> None:
    engine.stream("s", {"x": "INTEGER"})

    @engine.procedure(input="s", output="joined")
    def join_python_rows(tx, batch):
        tx.register("extra", pa.table({"x": [1, 2], "w": [10, 20]}))
        return tx.sql("SELECT x, w FROM batch JOIN extra USING (x)")

    engine.ingest("s", [(2,)])
    engine.run_until_idle()
    assert engine.latest("joined")[1].to_pylist() == [{"x": 2, "w": 20}]
    with pytest.raises(Exception, match="extra"):
        engine.query("SELECT * FROM extra")


def test_select_through_execute_and_several_outputs(engine: Engine) -> None:
    engine.stream("s", {"x": "INTEGER"})

    @engine.procedure(input="s", output=["small", "big"])
    def split(tx, batch):
        tx.execute("SELECT count(*) FROM batch")  # a result nobody reads must not jam the engine
        return {"small": tx.sql("SELECT x FROM batch WHERE x < 10"),
                "big": [{"x": x} for x in batch.column("x").to_pylist() if x >= 10]}

    engine.ingest("s", [(1,), (50,)])
    assert engine.run_until_idle() == 1
    assert engine.latest("small")[1].to_pylist() == [{"x": 1}]
    assert engine.latest("big")[1].to_pylist() == [{"x": 50}]


def test_a_procedure_named_like_its_stream_gets_a_clear_error(engine: Engine) -> None:
    engine.stream("clean", {"x": "INTEGER"})
    with pytest.raises(DeclarationError, match="already declared as a stream"):
        @engine.procedure(input="clean", output="cleaner")
        def clean(tx, batch):
            return batch
