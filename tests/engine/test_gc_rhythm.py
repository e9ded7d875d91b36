"""GC's rhythm (``sstore.execution.gc.due``): every ``gc_every`` TEs, not sooner than
``gc_min_seconds``
after the previous GC unless ``gc.DEFER_MAX`` times ``gc_every`` TEs have piled up."""

from __future__ import annotations

from sstore import Engine
from sstore.engine import GC_EVERY
from sstore.execution import gc


def _declare(eng: Engine) -> None:
    eng.stream("s", {"x": "INTEGER"})

    @eng.procedure(input="s")
    def consume(tx, batch):  # reads every batch: each is collectable once this committed
        tx.sql("SELECT count(*) FROM batch")


def _stored_batches(eng: Engine) -> int:
    return eng.query("SELECT count(DISTINCT _batch_id) AS n FROM s").column("n")[0].as_py()


def test_the_default_rhythm_waits_a_second_and_an_own_gc_every_does_not(state_path: str) -> None:
    default = Engine(state_path)
    assert (default.gc_every, default.gc_min_seconds) == (GC_EVERY, gc.MIN_SECONDS)
    default.close()
    own = Engine(state_path, gc_every=5)
    assert own.gc_min_seconds == 0.0  # an explicit gc_every asks for exactly that rhythm
    own.close()


def test_gc_waits_for_its_interval_but_not_past_defer_max(state_path: str) -> None:
    """With an interval no test outlives, GC runs only once ``DEFER_MAX * gc_every`` TEs have
    piled up; until then the consumed batches stay stored (and nothing is lost by waiting)."""
    every = 2
    eng = Engine(state_path, gc_every=every, gc_min_seconds=3600.0)
    _declare(eng)
    deferred = every * gc.DEFER_MAX
    for x in range(deferred - 1):
        eng.ingest("s", [(x,)])
        eng.run_until_idle()
    assert _stored_batches(eng) == deferred - 1  # consumed, waiting for the interval
    eng.ingest("s", [(0,)])
    eng.run_until_idle()  # the DEFER_MAX-th multiple of gc_every: GC runs whatever the time
    assert _stored_batches(eng) <= 1  # a stream keeps at most its latest batch
    eng.close()


def test_without_an_interval_gc_runs_every_gc_every_tes(state_path: str) -> None:
    eng = Engine(state_path, gc_every=2, gc_min_seconds=0.0)
    _declare(eng)
    for x in range(6):
        eng.ingest("s", [(x,)])
        eng.run_until_idle()
        assert _stored_batches(eng) <= 2  # never more than gc_every consumed batches wait
    eng.close()


def test_a_rhythm_that_cannot_be_kept_is_refused(state_path: str) -> None:
    """``gc_every=0`` would collect after every TE and between a batch's TEs' checks alike, a
    negative interval means nothing: both are refused before the state file is opened."""
    import pytest

    from sstore.base.errors import DeclarationError

    for kwargs in ({"gc_every": 0}, {"gc_min_seconds": -1.0}):
        with pytest.raises(DeclarationError, match="gc_every must be at least 1"):
            Engine(state_path, **kwargs)
