"""Runs the model's state machine (``benchmarks.model.machine``) for a number of programs or a
time budget, reproducibly from a seed, and reports programs, steps, faults and violations (with
the shrunk program of a violation as hypothesis prints it).

Each round is one hypothesis run of ``examples`` programs from seed ``seed + round``; rounds go
on until ``seconds`` have passed (at least one round). The first violation ends the run (its
program shrunk to a minimal one).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.internal.conjecture import engine as conjecture_engine
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from benchmarks.model import context as shared
from benchmarks.model.context import Context, Switches
from benchmarks.model.machine import ModelMachine

if TYPE_CHECKING:
    from migrators.embedded_postgres import PrivatePostgres

#: shrinking replays whole programs (restarts, child processes): bound it below hypothesis's
#: own five minutes (an internal knob; a run without it only shrinks for longer)
SHRINK_SECONDS = 120
if hasattr(conjecture_engine, "MAX_SHRINKING_SECONDS"):
    conjecture_engine.MAX_SHRINKING_SECONDS = SHRINK_SECONDS

#: steps per program: short programs find seams fast and shrink fast
STEPS = 30


@dataclass
class Report:
    seed: int
    seconds: float = 0.0
    rounds: int = 0
    programs: int = 0
    steps: int = 0
    faults: int = 0
    faults_by_kind: dict[str, int] = field(default_factory=dict)
    violations: int = 0
    postgres: str = ""
    skipped: list[str] = field(default_factory=list)
    by_rule: dict[str, int] = field(default_factory=dict)
    #: programs that ended at a loud refusal they cannot go past, and why
    stops: list[str] = field(default_factory=list)
    violation: str | None = None
    program: str | None = None  # the shrunk program, as hypothesis printed it

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def model_settings(examples: int, steps: int = STEPS, shrink: bool = True) -> settings:
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if shrink else [])
    return settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                    database=None, phases=phases, report_multiple_bugs=False,
                    suppress_health_check=list(HealthCheck), print_blob=False)


def run_one(url: str, seed: int, examples: int, switches: Switches,
            steps: int = STEPS, context: Context | None = None,
            printed: Callable[[str], None] | None = None,
            server: PrivatePostgres | None = None) -> tuple[Context, str | None, str]:
    """One hypothesis run; returns (counters, the violation or None, what hypothesis printed:
    the shrunk program). ``server``: the private PostgreSQL ``url`` is on (PostgreSQL
    restarts are then among the rules)."""
    ctx = context or Context(url, switches, server)
    shared.CONTEXT = ctx
    lines: list[str] = []

    def report(text: str) -> None:
        lines.append(str(text))
        if printed is not None:
            printed(str(text))

    def factory() -> ModelMachine:
        return ModelMachine()

    failure = None
    with with_reporter(report):
        try:
            run_state_machine_as_test(hypothesis_seed(seed)(factory),
                                      settings=model_settings(examples, steps))
        except Exception as exc:  # a Violation, or what no rule expects: also a finding
            failure = f"{type(exc).__name__}: {exc}"
            # hypothesis adds the shrunk program to the exception as notes
            lines.extend(getattr(exc, "__notes__", []))
    return ctx, failure, "\n".join(lines)


def run(url: str, seconds: float, seed: int, switches: Switches, examples: int = 5,
        steps: int = STEPS, server: PrivatePostgres | None = None) -> Report:
    report = Report(seed, skipped=sorted(switches.skip))
    ctx = Context(url, switches, server)
    began = time.monotonic()
    while True:
        ctx, failure, printed = run_one(url, seed + report.rounds, examples, switches, steps,
                                        ctx)
        report.rounds += 1
        if failure is not None:
            report.violations = 1
            report.violation = failure
            report.program = printed
            report.seed = seed + report.rounds - 1
            break
        if time.monotonic() - began >= seconds:
            break
    report.seconds = round(time.monotonic() - began, 1)
    report.programs, report.steps, report.faults = ctx.programs, ctx.steps, ctx.faults
    report.faults_by_kind = dict(sorted(ctx.fault_kinds.items()))
    report.postgres = "private (restarted by the model)" if server is not None else \
        "shared (never restarted)"
    report.by_rule = dict(sorted(ctx.by_rule.items()))
    report.stops = ctx.stops[:20]
    return report


# -------------------------------------------------------------- python -m benchmarks.chaos --model
def fresh_database(server_url: str) -> tuple[str, Callable[[], None]]:
    """A database of its own on the server at ``server_url``; returns its URL and a drop."""
    import os

    import psycopg
    from psycopg import sql

    from migrators.urls import with_database

    name = f"sstore_model_{os.getpid()}"
    with psycopg.connect(server_url, autocommit=True) as con:
        con.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        con.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop() -> None:
        with psycopg.connect(server_url, autocommit=True) as con:
            con.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))

    return with_database(server_url, name), drop


def print_report(report: Report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console() if Console().is_terminal else Console(width=160)
    table = Table(title=f"the model (seed {report.seed}, {report.seconds:g} s)")
    for name in ("programs", "steps", "faults injected", "violations"):
        table.add_column(name, justify="right")
    table.add_row(f"{report.programs:,}", f"{report.steps:,}", f"{report.faults:,}",
                  str(report.violations))
    console.print(table)
    console.print("faults by kind: " + (", ".join(f"{k} {n:,}" for k, n in
                                                  report.faults_by_kind.items()) or "none")
                  + f"; PostgreSQL: {report.postgres}")
    rules = Table(title="steps by operation")
    rules.add_column("operation")
    rules.add_column("steps", justify="right")
    for name, n in report.by_rule.items():
        rules.add_row(name, f"{n:,}")
    console.print(rules)
    for stop in dict.fromkeys(report.stops):
        console.print(f"a program stopped at a loud refusal: {stop}", soft_wrap=True,
                      markup=False, highlight=False)
    if report.skipped:
        console.print(f"left out (SSTORE_MODEL_SKIP): {', '.join(report.skipped)}")
    if report.violation:
        console.print(f"[bold red]violation (seed {report.seed}):[/]")
        console.print(report.violation, soft_wrap=True, markup=False, highlight=False)
        console.print(report.program or "", soft_wrap=True, markup=False, highlight=False)
    else:
        console.print("[bold green]0 violations: the system matched the model after every "
                      "step[/]")


def main(seconds: float, seed: int, server_url: str | None, out: str, examples: int = 5
         ) -> int:
    """``python -m benchmarks.chaos --model``: run, print, write ``chaos-model.json``; exit 1
    on a violation (its shrunk program printed). ``server_url`` None: a private PostgreSQL of
    the run's own, which the model stops and starts (``private_server``); a URL: a database
    of its own on that server, never restarted."""
    from benchmarks.common import machine_info
    from benchmarks.engine import write_report

    switches = Switches.from_env()
    with contextlib.ExitStack() as stack:
        server = None
        if server_url is None:
            server = stack.enter_context(private_server())
            server_url = server.url
        url, drop = fresh_database(server_url)
        try:
            report = run(url, seconds, seed, switches, examples, server=server)
        finally:
            drop()
    print_report(report)
    path = write_report({**report.to_dict(), "machine": machine_info()}, out, "chaos-model")
    print(f"wrote {path}")
    return 1 if report.violations else 0


@contextlib.contextmanager
def private_server() -> Iterator[PrivatePostgres]:
    """A private PostgreSQL in a temporary directory (outside pytest's ``tmp_path``: as root
    the server runs as another user, which must reach its data), stopped and deleted at the
    end. Never the machine's shared server: the model stops and starts it."""
    import shutil
    import tempfile
    from pathlib import Path

    from migrators.embedded_postgres import PrivatePostgres

    path = Path(tempfile.mkdtemp(prefix="sstore-model-pg-"))
    server = PrivatePostgres(path / "pg", settings={"fsync": "off"})
    try:
        yield server.start()
    finally:
        try:
            if server.is_running:
                server.stop("immediate")
        finally:
            shutil.rmtree(path, ignore_errors=True)
