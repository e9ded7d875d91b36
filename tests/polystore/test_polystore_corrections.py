"""Per-(query, plan) corrections learnt from measured runs, and the re-planning they trigger
when the chosen plan turns out dearer than its runner-up (sstore.polystore.corrections,
sstore.polystore.plancache)."""

from __future__ import annotations

import math

import pytest

from sstore.polystore.corrections import (
    Corrections,
    apply,
    corrections,
    modelled,
    plan_key,
)
from sstore.polystore.cost import CostModel
from sstore.polystore.learning import Learner
from sstore.polystore.plan import ISLAND, Fetch, Plan, Run
from sstore.polystore.plancache import PlanCache

MODEL = CostModel()
STREAM = {"fixed.streaming": 1.0, "process.streaming": 1e6}      # 2.8 ms at the defaults
ISLE = {"fixed.island": 1.0, "process.island": 1e6}              # 3.0 ms at the defaults


def _runs(terms: dict[str, float], key: str, factor: float, n: int) -> list:
    return [(terms, factor * modelled(terms, MODEL), key)] * n


def test_a_plan_the_model_gets_wrong_is_corrected_relative_to_the_others() -> None:
    """The engine plan runs at 1.5x its price (the machine's level), the island's at 3.75x:
    the island is 2.5 times as wrong as the typical plan, and both are priced at today's
    level."""
    found = corrections(_runs(STREAM, "stream", 1.5, 8) + _runs(ISLE, "island", 3.75, 1), MODEL)
    assert found.level == pytest.approx(1.5)
    assert found.relative["stream"] == pytest.approx(1.0)
    assert found.relative["island"] == pytest.approx(2.5)
    assert found.factor("island") * modelled(ISLE, MODEL) == pytest.approx(
        3.75 * modelled(ISLE, MODEL))


def test_load_that_slows_every_plan_is_not_an_error_of_one_plan() -> None:
    """Runs measured while the machine was twice as busy raise the level, not the relative
    error of the plan that happened to run then."""
    runs = _runs(ISLE, "island", 1.0, 1) + _runs(STREAM, "stream", 1.0, 4)
    runs += _runs(STREAM, "stream", 2.0, 9)           # the machine gets busy
    found = corrections(runs, MODEL)
    assert found.level == pytest.approx(2.0)
    assert found.relative["island"] == pytest.approx(1.0)
    assert found.relative["stream"] == pytest.approx(1.0)


def test_one_slow_run_does_not_move_a_correction_a_wrong_plan_is_learnt_at_once() -> None:
    steady = _runs(STREAM, "other", 1.0, 9) + _runs(ISLE, "island", 1.0, 4)
    spiked = corrections(steady + _runs(ISLE, "island", 3.0, 1), MODEL)
    assert spiked.relative["island"] == pytest.approx(1.0)   # median of five
    first = corrections(_runs(STREAM, "other", 1.0, 9) + _runs(ISLE, "island", 3.0, 1), MODEL)
    assert first.relative["island"] == pytest.approx(3.0)


def test_a_plan_never_run_is_priced_at_the_level_and_errors_are_bounded() -> None:
    found = corrections(_runs(STREAM, "stream", 1.2, 3) + _runs(ISLE, "island", 1000.0, 1),
                        MODEL, limit=8.0)
    assert found.factor("never run@q") == pytest.approx(found.level)
    assert found.relative["island"] == 8.0
    assert corrections([], MODEL) == Corrections({}, 1.0)
    assert corrections([({}, 1.0, "empty"), (STREAM, 0.0, "zero")], MODEL).relative == {}


def test_a_plan_new_to_a_query_takes_its_names_error_in_other_queries() -> None:
    """The island's plan of the aggregate ran 3x its price at a level of 1; the join's island
    plan has not run yet: it is priced as wrong as its namesake, not as the model says."""
    aggregate = plan_key("relational:aggregate", "pull into island")
    join = plan_key("relational:join", "pull into island")
    found = corrections(_runs(STREAM, plan_key("relational:aggregate", "migrate into stream"),
                              1.0, 8) + _runs(ISLE, aggregate, 3.0, 1), MODEL)
    assert found.relative[aggregate] == pytest.approx(3.0)
    assert join not in found.relative
    assert found.factor(join) == pytest.approx(3.0 * found.level)
    assert found.factor(plan_key("relational:join", "migrate into pg")) == found.level


