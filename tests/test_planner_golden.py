"""Each planner rule against its golden SQL fixture (tests/fixtures/planner/<rule>.sql)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sstore.polystore.rules import REWRITES, RULES
from tests.planner_golden import fixtures, load


def test_every_rule_has_a_fixture() -> None:
    names = {p.stem for p in fixtures()}
    assert names == {rule.__name__ for rule in (*REWRITES, *RULES)}


@pytest.mark.parametrize("path", fixtures(), ids=lambda p: p.stem)
def test_rule_matches_golden_sql(path: Path) -> None:
    golden = load(path)
    assert golden.expected, f"{path.name} has no expected plans"
    assert golden.actual() == golden.expected


def test_rules_are_pure() -> None:
    """The same input gives equal plans twice (rules keep no state and touch no engine)."""
    golden = load(fixtures()[0])
    assert golden.actual() == golden.actual()
