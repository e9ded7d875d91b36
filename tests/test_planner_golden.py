"""Each planner rule against its golden SQL fixture (tests/fixtures/planner/<rule>.sql)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sstore.polystore.polystore import _with_cached
from sstore.polystore.rules import REWRITES, RULES
from tests.planner_golden import fixtures, load


def test_every_rule_has_a_fixture() -> None:
    """``<rule>.sql``, and more cases as ``<rule>--<case>.sql``."""
    names = {p.stem.split("--")[0] for p in fixtures()}
    assert names == {rule.__name__ for rule in (*REWRITES, *RULES)}
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
    (``polystore._with_cached``): the same plans the rules make knowing the caches."""
    inp = load(path).planning_input()
    knowing = [p.describe(costs=False) for rule in RULES for p in rule(inp)]
    blind = [_with_cached(p, inp.cached).describe(costs=False)
             for rule in RULES for p in rule(replace(inp, cached={}))]
    assert blind == knowing