def test_apply_scales_the_cost_and_keeps_the_model_terms() -> None:
    plan = Plan("pull into island", "pull_into_island",
                (Fetch("pg", "SELECT 1", "t", 10, 1),),
                Run(ISLAND, "SELECT * FROM t", 10, 1, 10, 1))
    MODEL.price(plan, {"pg": "postgres", ISLAND: ISLAND})
    plan.learn_key = "k"
    terms, cost = dict(plan.cost_terms), plan.cost
    apply([plan], Corrections({"k": 2.0}, 1.5))
    assert plan.correction == 3.0 and plan.cost == pytest.approx(3.0 * cost)
    assert plan.cost_terms == terms
    assert "learnt from runs" in plan.describe()
    infeasible = Plan("x", "r", (), Run(ISLAND, "SELECT 1", 0, 0, 1, 1), cost=math.inf,
                      learn_key="k")
    apply([infeasible], Corrections({"k": 2.0}, 1.0))
    assert math.isinf(infeasible.cost)


def test_plan_keys_name_the_plan_not_the_query_text() -> None:
    key = plan_key("relational:SELECT * FROM orders WHERE o_c_id = 42", "migrate into pg")
    assert key.startswith("migrate into pg@") and "42" not in key
    assert key != plan_key("relational:SELECT * FROM orders", "migrate into pg")


def test_the_learner_keeps_keys_and_saves_and_restores_them(tmp_path) -> None:
    model = CostModel()
    learner = Learner(CostModel(), every=100)
    learner.observe(STREAM, 0.01, model, key="stream@1")
    learner.observe(ISLE, 0.02, model)                        # no key: refits only
    path = tmp_path / "costs.learned.json"
    learner.save(str(path))
    again = Learner(CostModel())
    assert again.restore(str(path), CostModel()) == 2
    assert [k for _t, _s, k in again.observations] == ["stream@1", None]
    old = tmp_path / "format1.json"                           # written before plan keys
    old.write_text('{"format": 1, "observations": [[{"fixed.island": 1.0}, 0.5]]}')
    assert Learner(CostModel()).restore(str(old), CostModel()) == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 2, "observations": [[{"fixed.island": 1.0}, 0.5, 7]]}')
    with pytest.raises(ValueError, match="bad.json"):
        Learner(CostModel()).restore(str(bad), CostModel())


def _plan(name: str) -> Plan:
    return Plan(name, "r", (), Run(ISLAND, "SELECT 1", 0, 0, 1, 1))


def test_a_choice_priced_above_its_runner_up_after_a_run_is_planned_afresh() -> None:
    """The plan cache asks, after each run, what the chosen plan and its runner-up cost with
    what is known now: the chosen dearer by more than ``surpass`` sends the next run to the
    planner; a run that leaves the choice standing does not."""
    cache = PlanCache(replan_every=10)
    key = PlanCache.key("q", 1, "catalog")
    chosen, runner = _plan("pull into island"), _plan("migrate into stream")
    estimates = {"pull into island": 0.020, "migrate into stream": 0.025}
    assert cache.get(key, lambda e, p: True) is None
    cache.put(key, chosen, runner)
    cache.observe(chosen, 0.021, lambda p: estimates[p.name])
    assert cache.get(key, lambda e, p: True) is chosen        # still the cheaper: reused
    estimates["pull into island"] = 0.050                     # learnt: it is not
    cache.observe(chosen, 0.050, lambda p: estimates[p.name])
    assert cache.get(key, lambda e, p: True) is None          # planned afresh
    cache.put(key, runner, chosen)
    cache.observe(runner, 0.024)                              # nothing learnt: no verdict
    assert cache.get(key, lambda e, p: True) is runner
