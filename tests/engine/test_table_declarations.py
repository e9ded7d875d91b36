"""``Engine.execute("CREATE TABLE ...")`` on a state file that already has the table.

A program declares its tables every time it starts; the same declaration again is a no-op. A
declaration with other columns (names, types or order) means the program and the state file
disagree: that is a ``DeclarationError`` naming the table and both column lists, never a
silent no-op that leaves the program writing into a table it does not know.
"""

from __future__ import annotations

import pytest

from sstore import DeclarationError, Engine


def columns(engine: Engine, table: str, schema: str = "main") -> list[tuple[str, str]]:
    rows = engine.query("SELECT column_name, data_type FROM duckdb_columns() "
                        "WHERE schema_name = ? AND table_name = ? ORDER BY column_index",
                        schema, table)
    return [(r["column_name"], r["data_type"]) for r in rows.to_pylist()]


@pytest.mark.parametrize("create", ["CREATE TABLE", "CREATE TABLE IF NOT EXISTS"])
def test_same_declaration_again_is_a_noop(state_path: str, create: str) -> None:
    eng = Engine(state_path)
    eng.execute(f"{create} totals (k INTEGER PRIMARY KEY, v BIGINT)")
    eng.execute("INSERT INTO totals VALUES (1, 10)")
    eng.close()
    eng = Engine(state_path)
    # spelled differently, same columns: INT is INTEGER, INT8 is BIGINT
    eng.execute(f"{create} totals (k INT PRIMARY KEY, v INT8)")
    eng.execute(f"{create} Totals (k INTEGER PRIMARY KEY, v BIGINT)")
    assert eng.query("SELECT k, v FROM totals").to_pylist() == [{"k": 1, "v": 10}]
    eng.close()


@pytest.mark.parametrize("create", ["CREATE TABLE", "create table if not exists"])
@pytest.mark.parametrize("declared, why", [
    ("(k INTEGER PRIMARY KEY, total BIGINT)", "other name"),
    ("(k INTEGER PRIMARY KEY, v DOUBLE)", "other type"),
    ("(k INTEGER PRIMARY KEY, v BIGINT, note VARCHAR)", "one more column"),
    ("(k INTEGER PRIMARY KEY)", "one column fewer"),
    ("(v BIGINT, k INTEGER PRIMARY KEY)", "other order"),
    ("AS SELECT 1::INTEGER AS k, 'x' AS v", "CREATE TABLE AS"),
])
def test_other_columns_are_a_declaration_error(state_path: str, create: str, declared: str,
                                               why: str) -> None:
    eng = Engine(state_path)
    eng.execute("CREATE TABLE totals (k INTEGER PRIMARY KEY, v BIGINT)")
    eng.execute("INSERT INTO totals VALUES (1, 10)")
    eng.close()
    eng = Engine(state_path)
    with pytest.raises(DeclarationError, match=r"table 'totals' is declared with columns "
                                               r"\[.*\] but the existing table has "
                                               r"\[k INTEGER, v BIGINT\]") as err:
        eng.execute(f"{create} totals {declared}")
    assert why and "totals" in str(err.value)
    assert columns(eng, "totals") == [("k", "INTEGER"), ("v", "BIGINT")]
    assert eng.query("SELECT k, v FROM totals").to_pylist() == [{"k": 1, "v": 10}]
    eng.close()


def test_several_statements_are_each_checked(engine: Engine) -> None:
    engine.execute("CREATE TABLE a (x INTEGER)")
    # a exists with the same columns, b is new: b is created (the no-op of a does not stop it)
    engine.execute("CREATE TABLE a (x INTEGER); CREATE TABLE b (y VARCHAR)")
    assert columns(engine, "b") == [("y", "VARCHAR")]
    with pytest.raises(DeclarationError, match="table 'b'"):
        engine.execute("CREATE TABLE IF NOT EXISTS c (z DATE); CREATE TABLE b (y INTEGER)")
    assert columns(engine, "c") == [("z", "DATE")]


