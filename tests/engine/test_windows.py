"""Tuple and batch windows: contents change only on a slide, procedures run per slide,
expired rows are removed automatically."""

from __future__ import annotations

from sstore import Engine


def window_engine(path: str, **window: int) -> tuple[Engine, list[tuple[int, list[int]]]]:
    eng = Engine(path, gc_every=1)
    eng.stream("s", {"x": "INTEGER"})
    eng.window("w", "s", **window)
    eng.execute("CREATE TABLE IF NOT EXISTS seen (batch_id BIGINT, xs INTEGER[])")

    @eng.procedure(input="w")
    def on_slide(tx, batch):
        tx.execute("INSERT INTO seen SELECT ?, list(x ORDER BY x) FROM batch", tx.batch_id)

    return eng, []


def slides(eng: Engine) -> list[tuple[int, list[int]]]:
    return [(r["batch_id"], r["xs"]) for r in
            eng.query("SELECT batch_id, xs FROM seen ORDER BY batch_id").to_pylist()]


def visible(eng: Engine) -> list[int]:
    return sorted(eng.query("SELECT x FROM w").column("x").to_pylist())


def test_tuple_window_slides_by_rows(state_path: str) -> None:
    eng, _ = window_engine(state_path, rows=4, slide=2)
    eng.ingest("s", [(1,)])
    eng.run_until_idle()
    assert visible(eng) == [] and slides(eng) == []  # staged, not visible yet
    eng.ingest("s", [(2,), (3,)])  # 3 rows in all: one slide of 2
    eng.run_until_idle()
    assert visible(eng) == [1, 2] and slides(eng) == [(2, [1, 2])]
    eng.ingest("s", [(4,), (5,), (6,)])  # 6 rows: slides to 6, window = last 4
    eng.ingest("s", [])  # an empty batch: no slide
    eng.ingest("s", [(7,), (8,)])
    eng.run_until_idle()
    assert visible(eng) == [5, 6, 7, 8]
    assert slides(eng) == [(2, [1, 2]), (3, [3, 4, 5, 6]), (5, [5, 6, 7, 8])]
    eng.close()
    # restart: window state comes back, expired rows are gone from storage
    eng, _ = window_engine(state_path, rows=4, slide=2)
    assert visible(eng) == [5, 6, 7, 8]
    stored = eng.query("SELECT x FROM w__rows ORDER BY x").column("x").to_pylist()
    assert stored == [5, 6, 7, 8]
    eng.ingest("s", [(9,)])
    eng.ingest("s", [(10,)])
    eng.run_until_idle()
    assert slides(eng)[-1] == (7, [7, 8, 9, 10])
    eng.close()


def test_batch_window(state_path: str) -> None:
    eng, _ = window_engine(state_path, batches=3, slide=2)
    eng.ingest("s", [(1,), (2,)])
    eng.run_until_idle()
    assert visible(eng) == []
    eng.ingest("s", [])  # empty batches count as batches
    eng.run_until_idle()
    assert visible(eng) == [1, 2]
    eng.ingest("s", [(3,)])
    eng.ingest("s", [(4,)])
    eng.run_until_idle()
    assert visible(eng) == [3, 4]  # batches 2 (empty), 3, 4
    assert slides(eng) == [(2, [1, 2]), (4, [3, 4])]
    assert eng.query("SELECT count(*) FROM w__rows").column(0)[0].as_py() == 2
    eng.close()


def test_procedure_sees_the_window_as_of_its_slide_even_when_behind(state_path: str) -> None:
    eng, _ = window_engine(state_path, rows=2, slide=1)
    for x in range(1, 6):
        eng.ingest("s", [(x,)])  # five slides queue up before the procedure runs
    eng.run_until_idle()
    assert slides(eng) == [(1, [1]), (2, [1, 2]), (3, [2, 3]), (4, [3, 4]), (5, [4, 5])]
    eng.close()
