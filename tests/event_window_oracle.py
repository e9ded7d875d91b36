"""A row-at-a-time model of event-time windows (docs/engine.md, "Event-time windows"), written
independently of ``sstore.dataflow.event_windows`` (which is set-oriented SQL) to check it against.

Times are integers. ``run`` takes batches of (key, t, v) rows and returns, per batch, the
windows that fired (key, start, end, revision, count, sum) and the late rows.
"""

from __future__ import annotations

from collections.abc import Sequence

Row = tuple[object, int, float]
Fired = tuple[object, int, int, int, int, float]


def windows_of(t: int, size: int, slide: int) -> list[int]:
    """Starts of the windows [s, s + size) that contain t, s a multiple of slide."""
    s = (t // slide) * slide
    starts = []
    while s > t - size:
        starts.append(s)
        s -= slide
    return sorted(starts)


def run(batches: Sequence[Sequence[Row]], size: int, slide: int, delay: int,
        lateness: int) -> list[tuple[list[Fired], list[Row]]]:
    wm: int | None = None
    max_t: int | None = None
    state: list[Row] = []
    revisions: dict[tuple[object, int], int] = {}
    out = []
    for batch in batches:
        late = [r for r in batch if wm is not None
                and windows_of(r[1], size, slide)[0] + size + lateness <= wm]
        accepted = list(batch)
        for r in late:
            accepted.remove(r)
        state.extend(accepted)
        if batch:
            top = max(r[1] for r in batch)
            max_t = top if max_t is None else max(max_t, top)
        new_wm = None if max_t is None else max_t - delay
        old = wm if wm is not None else -(2 ** 62)
        emit: set[tuple[object, int]] = set()
        if new_wm is not None:
            for key, t, _ in accepted:
                emit |= {(key, s) for s in windows_of(t, size, slide) if s + size <= new_wm}
            for key, t, _ in state:
                emit |= {(key, s) for s in windows_of(t, size, slide)
                         if old < s + size <= new_wm}
        fired = []
        for key, s in sorted(emit, key=lambda w: (w[1], str(w[0]))):
            rows = [r for r in state if r[0] == key and s <= r[1] < s + size]
            revisions[(key, s)] = revisions.get((key, s), 0) + 1
            fired.append((key, s, s + size, revisions[(key, s)], len(rows),
                          sum(r[2] for r in rows)))
        if new_wm is not None:
            revisions = {w: n for w, n in revisions.items() if w[1] + size + lateness > new_wm}
            state = [r for r in state
                     if windows_of(r[1], size, slide)[-1] + size + lateness > new_wm]
        wm = new_wm
        out.append((fired, late))
    return out
