"""Issue 38, step 5: upgrade a procedure at a batch boundary.

Batches before the boundary stay as version 1 made them, batches from it on run version 2;
the boundary is recorded (``sstore_sys.procedure_versions``) and shown in status; a SIGKILL at
the switch leaves one version for every batch; ``retire`` is "no successor"."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from sstore import Engine
from sstore.base.errors import DeclarationError
from sstore.cli import main as cli_main


def v1(tx, batch):
    tx.execute("INSERT INTO made SELECT ?, 'v1', x FROM batch", tx.batch_id)


def v2(tx, batch):
    tx.execute("INSERT INTO made SELECT ?, 'v2', x * 10 FROM batch", tx.batch_id)


def program(path: str, *, ingest: int = 0, run: bool = True, version: int = 1,
            upgrade_from: int | None | bool = False) -> list[tuple]:
    """Procedure ``tag`` (v1's code, or v2's with ``version=2``), optionally upgraded to v2
    (``upgrade_from``: False none, None the next batch, or a batch-id)."""
    with Engine(path) as engine:
        engine.stream("events", {"x": "INTEGER"})
        engine.execute("CREATE TABLE IF NOT EXISTS made (batch BIGINT, maker VARCHAR, x INTEGER)")
        engine.procedure(input="events", name="tag", version=version)(
            v2 if version == 2 else v1)
        if upgrade_from is not False:
            engine.upgrade("tag", v2, from_batch=upgrade_from)
        for _ in range(ingest):
            engine.ingest("events", [(len(engine.batches("events")) + 1,)])
        if run:
            engine.run_until_idle()
        return [tuple(r.values()) for r in engine.query(
            "SELECT batch, maker FROM made ORDER BY batch").to_pylist()]


def versions(path: str) -> list[tuple]:
    with Engine.open_existing(path) as engine:
        return [(v["version"], v["from_batch"], v["change"])
                for v in engine.procedure_versions("tag")]


def test_a_new_version_in_the_declaration_runs_from_the_next_batch(state_path: str) -> None:
    program(state_path, ingest=2)
    made = program(state_path, ingest=2, version=2)
    assert made == [(1, "v1"), (2, "v1"), (3, "v2"), (4, "v2")]
    assert versions(state_path) == [(1, 1, "created"),
        (2, 3, "version=2 declared")]
    assert program(state_path, ingest=1, version=2)[-1] == (5, "v2")  # no new version
    assert len(versions(state_path)) == 2
    with pytest.raises(DeclarationError, match=r"runs version 2 since batch 3.*declares "
                                               r"version 1: its code is older"):
        program(state_path, ingest=1)
    with Engine(state_path) as engine:
        engine.stream("events", {"x": "INTEGER"})
        engine.procedure(input="events", name="tag", version=2)(v2)
        shown = engine.status().procedures[0].versions
    assert [(v["version"], v["from_batch"]) for v in shown] == [(1, 1), (2, 3)]
    result = CliRunner().invoke(cli_main, ["status", state_path],  # the boundary, shown
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "v1 from batch 1: created" in result.output
    assert "v2 from batch 3: version=2 declared" in result.output


def test_an_explicit_upgrade_switches_at_its_boundary(state_path: str) -> None:
    program(state_path, ingest=2)
    program(state_path, ingest=3, run=False)  # batches 3, 4, 5 pending
    with pytest.raises(DeclarationError, match=r"committed batches through 2 with version 1"):
        program(state_path, upgrade_from=2)
    made = program(state_path, upgrade_from=5)
    assert made == [(1, "v1"), (2, "v1"), (3, "v1"), (4, "v1"), (5, "v2")]
    assert versions(state_path) == [(1, 1, "created"), (2, 5, "Engine.upgrade from batch 5")]
    assert program(state_path, ingest=1, upgrade_from=None)[-1] == (6, "v2")  # kept: a no-op
    with pytest.raises(DeclarationError, match=r"recorded from batch 5.*cannot move"):
        program(state_path, upgrade_from=7)
    assert program(state_path, ingest=1, version=2)[-1] == (7, "v2")  # or declare version=2
    assert len(versions(state_path)) == 2


def retire_tag(path: str, batch: int) -> None:
    with Engine(path) as engine:
        engine.stream("events", {"x": "INTEGER"})
        engine.retire("tag")
        engine.ingest("events", [(batch,)])


def test_retire_is_an_upgrade_with_no_successor(state_path: str) -> None:
    program(state_path, ingest=2)
    retire_tag(state_path, 3)
    assert versions(state_path) == [(1, 1, "created"), (2, 3, "retired")]


@pytest.mark.parametrize("point", ["upgrade.before_commit", "te.before_commit"])
def test_a_crash_during_the_switch_leaves_one_version_per_batch(state_path: str,
                                                                point: str) -> None:
    """SIGKILL before the version record commits: no switch, the old code still owns every
    batch; SIGKILL at the first batch v2 runs: the switch stands and v2 runs it again."""
    program(state_path, ingest=2)
    program(state_path, ingest=2, run=False)
    code = (f"from tests.engine.test_upgrades import program\n"
            f"program({state_path!r}, upgrade_from=4)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "SSTORE_CRASH_AT": point,
                                            "PYTHONPATH": os.getcwd()})
    assert done.returncode == -9, done.stderr
    recorded = versions(state_path)
    assert recorded == ([] if point == "upgrade.before_commit" else
                        [(1, 1, "created"), (2, 4, "Engine.upgrade from batch 4")])
    made = program(state_path, upgrade_from=4)
    assert made == [(1, "v1"), (2, "v1"), (3, "v1"), (4, "v2")]


def test_a_retired_procedure_declared_again_carries_on(state_path: str) -> None:
    program(state_path, ingest=1)
    retire_tag(state_path, 2)
    assert versions(state_path)[-1][2] == "retired"
    for _ in range(2):
        assert program(state_path, ingest=1)[-1][1] == "v1"
        assert versions(state_path) == []


def test_weak_durability_keeps_a_revival_in_its_snapshot(tmp_path) -> None:
    """Weak durability: a retired procedure declared again (each program checkpoints before
    the next starts, as it must); the record's removal must reach the snapshot at once, or a
    later start with batches in the log would have to make it again and refuse (the model
    found it)."""
    log = str(tmp_path / "in.log")

    def start(name: str, retire: str | None, batch: int, checkpoint: bool = True) -> list:
        with Engine(":memory:", input_log=log) as engine:
            engine.stream("events", {"x": "INTEGER"})
            engine.execute("CREATE TABLE IF NOT EXISTS made (batch BIGINT, maker VARCHAR, "
                           "x INTEGER)")
            if retire:
                engine.retire(retire)
            engine.procedure(input="events", name=name)(v1)
            engine.ingest("events", [(batch,)])
            engine.run_until_idle()
            if checkpoint:
                engine.checkpoint()
            return [v["change"] for v in engine.procedure_versions()]

    start("tag", None, 1)
    start("tag_v2", "tag", 2)
    start("tag", "tag_v2", 3)
    assert start("tag", "tag_v2", 4, checkpoint=False) == ["created", "retired"]
    assert start("tag", "tag_v2", 5) == ["created", "retired"]  # batch 4 in the log
