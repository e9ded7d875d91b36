"""The command line as a user meets it: one --postgres everywhere, logs on stderr as text or
JSON lines, --json results, every environment variable in one table, queries that read no
table, a missing catalog, parse errors in one line, and catalogs without engine internals."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from migrators.urls import DEFAULT_URL
from sstore import Engine
from sstore.cli import main
from sstore.cli.environment import VARIABLES
from sstore.cli.options import POSTGRES_HELP
from tests.cli.test_cli_dead_letters import dead_lettered, program

ROOT = Path(__file__).resolve().parents[2]
WAREHOUSE_COMMANDS = {("migrate",), ("tpcdi", "run"), ("tpcdi", "audit"), ("tpcdi", "demo"),
                      ("icu", "demo"), ("backfill", "run"), ("backfill", "status"),
                      ("polystore", "add-postgres"), ("polystore", "calibrate")}


def sstore(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "COLUMNS": "200", **env,
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "sstore.cli", *args], capture_output=True,
                          text=True, env=full, cwd=cwd, timeout=300, check=False)


def commands(group: click.Group, path: tuple[str, ...] = ()) -> dict[tuple[str, ...],
                                                                     click.Command]:
    found: dict[tuple[str, ...], click.Command] = {}
    for name, command in group.commands.items():
        found[(*path, name)] = command
        if isinstance(command, click.Group):
            found |= commands(command, (*path, name))
    return found


# ------------------------------------------------------------------ help and options
def test_help_lists_every_command_the_root_options_and_the_environment() -> None:
    done = sstore("--help")
    assert done.returncode == 0, done.stderr
    for command in ("demo", "status", "resume", "query", "migrate", "consumers", "polystore",
                    "tpcdi", "dead-letters", "postgres", "backfill"):
        assert f"\n  {command} " in done.stdout, command
    for option in ("-v, --verbose", "--log-level", "--log-format [text|json]"):
        assert option in done.stdout
    for variable in VARIABLES:
        assert f"\n    {variable.name} " in done.stdout, variable.name
    assert max(len(line) for line in done.stdout.splitlines()) <= 100


def test_help_imports_no_workload_and_no_database_client() -> None:
    """``sstore --help`` stays fast: the commands import their libraries when they run."""
    code = ("import sys\nsys.argv = ['sstore', '--help']\nfrom sstore.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'pyspark', "
            "'migrators', 'sqlglot', 'adbc_driver_postgresql') or m.startswith("
            "('sstore.workloads', 'sstore.polystore'))), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=True)
    assert done.stderr.strip() == "[]"


def test_every_warehouse_command_has_the_same_postgres_option() -> None:
    with_postgres = {}
    for path, command in commands(main).items():
        for param in command.params:
            if "--postgres" in getattr(param, "opts", ()):
                with_postgres[path] = param
    assert set(with_postgres) == WAREHOUSE_COMMANDS
    for path, param in with_postgres.items():
        assert (param.name, param.envvar, param.default, param.required) == \
            ("url", "SSTORE_POSTGRES_URL", None, False), path
        assert param.help == POSTGRES_HELP, path
    assert DEFAULT_URL in POSTGRES_HELP and "sstore postgres --help" in POSTGRES_HELP


def test_the_readme_and_the_help_list_every_variable_the_code_reads() -> None:
    documented = {v.name for v in VARIABLES}
    section = (ROOT / "README.md").read_text().split("## Configuration", 1)[1]
    in_readme = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", section, re.MULTILINE))
    assert in_readme == documented
    patterns = (r"[\"'](SSTORE_[A-Z0-9_]+)[\"']", r"\$\{?(SSTORE_[A-Z0-9_]+)",
                r"(?:environ\.get|getenv|env\.get|environ\.setdefault)\(\s*[\"']([A-Z][A-Z0-9_]+)",
                r"environ\[\s*[\"']([A-Z][A-Z0-9_]+)[\"']")
    read: dict[str, set[str]] = {}
    sources = [*ROOT.glob("sstore/**/*.py"), *ROOT.glob("migrators/*.py"),
               *ROOT.glob("dags/*.py"), *ROOT.glob("scripts/*.sh")]
    for source in sources:
        text = source.read_text()
        for pattern in patterns:
            for name in re.findall(pattern, text):
                read.setdefault(name, set()).add(str(source.relative_to(ROOT)))
    assert {"SSTORE_POSTGRES_URL", "SSTORE_VENV", "JAVA_HOME"} <= set(read)
    assert {n: sorted(w) for n, w in read.items() if n not in documented} == {}


# ------------------------------------------------------------------ logs
def test_logs_go_to_stderr_as_text_or_json_lines(tmp_path: Path) -> None:
    path = dead_lettered(str(tmp_path / "trades.duckdb"), fix=False)

    quiet = sstore("dead-letters", "replay", path, "trades", "--batch", "1")
    assert quiet.returncode == 0 and quiet.stderr == ""  # warning level: nothing to say

    text = sstore("-v", "dead-letters", "replay", path, "trades", "--batch", "3")
    assert text.returncode == 0, text.stderr
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO sstore\.dead_letters: "
                     r"replayed dead letters of trades batch 3 \(1 rows, procedure count\) "
                     r"as batch 6$", text.stderr, re.MULTILINE), text.stderr

    with program(path, run=False) as eng:  # the batches fail again: two more dead letters
        eng.run_until_idle()
    as_json = sstore("--log-format", "json", "--log-level", "info", "dead-letters", "replay",
                     path, "trades", "--json")
    assert as_json.returncode == 0, as_json.stderr
    lines = [json.loads(line) for line in as_json.stderr.splitlines()]
    assert [(e["level"], e["logger"], e["from_batch"], e["batch_id"]) for e in lines] == \
        [("info", "sstore.dead_letters", 5, 7), ("info", "sstore.dead_letters", 6, 8)]
    assert {"time", "level", "logger", "message", "input", "procedure", "rows"} <= set(lines[0])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", lines[0]["time"])
    assert [r["batch_id"] for r in json.loads(as_json.stdout)] == [7, 8]  # stdout: the result


def test_json_logs_leave_no_progress_bar_on_stderr(tmp_path: Path, pg_url: str) -> None:
    path = str(tmp_path / "s.duckdb")
    with Engine(path) as eng:
        eng.stream("out", {"id": "BIGINT"})
        eng.ingest("out", [(1,), (2,)])
    done = sstore("--log-format", "json", "migrate", path, "--stream", "out", "--table",
                  "public.t", "--postgres", pg_url, "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and json.loads(done.stdout)["rows"] == 2


# ------------------------------------------------------------------ --json results
def test_resume_and_polystore_list_as_json(tmp_path: Path) -> None:
    path = str(tmp_path / "halt.duckdb")
    with Engine(path) as eng:
        eng.stream("s", {"x": "INTEGER"})

        @eng.procedure(input="s", retries=0)
        def boom(tx, batch):
            raise ValueError("boom")

        eng.ingest("s", [(1,)])
        eng.run_until_idle()
    resumed = json.loads(sstore("resume", path, "boom", "--json").stdout)
    assert resumed["resumed"] is True and resumed["was_halted_at"] == "batch 1: ValueError: boom"
    again = json.loads(sstore("resume", path, "boom", "--json").stdout)
    assert again["resumed"] is False and again["was_halted_at"] is None

    catalog = str(tmp_path / "c.json")
    assert sstore("polystore", "add-engine", "eng", path, "--catalog", catalog).returncode == 0
    listed = json.loads(sstore("polystore", "list", "--catalog", catalog, "--json").stdout)
    assert listed["engines"] == [{"name": "eng", "kind": "streaming", "location": path}]
    assert [o["name"] for o in listed["objects"]] == ["s"]


def test_calibrate_as_json(tmp_path: Path, pg_url: str) -> None:
    out = tmp_path / "costs.json"
    done = sstore("polystore", "calibrate", "--postgres", pg_url, "--rows", "1000",
                  "--output", str(out), "--json", "--catalog", str(tmp_path / "c.json"))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["path"] == str(out) and json.loads(out.read_text())["fixed"] == \
        result["fixed"]
    assert set(result["fixed"]) >= {"streaming", "postgres", "island"}


# ------------------------------------------------------------------ queries and catalogs
def test_a_query_that_reads_no_table_runs_in_the_island(tmp_path: Path) -> None:
    done = sstore("query", "SELECT 1 AS one, 'a' || 'b' AS ab", "--format", "json",
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [{"one": 1, "ab": "ab"}]
    plain = sstore("query", "SELECT 1", cwd=tmp_path)
    assert plain.returncode == 0 and "(1 row)" in plain.stdout
    explained = sstore("query", "--explain", "SELECT 1", cwd=tmp_path)
    assert "run in island" in explained.stdout
    assert os.listdir(tmp_path) == []  # no catalog file was made for it


def test_a_missing_catalog_says_so(tmp_path: Path) -> None:
    for args in (["query", "SELECT * FROM orders"], ["polystore", "list"]):
        done = sstore(*args, cwd=tmp_path)
        assert done.returncode == 1
        assert done.stderr.startswith("Error: no catalog at sstore-catalog.json: create one "
                                      "with `sstore polystore add-postgres"), done.stderr


@pytest.mark.parametrize("sql, says", [
    ("SELECT * FROM orders WHERE", "at line 1, column 26 (near 'WHERE'): WHERE is incomplete"),
    ("SELEC 1 FROM orders", "at line 1, column 7 (near '1'): unexpected token"),
    ("SELECT (1 FROM orders", "at line 1, column 14 (near 'FROM'): expected )"),
    ("SELECT 1 +", "at line 1, column 10 (near '+'): + is incomplete"),
    ("SELECT \"a FROM orders", ": a quote or comment is not closed, or a character is not SQL"),
])
def test_parse_errors_are_one_readable_line(tmp_path: Path, sql: str, says: str) -> None:
    done = sstore("query", sql, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == f"Error: cannot parse the query {says}\n".replace("query :", "query:")
    assert "sqlglot" not in done.stderr and "<class" not in done.stderr


def test_add_engine_registers_no_engine_internals(tmp_path: Path) -> None:
    path = str(tmp_path / "s.duckdb")
    with Engine(path) as eng:
        eng.stream("votes", {"x": "INTEGER"})
        eng.window("recent", "votes", rows=5)
        eng.execute("CREATE TABLE totals (n INTEGER)")

        @eng.procedure(input="votes", on_error="dead_letter", retries=0)
        def count(tx, batch):
            raise ValueError("always")

        eng.ingest("votes", [(1,)])
        eng.run_until_idle()
        tables = {r["table_name"] for r in eng.query(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").to_pylist()}
    assert {"recent__rows", "votes__dead_letter"} <= tables
    catalog = str(tmp_path / "c.json")
    done = sstore("polystore", "add-engine", "eng", path, "--catalog", catalog)
    assert done.returncode == 0 and "eng: 3 tables and streams registered" in done.stdout
    objects = json.loads(Path(catalog).read_text())["objects"]
    assert sorted(o["name"] for o in objects) == ["recent", "totals", "votes"]


def test_tpcdi_run_as_json(tmp_path: Path, pg_url: str, spark) -> None:
    from sstore.workloads.tpcdi.generator import generate

    data = tmp_path / "tpcdi"
    generate(0.01, data, seed=1)
    result = CliRunner().invoke(main, ["tpcdi", "run", "--input", str(data), "--postgres",
                                       pg_url, "--batch-size", "500", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # the phase bars went to stderr
    assert report["mode"] == "streaming" and report["events"] > 0
    assert report["seconds"] > 0 and "dimensions (Spark)" in report["phases"]
