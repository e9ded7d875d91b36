"""The engine benchmark's own machinery: phases resolved against the engine's code (a renamed
internal is reported as missing, not as a crash or a zero), and the same-work check of Spark."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from benchmarks import engine_profile
from benchmarks.engine_profile import PHASES, Phase, profile_phases, resolve
from benchmarks.engine_spark import check_same_totals
from benchmarks.engine_workloads import CHAIN, make_events


def test_every_phase_names_code_that_exists() -> None:
    missing = {p.label: resolve(p).missing for p in PHASES if resolve(p).missing}
    assert not missing, f"engine internals renamed: update benchmarks/engine_profile.py {missing}"


@pytest.mark.parametrize("phase, why", [
    (Phase("renamed", 0, "py", "executor._attempt_renamed"), "has no function"),
    (Phase("moved", 0, "py", "streams.append", "executor.run_te"), "no longer calls append"),
    (Phase("dropped call", 0, "db", "unregister", "executor._attempt", "TE"),
     "no longer calls unregister"),
    (Phase("no module", 0, "py", "nosuchmodule.f"), "no module"),
])
def test_a_vanished_name_is_reported(phase: Phase, why: str) -> None:
    assert why in resolve(phase).missing


def test_profile_shows_missing_phases_and_restores_duckdb(tmp_path: object,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    original = duckdb.DuckDBPyConnection.__dict__["commit"]
    gone = Phase("a phase whose function was renamed", 1, "py", "executor._gone")
    monkeypatch.setattr(engine_profile, "PHASES", PHASES + (gone,))
    profile = profile_phases(CHAIN, "full", 10, 3, make_events(100, 1), str(tmp_path))
    rows = {p["phase"]: p for p in profile["phases"]}
    assert rows[gone.label]["status"].startswith("MISSING")
    assert rows[gone.label]["ms_per_batch"] is None
    assert any(gone.label in m for m in profile["missing"])
    assert rows["procedure body"]["calls_per_batch"] == 3
    assert profile["duckdb_calls"]["duckdb_calls_per_te"] > 0
    assert duckdb.DuckDBPyConnection.__dict__["commit"] is original


def _totals(n: list[int], total: list[float]) -> pa.Table:
    return pa.table({"user_id": pa.array(range(len(n)), pa.int64()),
                     "n": pa.array(n, pa.int64()), "total": pa.array(total, pa.float64())})


def test_same_totals_up_to_rounding() -> None:
    check_same_totals(_totals([1, 2], [0.1 + 0.2, 5.0]), _totals([1, 2], [0.3, 5.0]), "x")
    with pytest.raises(AssertionError, match="counts"):
        check_same_totals(_totals([1, 3], [0.3, 5.0]), _totals([1, 2], [0.3, 5.0]), "x")
    with pytest.raises(AssertionError, match="amount"):
        check_same_totals(_totals([1, 2], [0.3, 5.5]), _totals([1, 2], [0.3, 5.0]), "x")
    with pytest.raises(AssertionError, match="nothing was checked"):
        check_same_totals(_totals([], []), _totals([], []), "x")
