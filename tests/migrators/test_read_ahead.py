"""The sink's read-ahead (``migrators.read_ahead``) on its own: every chunk once, in order,
converted after the batch that precedes it; ``kick`` prepares the next chunk at most once;
a failed read reaches the delivering thread; an abandoned plan stops the helper. The
end-to-end paths (real DuckDB, real PostgreSQL) are in ``test_sink_throughput_paths.py``."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from migrators import read_ahead
from migrators.read_ahead import Chunk, Converted, ReadAhead


def batches(first: int, last: int, rows_each: int) -> pa.Table:
    ids = [b for b in range(first, last + 1) for _ in range(rows_each)]
    return pa.table({"_batch_id": pa.array(ids, pa.int64()), "v": pa.array(range(len(ids)))})


class Recorder:
    """A ``read`` and a ``convert`` that note what they were asked and in which thread."""

    def __init__(self, rows_each: int, fail_at: int | None = None) -> None:
        self.rows_each = rows_each
        self.fail_at = fail_at
        self.reads: list[tuple[int, int]] = []
        self.converts: list[tuple[int, int]] = []  # (first batch of the rows, after)
        self.threads: set[str] = set()

    def read(self, group: list[Chunk]) -> pa.Table:
        self.threads.add(threading.current_thread().name)
        if self.fail_at is not None and group[0].first <= self.fail_at <= group[-1].last:
            raise OSError(f"read of batch {self.fail_at} failed")
        self.reads.append((group[0].first, group[-1].last))
        return batches(group[0].first, group[-1].last, self.rows_each)

    def convert(self, rows: pa.Table, after: int) -> Converted:
        self.converts.append((rows["_batch_id"][0].as_py(), after))
        return Converted(after, None, rows, None)


def plan(n: int, rows_each: int) -> list[Chunk]:
    return [Chunk(b, b, rows_each, 1) for b in range(1, n + 1)]


@pytest.mark.parametrize("kick", [False, True])
def test_every_chunk_once_in_order_converted_after_the_one_before(
        kick: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_ahead, "READ_AHEAD_ROWS", 30)
    rec = Recorder(rows_each=10)
    ahead = ReadAhead(plan(9, 10), 0, rec.read, rec.convert, threaded=True, name="t-read")
    seen = []
    for chunk, rows, converted in ahead:
        assert converted is not None and converted.after == chunk.first - 1
        assert rows["_batch_id"].to_pylist() == [chunk.first] * 10
        seen.append(chunk.first)
        if kick:
            ahead.kick()
            ahead.kick()  # a retried transaction kicks again: still prepared once
    assert seen == list(range(1, 10))
    assert sorted(rec.converts) == [(b, b - 1) for b in range(1, 10)]
    assert rec.reads == [(1, 1), (2, 4), (5, 7), (8, 9)]  # the first chunk read alone
    assert rec.threads == {n for n in rec.threads if n.startswith("t-read")}


def test_without_a_thread_the_rows_come_unconverted_from_the_callers_thread() -> None:
    rec = Recorder(rows_each=5)
    out = [(c.first, conv) for c, _rows, conv in
           ReadAhead(plan(4, 5), 0, rec.read, rec.convert, threaded=False, name="t-read")]
    assert out == [(1, None), (2, None), (3, None), (4, None)]
    assert rec.threads == {threading.current_thread().name} and rec.converts == []


def test_a_failed_read_is_raised_in_the_delivering_thread_after_the_chunks_before_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_ahead, "READ_AHEAD_ROWS", 10)
    rec = Recorder(rows_each=10, fail_at=3)
    ahead = ReadAhead(plan(5, 10), 0, rec.read, rec.convert, threaded=True, name="t-read")
    delivered = []
    with pytest.raises(OSError, match="batch 3"):
        for chunk, _rows, _conv in ahead:
            delivered.append(chunk.first)
            ahead.kick()
    assert delivered == [1, 2]


def test_an_abandoned_plan_stops_its_helper_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_ahead, "READ_AHEAD_ROWS", 10)
    rec = Recorder(rows_each=10)
    ahead = ReadAhead(plan(50, 10), 0, rec.read, rec.convert, threaded=True, name="t-abandon")
    it = iter(ahead)
    next(it)
    ahead.kick()
    it.close()  # what ``SinkRunner.move_pending`` does when a delivery fails (or ``ahead.close()``)
    ahead.kick()  # after the end: nothing happens
    assert not [t for t in threading.enumerate() if t.name.startswith("t-abandon")]
    assert len(rec.reads) <= 3  # no run ahead through the rest of the plan
