"""The batch fingerprint (``sstore.base.fingerprint``): its value depends on the rows only, and it
never changes between versions, since state files keep the fingerprints of batches ingested
long ago and a re-send is compared with them.

The fast path for columns with nulls (numpy over the buffers) is checked against the general
path (Arrow's ``is_null``/``drop_null``) on random columns, slices and chunkings, and both
against fingerprints recorded by the version before the fast path existed (``GOLDEN``)."""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sstore.base import fingerprint as fp

TYPES = {
    "int8": (pa.int8(), st.integers(-128, 127)),
    "int64": (pa.int64(), st.integers(-2**63, 2**63 - 1)),
    "float64": (pa.float64(), st.floats(allow_nan=False)),
    "string": (pa.string(), st.text(max_size=6)),
    "large_string": (pa.large_string(), st.text(max_size=6)),
    "binary": (pa.binary(), st.binary(max_size=6)),
    "bool": (pa.bool_(), st.booleans()),
    "date": (pa.date32(), st.dates()),
    "timestamp": (pa.timestamp("us"), st.datetimes(min_value=dt.datetime(1900, 1, 1))),
    "decimal": (pa.decimal128(10, 2),
                st.decimals(min_value=-10**7, max_value=10**7, places=2, allow_nan=False)),
}


def general(table: pa.Table) -> int:
    """The fingerprint by the general path only (what every version before the fast path
    computed)."""
    h = hashlib.sha1(usedforsecurity=False)
    h.update(table.num_rows.to_bytes(8, "little"))
    saved = fp._nullable_fast
    fp._nullable_fast = lambda h, arr: False  # type: ignore[assignment]
    try:
        for name, column in zip(table.column_names, table.columns):
            h.update(name.encode())
            h.update(b"\x00")
            fp._column(h, column.combine_chunks() if column.num_chunks != 1 else column.chunk(0))
    finally:
        fp._nullable_fast = saved  # type: ignore[assignment]
    return int.from_bytes(h.digest()[:8], "little", signed=True)


@st.composite
def columns(draw: st.DrawFn) -> tuple[str, pa.ChunkedArray]:
    name = draw(st.sampled_from(sorted(TYPES)))
    arrow_type, values = TYPES[name]
    items = draw(st.lists(st.one_of(st.none(), values), max_size=40))
    whole = pa.array(items, type=arrow_type)
    start = draw(st.integers(0, len(items)))
    stop = draw(st.integers(start, len(items)))
    part = whole.slice(start, stop - start)  # a slice: offsets that are not 0, mid-byte bitmaps
    cut = draw(st.integers(0, len(part)))
    return name, pa.chunked_array([part.slice(0, cut), part.slice(cut)], type=arrow_type)


@settings(max_examples=400, deadline=None)
@given(columns())
def test_the_fast_path_gives_the_general_paths_fingerprint(column: tuple[str, pa.ChunkedArray]
                                                          ) -> None:
    name, values = column
    table = pa.table({name: values})
    assert fp.fingerprint(table) == general(table)
    # the layout does not count: one chunk, a copy, the same rows
    assert fp.fingerprint(pa.table({name: values.combine_chunks()})) == general(table)
    assert fp.fingerprint(pa.table({name: pa.array(values.to_pylist(), type=values.type)})
                          ) == general(table)


def test_a_null_slot_that_spans_bytes_is_dropped_as_before() -> None:
    """A string array whose null slot covers bytes (legal Arrow: a null's slot may hold
    anything) must fingerprint like the same rows built plainly."""
    offsets = pa.array([0, 1, 4, 5], type=pa.int32())
    data = pa.py_buffer(b"axyzb")
    validity = pa.py_buffer(bytes([0b101]))
    odd = pa.StringArray.from_buffers(3, offsets.buffers()[1], data, validity, null_count=1)
    plain = pa.array(["a", None, "b"])
    assert odd.to_pylist() == plain.to_pylist()
    assert fp.fingerprint(pa.table({"s": odd})) == fp.fingerprint(pa.table({"s": plain}))


# Fingerprints computed by the version before the fast path (sstore at 22627e6): a state file
# written then keeps them in sstore_sys.commits, and re-sends after an upgrade must match.
GOLDEN_TABLE = pa.table({
    "id": pa.array([1, None, 3, 4], type=pa.int64()),
    "name": pa.array(["a", None, "ccc", ""], type=pa.string()),
    "price": pa.array([decimal.Decimal("1.50"), None, None, decimal.Decimal("-2.25")],
                      type=pa.decimal128(10, 2)),
    "at": pa.array([dt.datetime(2024, 1, 1), None, dt.datetime(2024, 12, 31, 23, 59, 59),
                    None], type=pa.timestamp("us")),
    "ok": pa.array([True, None, False, True]),
    "all_null": pa.array([None] * 4, type=pa.string()),
})
GOLDEN = {"whole": 5165171285805609624, "tail": -6439778898972222081}


def test_fingerprints_of_the_version_before_are_kept() -> None:
    assert fp.fingerprint(GOLDEN_TABLE) == GOLDEN["whole"]
    assert fp.fingerprint(GOLDEN_TABLE.slice(1)) == GOLDEN["tail"]


def test_a_wide_batch_is_fingerprinted_aside_also_in_a_forked_child() -> None:
    """``soon``: the same value from the worker thread; a child forked after the parent's
    worker started gets a worker of its own (the inherited one has no thread and hung)."""
    import os
    import time

    from sstore.base.fingerprint import SOON_VALUES, soon
    wide = pa.table({f"c{i}": pa.array(range(SOON_VALUES // 10), pa.int64()) for i in range(10)})
    assert soon(wide)() == fp.fingerprint(wide)
    child = os.fork()
    if child == 0:  # pragma: no cover (the child's outcome is its exit code)
        os._exit(0 if soon(wide)() == fp.fingerprint(wide) else 1)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(child, 9)
        os.waitpid(child, 0)
    assert done[0] == child and os.waitstatus_to_exitcode(done[1]) == 0