def test_schemas_quoted_names_and_other_objects(engine: Engine) -> None:
    engine.execute('CREATE SCHEMA IF NOT EXISTS wh')
    engine.execute('CREATE TABLE wh."Odd Name" (x INTEGER)')
    engine.execute('CREATE TABLE IF NOT EXISTS wh."Odd Name" (x INTEGER)')
    with pytest.raises(DeclarationError, match="Odd Name"):
        engine.execute('CREATE TABLE IF NOT EXISTS wh."Odd Name" (x BIGINT)')
    engine.execute("CREATE TABLE wh.other (x INTEGER)")
    engine.execute("CREATE TABLE other (x BIGINT)")  # main.other is not wh.other
    engine.execute("CREATE TABLE IF NOT EXISTS other (x BIGINT)")
    # views and sequences keep the "already exists" no-op; OR REPLACE replaces
    engine.execute("CREATE VIEW v AS SELECT 1 AS one")
    engine.execute("CREATE VIEW v AS SELECT 2 AS two")
    for create in ("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"):
        with pytest.raises(DeclarationError, match="v is not a table but a view"):
            engine.execute(f"{create} v (one INTEGER)")
    engine.execute("CREATE SEQUENCE s")
    engine.execute("CREATE SEQUENCE s")
    engine.execute("CREATE TEMP TABLE other (z DATE)")  # a temporary table is another table
    engine.execute("CREATE TEMP TABLE IF NOT EXISTS other (z DATE)")
    with pytest.raises(DeclarationError, match="other"):
        engine.execute("CREATE TEMPORARY TABLE IF NOT EXISTS other (z INTEGER)")
    engine.execute("DROP TABLE temp.other")
    engine.execute("CREATE OR REPLACE TABLE other (y VARCHAR)")
    assert columns(engine, "other") == [("y", "VARCHAR")]
    assert columns(engine, "other", "wh") == [("x", "INTEGER")]
    assert engine.query("SELECT * FROM v").column_names == ["one"]


def test_declarations_that_refer_to_other_objects(state_path: str) -> None:
    """Foreign keys, sequences and user types resolve as for the real table (the comparison
    creates the declared table beside it, in the same schema, and rolls that back)."""
    def declare(eng: Engine) -> None:
        eng.execute("CREATE SCHEMA IF NOT EXISTS wh; "
                    "CREATE TABLE IF NOT EXISTS wh.parent (k INTEGER PRIMARY KEY); "
                    "CREATE TABLE IF NOT EXISTS wh.child (k INTEGER REFERENCES parent (k)); "
                    "CREATE SEQUENCE IF NOT EXISTS ids; "
                    "CREATE TABLE IF NOT EXISTS parent (k INTEGER PRIMARY KEY); "
                    "CREATE TABLE IF NOT EXISTS child (id BIGINT DEFAULT nextval('ids'), "
                    "  k INTEGER REFERENCES parent (k), CHECK (k > 0))")

    eng = Engine(state_path)
    eng.execute("CREATE TYPE mood AS ENUM ('ok', 'sad')")
    declare(eng)
    eng.execute("CREATE TABLE IF NOT EXISTS moods (m mood, tags VARCHAR[])")
    eng.execute("INSERT INTO parent VALUES (1); INSERT INTO child (k) VALUES (1)")
    eng.close()
    eng = Engine(state_path)
    declare(eng)
    eng.execute("CREATE TABLE IF NOT EXISTS moods (m mood, tags VARCHAR[])")
    with pytest.raises(DeclarationError, match=r"'wh.child' is declared with columns "
                                               r"\[parent_k INTEGER\]"):
        eng.execute("CREATE TABLE IF NOT EXISTS wh.child (parent_k INTEGER REFERENCES parent (k))")
    eng.execute("INSERT INTO child (k) VALUES (1)")
    assert eng.query("SELECT id FROM child ORDER BY id").column(0).to_pylist() == [1, 2]
    assert not eng.query("SELECT * FROM duckdb_tables() WHERE table_name LIKE 'sstore_decl%'"
                         ).num_rows
    eng.close()
