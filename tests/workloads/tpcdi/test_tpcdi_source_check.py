"""A streaming run resumed over changed source files is refused, never mixed.

The engine counts the event lines it took; a user who regenerates the data set in the same
folder (another seed) and runs again on the same state file would otherwise get the first
lines' old version and the rest's new version in one warehouse, with exit 0. Stand-in
dimensions (no Spark) and no sinks: the check is on the engine side, before anything is sent.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sstore.workloads.tpcdi.generator import generate
from sstore.workloads.tpcdi.streaming.events import batch1_events
from sstore.workloads.tpcdi.streaming.pipeline import StreamingDimTrade
from sstore.workloads.tpcdi.streaming.source_check import SourceChangedError, recorded
from sstore.workloads.tpcdi.warehouse import create_warehouse
from tests.workloads.tpcdi.test_tpcdi_streaming import stand_in_dimensions

SCHEMA = "tpcdi_src"


class Crash(Exception):
    """Stands for the process dying in the middle of a TPC-DI batch."""


def pipeline(data: Path, pg_url: str, state: Path, crash_after: int | None = None
             ) -> StreamingDimTrade:
    def progress(_phase: str, done: int, _total: int) -> None:
        if crash_after is not None and done >= crash_after:
            raise Crash(f"crashed after {done} lines")

    p = StreamingDimTrade(data, pg_url, str(state), SCHEMA, batch_size=100, progress=progress)
    stand_in_dimensions(p.engine, data)
    return p


def dimtrade(p: StreamingDimTrade) -> list[tuple[object, ...]]:
    return p.engine.query("SELECT * FROM dimtrade ORDER BY tradeid").to_pylist()


def test_a_resume_over_regenerated_files_is_refused_and_the_same_files_resume(
        pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    create_warehouse(pg_url, SCHEMA)
    data = tmp_path / "tpcdi"
    generate(0.01, data, seed=3)
    clean = pipeline(data, pg_url, tmp_path / "clean.duckdb")
    clean.stream(batch1_events(data), "Batch1", migrate=False)
    expected = dimtrade(clean)
    total = batch1_events(data).lines.num_rows
    clean.engine.close()

    state = tmp_path / "state.duckdb"
    first = pipeline(data, pg_url, state, crash_after=300)
    with pytest.raises(Crash):
        first.stream(batch1_events(data), "Batch1", migrate=False)
    taken = first.lines_ingested(1)
    assert 300 <= taken < total
    original = recorded(first.engine, 1)
    assert original is not None and original.lines == total
    first.engine.close()

    generate(0.01, data, seed=4)  # the user regenerates the data set in the same folder
    other = pipeline(data, pg_url, state)
    with pytest.raises(SourceChangedError, match=f"taken lines 1..{taken}"):
        other.stream(batch1_events(data), "Batch1", migrate=False)
    assert other.lines_ingested(1) == taken  # nothing of the new files went in
    other.engine.close()

    generate(0.01, data, seed=3)  # the files the run started from, back again
    again = pipeline(data, pg_url, state)
    again.stream(batch1_events(data), "Batch1", migrate=False)
    assert again.lines_ingested(1) == total
    assert dimtrade(again) == expected  # the resumed run equals the uninterrupted one

    # every line taken: an edited file is not streamed (warned), the state keeps what it has
    trades = data / "Batch1" / "Trade.txt"
    lines = trades.read_text().splitlines(keepends=True)
    fields = lines[0].split("|")
    fields[9] = "Someone Else"  # T_EXEC_NAME: same number of lines, other content
    trades.write_text("".join(["|".join(fields), *lines[1:]]))
    with caplog.at_level(logging.WARNING, logger="sstore.tpcdi"):
        again.stream(batch1_events(data), "Batch1", migrate=False)
    assert "Nothing of it is streamed again" in caplog.text
    assert dimtrade(again) == expected
    record = recorded(again.engine, 1)
    assert record == original  # still the files it streamed
    # more lines than were taken: the new ones would be streamed over the old ones: refused
    generate(0.01, data, seed=4)
    with pytest.raises(SourceChangedError):
        again.stream(batch1_events(data), "Batch1", migrate=False)
    assert dimtrade(again) == expected
    again.engine.close()


def test_nothing_taken_yet_records_the_files_as_they_are(pg_url: str, tmp_path: Path) -> None:
    create_warehouse(pg_url, SCHEMA)
    data = tmp_path / "tpcdi"
    generate(0.01, data, seed=3)
    state = tmp_path / "state.duckdb"
    first = pipeline(data, pg_url, state, crash_after=0)  # dies after its first engine batch
    with pytest.raises(Crash):
        first.stream(batch1_events(data), "Batch1", migrate=False)
    first.engine.execute("DELETE FROM tpcdi_sources")  # as a state file from before the check
    first.engine.close()
    generate(0.01, data, seed=4)
    resumed = pipeline(data, pg_url, state)
    resumed.stream(batch1_events(data), "Batch1", migrate=False)  # warned, cannot be checked
    record = recorded(resumed.engine, 1)
    assert record is not None and record.lines == batch1_events(data).lines.num_rows
    resumed.engine.close()
