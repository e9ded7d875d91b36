"""One runner drives one sink and a group of sinks the same way (issue 34, "one sink runner").

``StreamToPostgres`` says what to write and starts no thread; ``migrators.sink_runner`` feeds
one sink (``sink.attach()`` builds a runner of one) or several (``SinkGroup``). What a user
must be able to count on, whichever way a sink is fed: a transient failure is retried and
every row still arrives exactly once; a terminal one halts that sink only, is shown in the
engine's status and in the sink's metrics, and makes ``flush`` raise it instead of waiting.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from migrators import MigrationError, SinkGroup, SinkRunner, StreamToPostgres
from migrators.postgres import RetryPolicy
from sstore import Engine
from sstore.base.errors import TransientError

ROOT = Path(__file__).resolve().parents[2]
MODES = ("one", "group", "group of one")
FAST = dict(first_delay=0.01, max_delay=0.05)


def ids(url: str, table: str) -> list[int]:
    with psycopg.connect(url) as con:
        return [r[0] for r in con.execute(f"SELECT id FROM {table} ORDER BY id")]


@contextmanager
def fed(eng: Engine, url: str, mode: str,
        before_commit: Callable[[psycopg.Connection], None] | None = None
        ) -> Iterator[list[StreamToPostgres]]:
    """Sink ``r.a`` of stream ``a`` fed on its own (``mode`` "one": ``attach``), in a group
    with sink ``r.b`` of stream ``b`` ("group": ``SinkGroup``) or in a group alone ("group of
    one", which delivers in rounds too); detached on the way out."""
    eng.stream("a", {"id": "BIGINT"})
    eng.stream("b", {"id": "BIGINT"})
    sinks = [StreamToPostgres(eng, "a", url, "r.a", before_commit=before_commit,
                              retry=RetryPolicy(attempts=1, **FAST))]  # type: ignore[arg-type]
    if mode == "one":
        sinks[0].attach()
        try:
            yield sinks
        finally:
            sinks[0].detach(flush_seconds=1)
        return
    if mode == "group":
        sinks.append(StreamToPostgres(eng, "b", url, "r.b",
                                      retry=RetryPolicy(attempts=1, **FAST)))  # type: ignore
    group = SinkGroup(sinks)
    group.attach()
    try:
        yield sinks
    finally:
        group.detach(flush_seconds=1)


def ingest(eng: Engine, mode: str, values: list[int]) -> None:
    for v in values:
        eng.ingest("a", [(v,)])
        if mode == "group":
            eng.ingest("b", [(v,)])


@pytest.mark.parametrize("mode", MODES)
def test_a_transient_error_is_retried_and_every_row_arrives_once(
        mode: str, state_path: str, pg_url: str) -> None:
    failed: list[int] = []

    def flaky(_con: psycopg.Connection) -> None:  # PostgreSQL goes away before two COMMITs
        if len(failed) < 2:
            failed.append(1)
            raise TransientError("server closed the connection unexpectedly (test)")

    with Engine(state_path) as eng, fed(eng, pg_url, mode, flaky) as sinks:
        ingest(eng, mode, [1, 2, 3, 4])
        assert sinks[0].flush(timeout=30)
        assert all(s.flush(timeout=30) for s in sinks)
        assert len(failed) == 2
        assert all(s.halted is None and s.last_error is None for s in sinks)
        snapshot = sinks[0].metrics_snapshot()
        assert snapshot.running and snapshot.background and snapshot.rows == 4
    assert ids(pg_url, "r.a") == [1, 2, 3, 4]
    if mode == "group":
        assert ids(pg_url, "r.b") == [1, 2, 3, 4]


@pytest.mark.parametrize("mode", MODES)
def test_a_terminal_error_halts_the_sink_shows_in_status_and_flush_raises_it(
        mode: str, state_path: str, pg_url: str) -> None:
    with Engine(state_path) as eng, fed(eng, pg_url, mode) as sinks:
        ingest(eng, mode, [1])
        assert all(s.flush(timeout=30) for s in sinks)
        with psycopg.connect(pg_url) as con:  # someone makes the target unable to take rows
            con.execute("ALTER TABLE r.a ADD CONSTRAINT small CHECK (id < 100)")
        ingest(eng, mode, [500, 2])
        with pytest.raises(MigrationError, match="halted.*small"):
            sinks[0].flush(timeout=30)
        assert sinks[0].halted and "check constraint" in sinks[0].halted
        status = eng.status()
        halted = {c.consumer: c.halted for c in status.consumers}
        assert halted["migrator:r.a"] and "check constraint" in halted["migrator:r.a"]
        assert any(e["procedure"] == "migrator:r.a" and e["action"] == "halt"
                   for e in status.errors)
        assert sinks[0].metrics_snapshot().halted == sinks[0].halted
        if mode == "group":  # the other sink goes on; the group's flush raises the halt
            assert sinks[1].flush(timeout=30) and sinks[1].halted is None
            assert halted["migrator:r.b"] is None
            with pytest.raises(MigrationError, match="halted"):
                sinks[1].runner.flush(timeout=5)  # type: ignore[union-attr]
    assert ids(pg_url, "r.a") == [1]
    if mode == "group":
        assert ids(pg_url, "r.b") == [1, 2, 500]


@pytest.mark.parametrize("mode", MODES)
def test_attach_is_refused_twice_and_detach_lets_go(mode: str, state_path: str,
                                                    pg_url: str) -> None:
    """A sink is fed by one runner at a time (two would deliver its batches twice over)."""
    with Engine(state_path) as eng:
        with fed(eng, pg_url, mode) as sinks:
            runner = sinks[0].runner
            assert runner is not None and runner.attached and runner.threaded
            with pytest.raises(MigrationError, match="attached"):
                sinks[0].attach()
            with pytest.raises(MigrationError, match="attached"):
                SinkRunner([sinks[-1]]).attach()
        assert all(s.runner is None and s.after is None for s in sinks)
        assert not runner.attached
        snapshot = sinks[0].metrics_snapshot()
        assert not snapshot.running and not snapshot.background


def test_a_sink_fed_in_the_committing_thread_raises_instead_of_halting(
        state_path: str, pg_url: str) -> None:
    """``run_pending`` in the caller's thread: a terminal error is the caller's to see (as
    before the runner), not a halt."""
    with Engine(state_path) as eng:
        eng.stream("a", {"id": "BIGINT"})
        sink = StreamToPostgres(eng, "a", pg_url, "r.a")
        eng.ingest("a", [(1,)])
        assert sink.run_pending() == 1
        with psycopg.connect(pg_url) as con:
            con.execute("ALTER TABLE r.a ADD CONSTRAINT small CHECK (id < 100)")
        eng.ingest("a", [(500,)])
        with pytest.raises(MigrationError, match="small"):
            sink.run_pending()
        assert sink.halted is None and eng.consumer_halt(sink.consumer) is None
        sink.detach()


# ------------------------------------------------------------------------------ the shape
def test_the_sink_starts_no_thread_and_nobody_reaches_into_it() -> None:
    """``engine_to_postgres`` and ``sink_target`` (the sink's side of its table) create no
    thread (the runner does), and none of them nor the runner uses a private name of an object
    other than ``self``: what the runner needs of a sink is a public method (``plan``,
    ``read``, ``move_chunk``, ``delivered``, ``halt``, ``side.write``, ...)."""
    for name in ("engine_to_postgres.py", "sink_target.py"):
        tree = ast.parse((ROOT / "migrators" / name).read_text(encoding="utf-8"))
        threads = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                   and n.attr in ("Thread", "ThreadPoolExecutor", "Timer")]
        assert not threads, f"{name} starts threads at lines {threads}"
    for name in ("engine_to_postgres.py", "sink_target.py", "sink_runner.py"):
        path = ROOT / "migrators" / name
        tree = ast.parse(path.read_text(encoding="utf-8"))
        reach_ins = [f"{name}:{n.lineno}: {ast.unparse(n)}" for n in ast.walk(tree)
                     if isinstance(n, ast.Attribute) and n.attr.startswith("_")
                     and not n.attr.startswith("__")
                     and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))]
        assert not reach_ins, "private names of another object:\n" + "\n".join(reach_ins)
