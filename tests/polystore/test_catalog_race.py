"""Sinks attached together into a schema that does not exist yet.

Seen while testing sink groups: three sinks attached at once into a new schema ``g``; all
three ran ``CREATE SCHEMA IF NOT EXISTS g``, and the one that lost the race got a unique
violation on ``pg_namespace`` instead of finding the schema: a terminal error, the sink
halted, its rows never arrived. The race is made deterministic here: another session creates
the schema (or table) and holds its transaction open while the sink starts.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from migrators import StreamToPostgres
from migrators.pg_errors import classify
from sstore import Engine
from sstore.base.retry import Kind


def race(url: str, create: str, loser: str) -> BaseException | None:
    """Run ``create`` in a transaction left open, start ``loser`` (IF NOT EXISTS) in another
    session, commit the first: what did the loser get?"""
    got: list[BaseException | None] = []
    with psycopg.connect(url) as first:
        first.execute(create)

        def lose() -> None:
            try:
                with psycopg.connect(url, autocommit=True) as second:
                    second.execute(loser)
                got.append(None)
            except psycopg.Error as exc:
                got.append(exc)

        thread = threading.Thread(target=lose)
        thread.start()
        time.sleep(0.5)  # the loser waits for the first session's lock
        first.commit()
        thread.join(30)
    return got[0]


@pytest.mark.parametrize("create, loser", [
    ("CREATE SCHEMA raced", "CREATE SCHEMA IF NOT EXISTS raced"),
    ("CREATE TABLE raced_t (id BIGINT)", "CREATE TABLE IF NOT EXISTS raced_t (id BIGINT)"),
])
def test_losing_a_create_if_not_exists_race_is_transient(pg_url: str, create: str,
                                                         loser: str) -> None:
    error = race(pg_url, create, loser)
    assert isinstance(error, psycopg.errors.UniqueViolation), error  # what PostgreSQL does
    assert classify(error) is Kind.TRANSIENT
    other = psycopg.errors.UniqueViolation("duplicate key value violates unique constraint")
    assert classify(other) is Kind.TERMINAL  # a user's own unique key stays terminal


def test_a_sink_that_loses_the_race_for_its_schema_delivers(tmp_path: Path, pg_url: str) -> None:
    with Engine(str(tmp_path / "s.duckdb")) as eng:
        eng.stream("src", {"id": "BIGINT"})
        sink = StreamToPostgres(eng, "src", pg_url, "fresh.src")
        for batch in range(3):
            eng.ingest("src", [(batch * 10 + i,) for i in range(10)])
        with psycopg.connect(pg_url) as other:
            other.execute("CREATE SCHEMA fresh")  # not committed yet: the sink's CREATE waits
            done: list[int] = []
            thread = threading.Thread(target=lambda: done.append(sink.run_once().rows))
            thread.start()
            time.sleep(0.5)
            other.commit()
            thread.join(60)
        assert done == [30]
        with psycopg.connect(pg_url) as con:
            assert con.execute("SELECT count(*) FROM fresh.src").fetchone() == (30,)
