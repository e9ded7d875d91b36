"""benchmarks.tpcdi_work: the per-batch work of the engine and of the hand-written reference,
counted on the same batches; both must end with the same DimTrade."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import tpcdi_work
from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.streaming.events import batch1_events, incremental_events


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tpcdi_work")
    generate(0.01, out, seed=3, bad_rows=7)
    return out


def test_counts_statements_and_cpu_of_both_systems_on_the_same_batches(data: Path) -> None:
    events = [batch1_events(data), incremental_events(data, 2), incremental_events(data, 3)]
    got = tpcdi_work.measure(data, events, trades=200, rounds=1)
    engine, reference = got["sstore"][0], got["reference"][0]
    assert engine.batches == reference.batches > 3
    assert engine.state == reference.state != ""  # the same DimTrade at the end
    # the reference's two statements per chunk, counted by DuckDB's own log
    for work in (engine, reference):
        applies = sum(n for text, n in work.statements.items()
                      if text.startswith("INSERT INTO dimtrade_versions"))
        assert applies == work.batches
    commits = sum(n for text, n in reference.statements.items() if text == "COMMIT")
    assert commits == reference.batches
    # the engine records every batch (commit records): more statements than the bare loop
    assert engine.per_batch()[1] > reference.per_batch()[1]
    assert engine.per_batch()[0] > 0 and reference.per_batch()[0] > 0
