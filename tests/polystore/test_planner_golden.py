"""Each planner rule against its golden SQL fixture (tests/fixtures/planner/<rule>.sql)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sstore.polystore.proposals import shape_key, with_cached, with_rows
from sstore.polystore.rules import CHECKS, REWRITES, RULES
from tests.planner_golden import fixtures, load


def test_every_rule_has_a_fixture() -> None:
    """``<rule>.sql``, and more cases as ``<rule>--<case>.sql``."""
    names = {p.stem.split("--")[0] for p in fixtures()}
    assert names == {rule.__name__ for rule in (*REWRITES, *RULES, *CHECKS)}
    assert all(load(p).rule == p.stem.split("--")[0] for p in fixtures())


@pytest.mark.parametrize("path", fixtures(), ids=lambda p: p.stem)
def test_rule_matches_golden_sql(path: Path) -> None:
    golden = load(path)
    assert golden.expected, f"{path.name} has no expected plans"
    assert golden.actual() == golden.expected


@pytest.mark.parametrize("path", fixtures(), ids=lambda p: p.stem)
def test_rules_are_pure(path: Path) -> None:
    """The same input gives equal plans twice (rules keep no state and touch no engine), and
    the input is left as it was."""
    golden = load(path)
    inp = golden.planning_input()
    before = (inp.tree.sql(), inp.objects, dict(inp.stats), dict(inp.cached))
    assert golden.actual() == golden.actual()
    for rule in (*REWRITES, *RULES):
        rule(inp)
    assert (inp.tree.sql(), inp.objects, dict(inp.stats), dict(inp.cached)) == before


@pytest.mark.parametrize("path", [p for p in fixtures() if "cached" in p.read_text()],
                         ids=lambda p: p.stem)
def test_cached_rows_set_after_proposing_match_the_rules(path: Path) -> None:
    """The planner proposes once, then sets each cached move's ``cached_rows``
    (``proposals.with_cached``): the same plans the rules make knowing the caches."""
    inp = load(path).planning_input()
    knowing = [p.describe(costs=False) for rule in RULES for p in rule(inp)]
    blind = [with_cached(p, inp.cached).describe(costs=False)
             for rule in RULES for p in rule(replace(inp, cached={}))]
    assert blind == knowing


@pytest.mark.parametrize("factor", [3, 1_000_003])
@pytest.mark.parametrize("path", fixtures(), ids=lambda p: p.stem)
def test_kept_proposals_restamped_with_new_rows_match_the_rules(path: Path, factor: int) -> None:
    """A repeated query runs the rules once per shape; later its kept proposals get the new
    row counts (``proposals.with_rows``): the plans the rules propose from the new counts,
    steps, final query and the island's memory check (factor 1,000,003 overflows it)."""
    inp = load(path).planning_input()
    for rewrite in REWRITES:
        inp = rewrite(inp)
    inp = replace(inp, cached={})
    grown = replace(inp, stats={f: replace(s, rows=s.rows * factor + 7 if s.rows > 0 else s.rows)
                                for f, s in inp.stats.items()})
    assert shape_key("q", inp) == shape_key("q", grown)
    kept = [p for rule in RULES for p in rule(inp)]
    restamped = [with_rows(p, grown) for p in kept]
    assert all(p is not None for p in restamped)
    fresh = [p for rule in RULES for p in rule(grown)]
    assert [p.describe(costs=False) for p in restamped if p is not None] == \
        [p.describe(costs=False) for p in fresh]
    assert [(p.feasible, p.why_not) for p in restamped if p is not None] == \
        [(p.feasible, p.why_not) for p in fresh]


@pytest.mark.parametrize("path", fixtures(), ids=lambda p: p.stem)
def test_a_shape_change_is_another_key(path: Path) -> None:
    """What the rules read besides row counts is in the key: an emptied fragment, other
    columns, a read-only engine, another budget, another query."""
    inp = load(path).planning_input()
    key = shape_key("q", inp)
    frag = next(iter(inp.stats))
    s = inp.stats[frag]
    assert shape_key("q2", inp) != key
    assert shape_key("q", replace(inp, stats={**inp.stats, frag: replace(
        s, rows=0 if s.rows else 5)})) != key
    assert shape_key("q", replace(inp, stats={**inp.stats, frag: replace(
        s, columns=[*s.columns, "extra"])})) != key
    assert shape_key("q", replace(inp, read_only=frozenset({frag.engine}))) != key
    assert shape_key("q", replace(inp, memory_budget_bytes=1)) != key
