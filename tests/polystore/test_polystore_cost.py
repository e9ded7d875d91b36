"""The cost model's pricing of fetches: per row as well as per value, and PostgreSQL's reads
one after another (sstore.polystore.cost); the calibration arithmetic that splits them."""

from __future__ import annotations

import pytest

from sstore.polystore.calibrate import _per_value_and_row
from sstore.polystore.cost import CONCURRENT_READS, CostModel
from sstore.polystore.plan import ISLAND, Fetch, Plan, Run

KINDS = {"pg": "postgres", "stream": "streaming", ISLAND: ISLAND}


def _island(*fetches: Fetch) -> Plan:
    return Plan("pull into island", "pull_into_island", fetches,
                Run(ISLAND, "SELECT 1", 0, 0, 1, 1))


def _model() -> CostModel:
    model = CostModel(parallel_overlap=0.0)
    model.fetch_row["streaming"] = 1e-8
    return model


def test_a_fetch_is_priced_per_row_and_per_value() -> None:
    """Two columns of 20,000 rows from PostgreSQL: the rows' framing as well as the values."""
    model = _model()
    plan = model.price(_island(Fetch("pg", "SELECT a, b FROM t", "t", 20_000, 2)), KINDS)
    assert plan.cost_terms["fetch_row.postgres"] == 20_000
    assert plan.cost_terms["fetch.postgres"] == 40_000
    assert plan.cost_detail["fetch"] == pytest.approx(
        model.fixed["postgres"] + 20_000 * model.fetch_row["postgres"]
        + 40_000 * model.fetch["postgres"])


def test_postgres_fetches_of_one_plan_add_up_other_engines_overlap() -> None:
    """A split object joined with a PostgreSQL dimension in the island: its two PostgreSQL
    reads take the one connection in turn (their sum counts), the engine's read runs beside
    them (with overlap 0, only the slower lane counts)."""
    assert not CONCURRENT_READS["postgres"] and CONCURRENT_READS["streaming"]
    model = _model()
    orders = Fetch("pg", "SELECT o FROM orders_hist", "orders__1", 20_000, 2)
    customer = Fetch("pg", "SELECT c FROM customer", "customer__0", 3_000, 2)
    stream = Fetch("stream", "SELECT o FROM orders_in", "orders__0", 1_000, 2)
    alone = {f.into: model.price(_island(f), KINDS).cost_detail["fetch"]
             for f in (orders, customer, stream)}
    both = model.price(_island(orders, customer, stream), KINDS)
    assert both.cost_detail["fetch"] == pytest.approx(alone["orders__1"] + alone["customer__0"])
    assert both.cost_terms["fixed.postgres"] == 2
    two_engines = model.price(_island(orders, stream), KINDS)
    assert two_engines.cost_detail["fetch"] == pytest.approx(max(alone["orders__1"],
                                                                 alone["orders__0"]))
    model.parallel_overlap = 1.0   # nothing overlaps: every lane counts
    assert model.price(_island(orders, stream), KINDS).cost_detail["fetch"] == pytest.approx(
        alone["orders__1"] + alone["orders__0"])


def test_cost_terms_still_add_up_to_the_cost() -> None:
    model = _model()
    plan = model.price(_island(Fetch("pg", "x", "a", 500, 3), Fetch("pg", "y", "b", 70, 1),
                               Fetch("stream", "z", "c", 9_000, 2)), KINDS)
    assert sum(c * model.value(t) for t, c in plan.cost_terms.items()) == \
        pytest.approx(plan.cost)


def test_calibration_splits_per_row_from_per_value() -> None:
    """1,000 rows: wide (8 columns) took fixed + 1000 * (300 + 8 * 100) ns, narrow (1
    column) fixed + 1000 * (300 + 100) ns."""
    fixed = 0.001
    wide = fixed + 1000 * (300e-9 + 8 * 100e-9)
    narrow = fixed + 1000 * (300e-9 + 100e-9)
    value, row = _per_value_and_row(wide, narrow, fixed, 1000, 8)
    assert value == pytest.approx(100e-9) and row == pytest.approx(300e-9)
    assert _per_value_and_row(wide, narrow, fixed, 1000, 1) == (pytest.approx(1.1e-6), 0.0)
    # noise that makes the narrow read look dearer than the wide one: no negative constant
    assert _per_value_and_row(narrow, wide, fixed, 1000, 8) == (0.0, pytest.approx(1.1e-6))
