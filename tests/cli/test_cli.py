"""The ``sstore`` command line: help, demo, status and query on real state files."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from sstore import Engine
from sstore.cli import main
from sstore.workloads.voter import VoterHalted, declare, generate_votes, run_voter

SSTORE = Path(sys.executable).parent / "sstore"
DEMO_ARGS = ["--votes", "3000", "--batch-size", "300", "--remove-every", "500", "--seed", "5"]


@pytest.fixture(scope="module")
def demo_state(tmp_path_factory) -> tuple[str, str]:
    """A state file made by ``sstore demo``, and what the demo printed."""
    path = str(tmp_path_factory.mktemp("cli") / "voter.duckdb")
    result = CliRunner().invoke(main, ["demo", *DEMO_ARGS, "--state", path])
    assert result.exit_code == 0, result.output
    return path, result.output


def test_help_reads_well_from_the_installed_script() -> None:
    done = subprocess.run([str(SSTORE), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "transactional streaming" in out and "S-Store" in out
    for command in ("demo", "status", "query"):
        assert f"\n  {command} " in out  # each command listed with its one-line description
    assert "Traceback" not in done.stderr


def test_each_command_has_help() -> None:
    runner = CliRunner()
    for command, words in (("demo", "--batch-size"), ("status", "--json"),
                           ("query", "--format"), ("resume", "PROCEDURE")):
        result = runner.invoke(main, [command, "--help"])
        assert result.exit_code == 0 and words in result.output
    assert "0.1.0" in runner.invoke(main, ["--version"]).output


def test_demo_prints_leaderboard_and_throughput(demo_state) -> None:
    _, output = demo_state
    assert "Leaderboard" in output
    assert "votes/s" in output and "transaction executions/s" in output
    assert "Votes: 3,000 new in 10 batches" in output
    assert "out at" in output  # removed contestants are shown as such
    assert "sstore status" in output


def test_demo_without_state_uses_a_temporary_file(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["demo", "--votes", "500", "--batch-size", "250"])
    assert result.exit_code == 0, result.output
    assert "temporary file" in result.output and "Leaderboard" in result.output
    assert os.listdir(tmp_path) == []


def test_demo_again_on_the_same_state_resumes(tmp_path) -> None:
    path = str(tmp_path / "v.duckdb")
    runner = CliRunner()
    first = runner.invoke(main, ["demo", "--votes", "600", "--batch-size", "200",
                                 "--state", path])
    assert first.exit_code == 0, first.output
    again = runner.invoke(main, ["demo", "--votes", "1000", "--batch-size", "200",
                                 "--state", path])
    assert again.exit_code == 0, again.output
    assert "Skipped 3 batches (600 votes) already in the state file" in again.output
    assert "Votes: 400 new in 2 batches" in again.output


def test_status_shows_the_dataflow(demo_state) -> None:
    path, _ = demo_state
    result = CliRunner().invoke(main, ["status", path])
    assert result.exit_code == 0, result.output
    out = result.output
    for name in ("validate_votes", "count_votes", "remove_lowest", "update_trending",
                 "votes → valid_votes, rejected_votes", "trending", "border", "window"):
        assert name in out
    assert "No errors recorded." in out


def test_status_json(demo_state) -> None:
    path, _ = demo_state
    result = CliRunner().invoke(main, ["status", path, "--json"])
    assert result.exit_code == 0, result.output
    status = json.loads(result.output)
    procs = {p["name"]: p for p in status["procedures"]}
    assert set(procs) == {"validate_votes", "count_votes", "remove_lowest", "update_trending"}
    assert procs["validate_votes"]["inputs"] == ["votes"]
    assert procs["validate_votes"]["outputs"] == ["valid_votes", "rejected_votes"]
    assert all(p["last_batch"] == 10 and p["halted"] is None for p in procs.values())
    streams = {s["name"]: s for s in status["streams"]}
    assert streams["votes"]["kind"] == "border" and streams["votes"]["last_batch"] == 10
    assert streams["trending"]["kind"] == "window"
    assert status["errors"] == []


def test_query_formats(demo_state) -> None:
    path, _ = demo_state
    runner = CliRunner()
    sql = "SELECT contestant, votes FROM vote_totals ORDER BY contestant"
    expected = duckdb.connect(path, read_only=True)
    try:
        rows = expected.execute(sql).fetchall()
    finally:
        expected.close()

    as_json = runner.invoke(main, ["query", path, sql, "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    assert [(r["contestant"], r["votes"]) for r in json.loads(as_json.output)] == rows

    as_csv = runner.invoke(main, ["query", path, sql, "--format", "csv"])
    assert as_csv.exit_code == 0, as_csv.output
    parsed = list(csv.reader(io.StringIO(as_csv.output)))
    assert parsed[0] == ["contestant", "votes"]
    assert [(int(a), int(b)) for a, b in parsed[1:]] == rows

    as_table = runner.invoke(main, ["query", path, sql])
    assert as_table.exit_code == 0, as_table.output
    assert "contestant" in as_table.output and f"({len(rows)} rows)" in as_table.output

    timestamps = runner.invoke(main, ["query", path, "SELECT ts, reason FROM vote_rejections "
                                      "ORDER BY vote_id LIMIT 1", "--format", "json"])
    assert json.loads(timestamps.output)[0]["ts"].startswith("2025-01-01T20:")


def test_query_refuses_writes_and_reports_sql_errors(demo_state) -> None:
    path, _ = demo_state
    runner = CliRunner()
    write = runner.invoke(main, ["query", path, "DELETE FROM vote_totals"])
    assert write.exit_code == 1 and "query failed" in write.output and "read-only" in write.output
    typo = runner.invoke(main, ["query", path, "SELEC 1"])
    assert typo.exit_code == 1 and "query failed" in typo.output
    assert "Traceback" not in write.output + typo.output


def test_status_shows_errors(tmp_path) -> None:
    path = str(tmp_path / "broken.duckdb")
    with Engine(path) as engine:
        declare(engine)
        engine.execute("DROP TABLE trending_leaderboard")  # update_trending fails on batch 1
        with pytest.raises(VoterHalted):
            run_voter(engine, generate_votes(200, seed=1), 100)
    result = CliRunner().invoke(main, ["status", path])
    assert result.exit_code == 0, result.output
    assert "Recent errors" in result.output and "halt" in result.output
    assert "trending_leaderboard" in result.output
    status = json.loads(CliRunner().invoke(main, ["status", path, "--json"]).output)
    assert [(e["procedure"], e["batch_id"], e["action"]) for e in status["errors"]] == \
        [("update_trending", 1, "halt")]


def test_demo_reports_a_halted_procedure(tmp_path) -> None:
    path = str(tmp_path / "broken.duckdb")
    con = duckdb.connect(path)  # a table the demo's declarations take as theirs, but which
    con.execute("CREATE TABLE phone_votes (phone BIGINT PRIMARY KEY, "  # refuses every vote
                "votes INTEGER NOT NULL CHECK (votes < 1))")
    con.close()
    result = CliRunner().invoke(main, ["demo", "--votes", "200", "--state", path])
    assert result.exit_code == 1
    assert "Error: voter procedure halted: validate_votes at batch 1" in result.output
    assert "Traceback" not in result.output


def test_demo_reports_sql_errors_without_traceback(tmp_path) -> None:
    path = str(tmp_path / "clash.duckdb")
    con = duckdb.connect(path)  # a view where the voter wants a table
    con.execute("CREATE VIEW contestants AS SELECT 1 AS contestant")
    con.close()
    result = CliRunner().invoke(main, ["demo", "--votes", "200", "--state", path])
    assert result.exit_code == 1
    assert "Error: " in result.output and "contestants is not" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [["status"], ["query", "SELECT 1"]])
def test_missing_state_file(tmp_path, command) -> None:
    missing = str(tmp_path / "nope.duckdb")
    args = [command[0], missing, *command[1:]]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert f"Error: no state file at {missing}" in result.output
    assert not os.path.exists(missing)  # reading never creates a file


def test_not_a_state_file(tmp_path) -> None:
    plain = str(tmp_path / "plain.duckdb")
    duckdb.connect(plain).close()
    result = CliRunner().invoke(main, ["status", plain])
    assert result.exit_code == 1 and "not an sstore state file" in result.output
    junk = tmp_path / "junk.duckdb"
    junk.write_text("not a database " * 200)
    result = CliRunner().invoke(main, ["query", str(junk), "SELECT 1"])
    assert result.exit_code == 1 and "not a DuckDB database" in result.output


def test_state_file_held_by_another_process(tmp_path) -> None:
    path = str(tmp_path / "held.duckdb")
    duckdb.connect(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys; con = duckdb.connect(sys.argv[1]); "
         "print('ready', flush=True); sys.stdin.read()", path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        for args in (["status", path], ["query", path, "SELECT 1"],
                     ["demo", "--votes", "10", "--state", path]):
            result = CliRunner().invoke(main, args)
            assert result.exit_code == 1, result.output
            assert "in use by another process" in result.output
            assert f"PID {holder.pid}" in result.output
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


def sstore_process(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own, importing this worktree's code."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "COLUMNS": "250"}  # tables unwrapped
    return subprocess.run([sys.executable, "-m", "sstore.cli", *args], check=False,
                          capture_output=True, text=True, env=env,
                          timeout=120)


def test_a_halt_shows_in_status_after_restart_until_sstore_resume(tmp_path) -> None:
    path = str(tmp_path / "halted.duckdb")
    votes = generate_votes(200, seed=1)
    with Engine(path) as engine:
        declare(engine)
        engine.execute("DROP TABLE trending_leaderboard")  # update_trending fails on batch 1
        with pytest.raises(VoterHalted):
            run_voter(engine, votes, 100)

    text = sstore_process("status", path)
    assert text.returncode == 0, text.stderr
    assert "halted: batch 1: CatalogException" in text.stdout
    procs = {p["name"]: p for p in json.loads(sstore_process("status", path, "--json").stdout)
             ["procedures"]}
    assert procs["update_trending"]["halted"].startswith("batch 1: CatalogException")
    assert [n for n, p in procs.items() if p["halted"]] == ["update_trending"]

    with Engine(path) as engine:  # a restart: declare() creates the table again (the fix)
        declare(engine)
        with pytest.raises(VoterHalted, match="update_trending at batch 1"):
            run_voter(engine, votes, 100)  # ... but the halt holds
        assert next(p for p in engine.status().procedures
                    if p.name == "update_trending").last_batch == 0

    unknown = sstore_process("resume", path, "no_such_procedure")
    assert unknown.returncode == 1
    assert ("has no procedure or consumer 'no_such_procedure'; procedures: validate_votes, "
            "count_votes") in unknown.stderr
    resumed = sstore_process("resume", path, "update_trending")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed 'update_trending' (was halted at batch 1: CatalogException" in resumed.stdout
    again = sstore_process("resume", path, "update_trending")
    assert again.returncode == 0 and "is not halted; nothing to resume" in again.stdout
    procs = {p["name"]: p for p in json.loads(sstore_process("status", path, "--json").stdout)
             ["procedures"]}
    assert all(p["halted"] is None for p in procs.values())

    with Engine(path) as engine:
        declare(engine)
        run_voter(engine, votes, 100)
        assert {p.name: p.last_batch for p in engine.status().procedures} == {
            "validate_votes": 2, "count_votes": 2, "remove_lowest": 2, "update_trending": 2}


def test_resume_needs_a_state_file_nobody_has_open(tmp_path) -> None:
    path = str(tmp_path / "busy.duckdb")
    missing = CliRunner().invoke(main, ["resume", path, "p"])
    assert missing.exit_code == 1 and f"no state file at {path}" in missing.output
    with Engine(path) as engine:
        declare(engine)
        engine.run_until_idle()
        busy = sstore_process("resume", path, "count_votes")
    assert busy.returncode == 1 and "in use by another process" in busy.stderr
    assert "Traceback" not in busy.stderr
