"""The cost model refits itself from measured runs; EXPLAIN shows estimate and measurement."""

from __future__ import annotations

import copy

import pytest

from sstore import Engine
from sstore.polystore import Polystore
from sstore.polystore.cost import CostModel
from sstore.polystore.learning import Learner
from sstore.polystore.plan import ISLAND, Fetch, Plan, Run


def _plan(rows: int) -> Plan:
    return Plan("pull", "pull_into_island", (Fetch("pg", "SELECT 1", "t", rows, 4),),
                Run(ISLAND, "SELECT * FROM t", rows, 4, rows, 4))


def test_refit_moves_the_constants_toward_the_measured_times() -> None:
    """Runs that take three times the estimate pull the constants they use up, within the
    limit; a constant no run used keeps its calibrated value."""
    model = CostModel()
    kinds = {"pg": "postgres", ISLAND: ISLAND}
    learner = Learner(copy.deepcopy(model), every=1, prior=0.01)
    errors = []
    for rows in (1_000, 10_000, 100_000, 1_000, 50_000, 5_000) * 3:
        plan = model.price(_plan(rows), kinds)
        truth = 3 * CostModel().price(_plan(rows), kinds).cost
        errors.append(abs(plan.cost - truth) / truth)
        learner.observe(plan.cost_terms, truth, model)
    assert errors[0] == pytest.approx(2 / 3)
    assert errors[-1] < 0.1
    assert model.fetch["postgres"] > 2 * CostModel().fetch["postgres"]
    assert model.fetch["streaming"] == CostModel().fetch["streaming"]   # never observed
    assert "refitted from" in model.measured


def test_refit_is_bounded_and_ignores_empty_observations() -> None:
    model = CostModel()
    learner = Learner(copy.deepcopy(model), every=1, prior=0.01, limit=2.0)
    kinds = {"pg": "postgres", ISLAND: ISLAND}
    assert not learner.observe({}, 1.0, model)
    for _ in range(5):
        plan = model.price(_plan(10_000), kinds)
        learner.observe(plan.cost_terms, 1000 * plan.cost, model)
    assert model.fetch["postgres"] <= 2.0 * CostModel().fetch["postgres"] * 1.0001


def test_cost_terms_add_up_to_the_cost(tmp_path) -> None:
    model = CostModel()
    plan = model.price(_plan(12_345), {"pg": "postgres", ISLAND: ISLAND})
    assert sum(c * model.value(t) for t, c in plan.cost_terms.items()) == \
        pytest.approx(plan.cost)


def test_explain_shows_the_estimate_and_after_a_run_the_measured_time(tmp_path,
                                                                      pg_url: str) -> None:
    engine = Engine(str(tmp_path / "s.duckdb"))
    engine.stream("orders_in", {"o_id": "INTEGER"})
    engine.ingest("orders_in", [(1,), (2,)])
    ps = Polystore(str(tmp_path / "catalog.json"))
    ps.attach_engine("stream", engine)
    ps.add_postgres("pg", pg_url)
    import psycopg
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE old (o_id int)")
        con.execute("INSERT INTO old VALUES (3)")
    ps.add_postgres("pg", pg_url)
    ps.split("orders", {"stream": "orders_in", "pg": "old"}, disjoint=True)  # no sink
    sql = "SELECT count(*) AS n FROM orders"
    before = ps.explain(sql)
    assert "estimated" in before and "measured" not in before
    assert ps.query(sql).to_pylist() == [{"n": 3}]
    after = ps.explain(sql)
    chosen = next(line for line in after.splitlines() if line.startswith("* chosen"))
    assert "measured" in chosen and "(last run)" in chosen
    assert "learnt from runs" in chosen  # the machine's level, from the one run
    assert ps.learner is not None and len(ps.learner.observations) == 1
    assert ps.learner.observations[0][2].startswith(chosen.split()[3])  # its plan's key
    ps.close()
    engine.close()


def test_learned_equations_are_kept_atomically_and_restored(tmp_path) -> None:
    """``save`` then ``restore`` in a new learner: the same equations, the same refit; the
    file is written by rename (no temporary file left), the calibrated file is not touched."""
    base = CostModel()
    model = copy.deepcopy(base)
    learner = Learner(copy.deepcopy(base), every=1)
    for rows in (10_000, 50_000, 200_000):
        plan = base.price(_plan(rows), {"pg": "postgres", ISLAND: ISLAND})
        learner.observe(plan.cost_terms, plan.cost * 2.0, model)
    path = tmp_path / "costs.learned.json"
    learner.save(str(path))
    assert [p.name for p in tmp_path.iterdir()] == ["costs.learned.json"]
    restored_model = copy.deepcopy(base)
    again = Learner(copy.deepcopy(base))
    assert again.restore(str(path), restored_model) == 3
    assert list(again.observations) == list(learner.observations)
    assert again.factors == pytest.approx(learner.factors)
    assert restored_model.value("fetch.postgres") == pytest.approx(model.value("fetch.postgres"))
    assert restored_model.value("fetch.postgres") > base.value("fetch.postgres")


def test_a_damaged_learned_file_is_an_error_that_names_it(tmp_path) -> None:
    path = tmp_path / "costs.learned.json"
    path.write_text('{"observations": [[1, 2, 3]]}')
    with pytest.raises(ValueError, match="costs.learned.json"):
        Learner(CostModel()).restore(str(path), CostModel())


def test_a_later_polystore_starts_from_what_earlier_queries_measured(tmp_path) -> None:
    """``sstore query`` is one process per query: what it measured is kept beside the
    calibrated constants (``costs.learned.json``) and the next polystore refits from it."""
    engine = Engine(str(tmp_path / "s.duckdb"))
    engine.stream("orders_in", {"o_id": "INTEGER"})
    engine.ingest("orders_in", [(1,), (2,)])
    CostModel().write(str(tmp_path / "costs.json"))
    calibrated = (tmp_path / "costs.json").read_text()
    ps = Polystore(str(tmp_path / "catalog.json"))
    ps.attach_engine("stream", engine)
    ps.query("SELECT count(*) AS n FROM orders_in")
    assert ps.learner is not None and len(ps.learner.observations) == 1
    ps.close()
    assert (tmp_path / "costs.learned.json").exists()
    later = Polystore(str(tmp_path / "catalog.json"), engines={"stream": engine})
    assert later.learner is not None and len(later.learner.observations) == 1
    assert "refitted from 1 measured runs" in later.costs.measured
    later.query("SELECT count(*) AS n FROM orders_in")
    later.close()
    third = Polystore(str(tmp_path / "catalog.json"), engines={"stream": engine})
    assert third.learner is not None and len(third.learner.observations) == 2
    third.close()
    assert (tmp_path / "costs.json").read_text() == calibrated
    off = Polystore(str(tmp_path / "catalog.json"), engines={"stream": engine}, learn=False)
    assert off.learner is None and "refitted" not in off.costs.measured
    off.close()
    engine.close()
