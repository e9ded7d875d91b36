"""The model (issue 34, ``benchmarks.model``): random programs of ingests on every path, runs,
ad hoc transactions, consumers, GC, a PostgreSQL sink, ``sstore migrate``, by-hand changes to
the target, restarts, redeclarations and SIGKILLs at crash points, compared after every step
with a plain-Python model of what every stream, table and target must hold.

- ``test_random_programs_match_the_model``: the CI budget of random programs, every operation
  on, reproducible: ``SSTORE_MODEL_SEED`` (default 34) and ``SSTORE_MODEL_EXAMPLES``
  (programs, default 4); a violation fails with the shrunk program. It runs on a private
  PostgreSQL of this module's own (``private_pg``), which the programs stop and start; never
  on the shared server.
- ``test_step_kind``: PostgreSQL restarts, targets emptied by hand with and without
  ``accept_gap``, continuous sinks and sink groups, stops by SIGTERM and SIGINT, each in a
  short fixed program (``benchmarks.model.cases.KINDS``).
- ``test_issue_38_change``: evolutions, upgrades and a second writer that fences the sink
  (``benchmarks.model.changes``), in fixed programs (``benchmarks.model.cases.CHANGES``).
- ``test_issue_34_case``: each case of the issue's "What was seen" as the fixed program the
  model reaches it with (``benchmarks.model.cases``); ``test_found_by_the_model``: the same
  for what the model found beyond that list.
- The model's own comparison, on rows that differ by one lost, one duplicated and one changed
  value: a model that could not see them would prove nothing.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal

import pytest

from benchmarks.model.cases import CASES, CHANGES, FOUND, KINDS, run_case
from benchmarks.model.context import SWITCHES, Switches
from benchmarks.model.dataflow import make_record
from benchmarks.model.expected import Model, Observed, compare, enriched_rows, flagged_rows
from benchmarks.model.run import private_server, run_one
from migrators.embedded_postgres import PrivatePostgres

SEED = int(os.environ.get("SSTORE_MODEL_SEED", "34"))
EXAMPLES = int(os.environ.get("SSTORE_MODEL_EXAMPLES", "4"))


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    """A PostgreSQL of this module's own: the model stops and starts it."""
    with private_server() as server:
        yield server


def test_random_programs_match_the_model(private_pg: PrivatePostgres) -> None:
    ctx, failure, printed = run_one(private_pg.url, SEED, EXAMPLES, Switches(),
                                    server=private_pg)
    assert failure is None, f"seed {SEED}: {failure}\n{printed}"
    assert ctx.programs >= EXAMPLES and ctx.steps > 0


@pytest.mark.parametrize("case", sorted(KINDS))
def test_step_kind(case: str, private_pg: PrivatePostgres) -> None:
    """Each new step kind in a fixed program; the restarts and signals must land."""
    machine = run_case(private_pg.url, case, private_pg)
    assert machine.ctx.faults > 0 or case in ("truncated_target_gap", "truncated_while_attached",
                                                 "weak_restart_after_gc",
                                                 "weak_restart_then_read")


@pytest.mark.parametrize("case", sorted(CASES))
def test_issue_34_case(case: str, pg_url: str) -> None:
    run_case(pg_url, case)


@pytest.mark.parametrize("case", sorted(FOUND))
def test_found_by_the_model(case: str, pg_url: str) -> None:
    """What the random programs found beyond the issue's list, shrunk and written down."""
    run_case(pg_url, case)


@pytest.mark.parametrize("case", sorted(CHANGES))
def test_issue_38_change(case: str, pg_url: str) -> None:
    """Issue 38's steps (``benchmarks.model.changes``: an evolution, an upgrade, a second
    writer) in fixed programs, compared with the model after every step."""
    machine = run_case(pg_url, case)
    steps = machine.ctx.by_rule
    assert steps.get("evolve", 0) + steps.get("upgrade", 0) + \
        steps.get("second_writer", 0) + steps.get("append_columns", 0) > 0, steps


# ------------------------------------------------------------------ the comparison itself
def _model_and_observed() -> tuple[Model, Observed]:
    model = Model()
    batch = [make_record(1, 0, 1999, 600_000), make_record(2, 1, 13042, 0)]
    model.commit(2, batch)
    model.run_all()
    model.target = {row[0]: row for row in enriched_rows(batch)}
    model.delivered = 2
    seen = Observed(
        orders={2: Counter(tuple(r) for r in batch)},
        enriched={2: Counter(enriched_rows(batch))},
        flagged={2: Counter(flagged_rows(batch))},
        totals={0: (1, Decimal("19.99")), 1: (1, Decimal("130.42"))},
        archive=Counter(), notes=Counter(), target=Counter(model.target.values()),
        sink_acked=2, reader_acked=0, wal_bytes=0)
    return model, seen


def test_the_comparison_sees_lost_duplicated_and_changed_rows() -> None:
    model, seen = _model_and_observed()
    assert compare(model, seen, wal_limit=None) == []
    row = next(iter(seen.target))
    lost = Observed(**{**seen.__dict__, "target": seen.target - Counter([row])})
    assert any("1 missing" in p for p in compare(model, lost, wal_limit=None))
    doubled = Observed(**{**seen.__dict__, "enriched": {2: seen.enriched[2] + seen.enriched[2]}})
    assert any("enriched: batch 2 holds 2 unexpected" in p
               for p in compare(model, doubled, wal_limit=None))
    changed = Observed(**{**seen.__dict__, "totals": {**seen.totals, 0: (1, Decimal("20"))}})
    assert any(p.startswith("totals") for p in compare(model, changed, wal_limit=None))
    gone = Observed(**{**seen.__dict__, "flagged": {}})
    assert any("lost" in p for p in compare(model, gone, wal_limit=None))
    assert compare(model, Observed(**{**seen.__dict__, "wal_bytes": 10}), wal_limit=5)


def test_switches_name_known_operations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSTORE_MODEL_SKIP", "crash,wal")
    assert Switches.from_env().skip == {"crash", "wal"}
    monkeypatch.setenv("SSTORE_MODEL_SKIP", "no_such_rule")
    with pytest.raises(ValueError, match="no_such_rule"):
        Switches.from_env()
    assert "crash" in SWITCHES
