"""Issue 38, step 3: a second process delivering the same stream into the same target fences
the first; the older writer's next commit fails with a clear error and writes nothing.

Two processes can deliver the same stream (same engine identity) when a state file was
copied or restored and both copies run: the old primary, still alive, and its replacement.
Each writer takes a fence (the watermark row's ``epoch``) when it starts; a delivery checks
it under the row's lock, in the transaction of its rows (``migrators.delivery``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg

from sstore import Engine


class Writer:
    """A ``tests.fence_worker`` process, driven line by line."""

    def __init__(self, state: str, url: str, *options: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fence_worker", state, url, *options],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.ask(None) == "READY"

    def ask(self, command: str | None) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.ask("quit") if self.proc.poll() is None else None
        self.proc.wait(timeout=60)


def rows(url: str, table: str = "events") -> list[int]:
    with psycopg.connect(url) as con:
        return [r[0] for r in con.execute(f"SELECT id FROM {table} ORDER BY id").fetchall()]


def test_a_second_writer_fences_the_first(tmp_path: Path, pg_url: str) -> None:
    primary, standby = str(tmp_path / "a.duckdb"), str(tmp_path / "b.duckdb")
    with Engine(primary) as engine:
        engine.stream("events", {"id": "BIGINT"})
        engine.ingest("events", [(1,)], batch_id=1)
    shutil.copy(primary, standby)  # a restored copy: the same engine identity
    first = Writer(primary, pg_url)
    second = None
    try:
        assert first.ask("deliver") == "OK 1"
        second = Writer(standby, pg_url)
        assert second.ask("deliver") == "OK 0"  # claims: batch 1 is there already
        assert first.ask("ingest 2") == "OK"
        said = first.ask("deliver")
        assert said.startswith("ERR FencedError: events -> public.events"), said
        assert "another writer of this stream into public.events started after this one" in said
        assert "this writer wrote nothing" in said
        assert rows(pg_url) == [1]  # nothing of the fenced writer's batch 2
        assert first.ask("deliver").startswith("ERR FencedError")  # and it stays fenced
        assert second.ask("ingest 2") == "OK"
        assert second.ask("deliver") == "OK 3"
        assert rows(pg_url) == [1, 20, 21, 22]
        first.close()
        first = Writer(primary, pg_url)  # started again, it fences the other one
        assert first.ask("ingest 3") == "OK"
        assert first.ask("deliver") == "OK 3"
        assert second.ask("ingest 3") == "OK"
        assert second.ask("deliver").startswith("ERR FencedError")
        assert rows(pg_url) == [1, 20, 21, 22, 30, 31, 32]
    finally:
        first.close()
        if second is not None:
            second.close()


def test_a_sink_started_before_its_stream_was_produced_is_fenced(tmp_path: Path,
                                                                  pg_url: str) -> None:
    """A sink on an output stream with no rows yet (no schema, no target to create) takes the
    fence at its start all the same: a second writer started after it fences it, although
    neither had a target when it started."""
    primary, standby = str(tmp_path / "a.duckdb"), str(tmp_path / "b.duckdb")
    with Engine(primary) as engine:
        engine.stream("events", {"id": "BIGINT"})
    shutil.copy(primary, standby)
    first = Writer(primary, pg_url, "--output")
    second = None
    try:
        assert first.ask("deliver") == "OK 0"  # started: no schema, no target yet
        second = Writer(standby, pg_url, "--output")
        assert second.ask("deliver") == "OK 0"  # started after it: the newer writer
        assert first.ask("ingest 1") == "OK"
        said = first.ask("deliver")
        assert said.startswith("ERR FencedError: out -> public.out"), said
        with psycopg.connect(pg_url) as con:
            assert con.execute("SELECT to_regclass('public.out')").fetchone() == (None,)
        assert second.ask("ingest 1") == "OK"
        assert second.ask("deliver") == "OK 3"
        assert rows(pg_url, "out") == [10, 11, 12]
        assert first.ask("deliver").startswith("ERR FencedError")  # and it stays fenced
        assert rows(pg_url, "out") == [10, 11, 12]
    finally:
        first.close()
        if second is not None:
            second.close()

