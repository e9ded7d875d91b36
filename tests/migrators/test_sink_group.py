"""A sink group: several sinks of one engine delivered in one PostgreSQL transaction.

What a user must be able to count on: every row of every member arrives exactly once, also
when a round fails halfway or the process is killed in the middle of one; the rows a batch
produced for several tables become visible together; a member that cannot deliver halts
alone and the others go on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from migrators import MigrationError, StreamToPostgres
from migrators.sink_runner import SinkGroup
from sstore import Engine, Transaction
from sstore.base.errors import DeclarationError

OUTPUTS = ("small", "large", "odd")


def declare(eng: Engine) -> None:
    """One procedure, three outputs: ids below 5, ids of 5 and above, odd ids (often empty)."""
    eng.stream("src", {"id": "BIGINT"})

    @eng.procedure(input="src", output=OUTPUTS)
    def split(tx: Transaction, batch: pa.Table) -> dict[str, pa.Table]:
        return {name: tx.sql(f"SELECT id FROM batch WHERE {cond}") for name, cond in
                (("small", "id % 10 < 5"), ("large", "id % 10 >= 5"), ("odd", "id % 7 = 1"))}


def sinks(eng: Engine, url: str, **options: object) -> list[StreamToPostgres]:
    return [StreamToPostgres(eng, name, url, f"g.{name}", **options)  # type: ignore[arg-type]
            for name in OUTPUTS]


def ids_of(batch: int) -> list[tuple[int]]:
    return [(batch * 10 + i,) for i in range(10)]


def expected(batches: int) -> dict[str, list[int]]:
    ids = [batch * 10 + i for batch in range(1, batches + 1) for i in range(10)]
    return {"small": [i for i in ids if i % 10 < 5], "large": [i for i in ids if i % 10 >= 5],
            "odd": [i for i in ids if i % 7 == 1]}


def tables(url: str, missing_ok: bool = False) -> dict[str, list[int]]:
    """Each target's ids; ``missing_ok``: a target never created (a member that halted
    before its first delivery) reads as empty."""
    with psycopg.connect(url) as con:
        made = {r[0] for r in con.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'g'")}
        return {name: [r[0] for r in con.execute(f"SELECT id FROM g.{name} ORDER BY id")]
                if name in made or not missing_ok else [] for name in OUTPUTS}


def feed_one_by_one(eng: Engine, group: SinkGroup, batches: range) -> None:
    """Attach ``group``, send ``batches`` waiting for each to reach PostgreSQL, detach."""
    group.attach()
    try:
        for batch in batches:
            eng.ingest_and_run("src", ids_of(batch))
            assert group.flush(timeout=30)
    finally:
        group.detach()


def transactions_per_batch(url: str) -> dict[int, set[str]]:
    """Batch -> the PostgreSQL transactions (xmin) its rows were written in, all tables."""
    out: dict[int, set[str]] = {}
    with psycopg.connect(url) as con:
        for name in OUTPUTS:
            for row_id, xmin in con.execute(f"SELECT id, xmin::text FROM g.{name}"):
                out.setdefault(row_id // 10, set()).add(xmin)
    return out


def test_a_batch_reaches_all_its_tables_in_one_transaction(tmp_path: Path, pg_url: str) -> None:
    with Engine(str(tmp_path / "s.duckdb")) as eng:
        declare(eng)
        group = SinkGroup(sinks(eng, pg_url))
        feed_one_by_one(eng, group, range(1, 21))
        assert tables(pg_url) == expected(20)
        # the first batch too: its first plan made the tables (the sinks had started before
        # the stream had rows), before the round that writes its rows
        assert group.rounds == 20
        assert group.one_by_one == 0
        per_batch = transactions_per_batch(pg_url)
        assert all(len(per_batch[b]) == 1 for b in range(1, 21))  # rounds: one each
        for sink in group.sinks:
            assert eng.acknowledged(sink.consumer) == 20  # every member told the engine


def test_members_alone_write_separate_transactions(tmp_path: Path, pg_url: str) -> None:
    """The control for the test above: without a group a batch's rows land in one
    transaction per table (so the xmin check there can fail)."""
    with Engine(str(tmp_path / "s.duckdb")) as eng:
        declare(eng)
        members = sinks(eng, pg_url)
        for sink in members:
            sink.attach()
        try:
            for batch in range(1, 6):
                eng.ingest_and_run("src", ids_of(batch))
                assert all(sink.flush(timeout=30) for sink in members)
        finally:
            for sink in members:
                sink.detach()
        assert tables(pg_url) == expected(5)
        assert all(len(xmins) == 3 for xmins in transactions_per_batch(pg_url).values())


@pytest.mark.parametrize("error", [psycopg.OperationalError("connection lost (test)"),
                                   RuntimeError("a bug in a hook (test)")])
def test_a_round_that_fails_before_commit_leaves_nothing_and_is_delivered_once(
        tmp_path: Path, pg_url: str, error: Exception) -> None:
    """The last member's hook fails once, after every member's rows and watermark were
    written in the round: nothing of the round may stay, and every row arrives once (a
    transient error retries the round; another error sends the members one by one)."""
    calls: list[int] = []
    failures = []

    def fail_once(con: psycopg.Connection) -> None:
        calls.append(1)
        if len(calls) == 3:  # batches 1, 2 and 3 in rounds
            with con.cursor() as cur:  # the round's rows are there, uncommitted
                cur.execute("SELECT count(*) FROM g.small WHERE id >= 30")
                failures.append(cur.fetchone())
            raise error

    with Engine(str(tmp_path / "s.duckdb")) as eng:
        declare(eng)
        members = sinks(eng, pg_url)
        members[-1].before_commit = fail_once
        group = SinkGroup(members)
        feed_one_by_one(eng, group, range(1, 9))
        assert failures and failures[0][0] > 0
        assert tables(pg_url) == expected(8)
        assert all(sink.halted is None for sink in members)
        assert group.one_by_one == (1 if isinstance(error, RuntimeError) else 0)


def test_a_member_that_cannot_deliver_halts_alone(tmp_path: Path, pg_url: str) -> None:
    """A target the user changed so that the rows no longer fit (its column made a
    SMALLINT while ids grow past it): that member halts with the error, the others get every
    batch, and the halted member's batches stay held in the engine for a later resume."""
    with Engine(str(tmp_path / "s.duckdb")) as eng:
        declare(eng)
        members = sinks(eng, pg_url)
        group = SinkGroup(members)
        group.attach()
        try:
            eng.ingest_and_run("src", ids_of(1))
            assert group.flush(timeout=30)
            with psycopg.connect(pg_url) as con:
                con.execute("ALTER TABLE g.large ALTER COLUMN id TYPE SMALLINT")
            for batch in (2, 3, 4000):  # batch 4000's ids do not fit a SMALLINT
                eng.ingest_and_run("src", ids_of(batch))
            with pytest.raises(Exception, match="halted"):
                group.flush(timeout=30)
            assert members[0].flush(timeout=30) and members[2].flush(timeout=30)
        finally:
            group.detach()
        got = tables(pg_url)
        assert members[1].halted is not None and members[0].halted is None
        want = {name: [i for i in ids if i // 10 in (1, 2, 3, 4000)]
                for name, ids in expected(4000).items()}
        assert got["small"] == want["small"] and got["odd"] == want["odd"]
        assert got["large"] == [i for i in want["large"] if i // 10 < 4000] or \
            got["large"] == [i for i in want["large"] if i // 10 < 2]
        assert eng.acknowledged(members[1].consumer) < 4000  # still held for a resume


def test_a_backlog_is_moved_member_by_member_exactly_once(tmp_path: Path, pg_url: str) -> None:
    with Engine(str(tmp_path / "s.duckdb")) as eng:
        declare(eng)
        members = sinks(eng, pg_url, chunk_rows=12)  # several chunks pending per member
        group = SinkGroup(members)
        for batch in range(1, 31):
            eng.ingest_and_run("src", ids_of(batch))
        group.attach()
        try:
            assert group.flush(timeout=60)
            eng.ingest_and_run("src", ids_of(31))  # then the steady state: one round
            assert group.flush(timeout=30)
        finally:
            group.detach()
        assert tables(pg_url) == expected(31)
        assert group.one_by_one >= 1 and group.rounds >= 1


def test_a_group_is_declared_over_one_engine_and_one_database(tmp_path: Path,
                                                              pg_url: str) -> None:
    with Engine(str(tmp_path / "a.duckdb")) as eng, Engine(str(tmp_path / "b.duckdb")) as other:
        declare(eng)
        declare(other)
        with pytest.raises(DeclarationError, match="at least one"):
            SinkGroup([])
        with pytest.raises(DeclarationError, match="same engine"):
            SinkGroup([sinks(eng, pg_url)[0], sinks(other, pg_url)[1]])
        with pytest.raises(DeclarationError, match="one PostgreSQL database"):
            SinkGroup([StreamToPostgres(eng, "small", pg_url, "g.small"),
                       StreamToPostgres(eng, "large", pg_url + "&application_name=x"
                                        if "?" in pg_url else pg_url + "?application_name=x",
                                        "g.large")])
        with pytest.raises(DeclarationError, match="each target table once"):
            SinkGroup([StreamToPostgres(eng, "small", pg_url, "g.t"),
                       StreamToPostgres(eng, "large", pg_url, "g.t")])
        alone = StreamToPostgres(eng, "odd", pg_url, "g.odd")
        alone.attach()
        try:  # two threads would feed it
            with pytest.raises(MigrationError, match="attached on its own"):
                SinkGroup([StreamToPostgres(eng, "small", pg_url, "g.small2"), alone]).attach()
        finally:
            alone.detach()


KILLED_CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[3])
    from sstore import Engine
    from migrators.sink_runner import SinkGroup
    from tests.migrators.test_sink_group import declare, ids_of, sinks

    path, url = sys.argv[1], sys.argv[2]
    eng = Engine(path)
    declare(eng)
    members = sinks(eng, url)
    calls = []

    def kill_in_round(con):
        calls.append(1)
        if len(calls) == 6:  # the sixth round, after every member's rows, before COMMIT
            os.kill(os.getpid(), signal.SIGKILL)

    members[-1].before_commit = kill_in_round
    group = SinkGroup(members)
    group.attach()
    for batch in range(1, 7):
        eng.ingest_and_run("src", ids_of(batch))
        group.flush(timeout=30)
    sys.exit(3)  # not reached: killed in the sixth round
""")


def test_sigkill_in_the_middle_of_a_round_loses_and_doubles_nothing(tmp_path: Path,
                                                                    pg_url: str) -> None:
    script = tmp_path / "child.py"
    script.write_text(KILLED_CHILD)
    path = str(tmp_path / "s.duckdb")
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, str(script), path, pg_url, root], timeout=120,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == -signal.SIGKILL, done.stderr
    before = tables(pg_url)
    assert before == expected(5)  # rounds 1-5 committed, the sixth left nothing
    with Engine(path) as eng:
        declare(eng)
        group = SinkGroup(sinks(eng, pg_url))
        group.attach()
        try:
            for batch in range(7, 13):  # batch 6 is in the engine, not yet delivered
                eng.ingest_and_run("src", ids_of(batch))
            assert group.flush(timeout=30)
        finally:
            group.detach()
    assert tables(pg_url) == expected(12)


def test_rows_one_member_cannot_convert_halt_that_member_only(tmp_path: Path,
                                                               pg_url: str) -> None:
    """A member's rows fail to convert for its target (``IncompatibleSchemaError``, raised
    here by a fault injected into that member from batch 3 on): before its round is sent, so
    the round is not attempted; the member halts alone, the others get every batch."""
    from migrators import IncompatibleSchemaError

    with Engine(str(tmp_path / "s.duckdb")) as eng:
        declare(eng)
        members = sinks(eng, pg_url)
        convert = members[1].side.rows_for_target

        def failing(rows: pa.Table, watermark: int, types: object = None) -> pa.Table:
            # any row of batch 3 or later: on a busy machine one chunk can hold batches 1-5
            if rows.num_rows and pc.max(rows["_batch_id"]).as_py() >= 3:
                raise IncompatibleSchemaError("column 'id': values do not fit (test)")
            return convert(rows, watermark, types)  # type: ignore[arg-type]

        members[1].side.rows_for_target = failing  # type: ignore[method-assign]
        group = SinkGroup(members)
        group.attach()
        try:
            for batch in range(1, 6):
                eng.ingest_and_run("src", ids_of(batch))
            assert members[0].flush(timeout=30) and members[2].flush(timeout=30)
        finally:
            group.detach()
        assert members[1].halted is not None and "do not fit" in members[1].halted
        assert members[0].halted is None and members[2].halted is None
        got, want = tables(pg_url, missing_ok=True), expected(5)
        assert got["small"] == want["small"] and got["odd"] == want["odd"]
        # it halted at the first chunk holding batch 3 or later (a chunk may start earlier)
        assert got["large"] == want["large"][:len(got["large"])]
        assert len(got["large"]) < len(want["large"])
        assert eng.acknowledged(members[1].consumer) < 5  # the rest stays held
