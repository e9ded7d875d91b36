"""A 64-bit fingerprint of a batch's rows, so a re-sent batch-id can be checked against the
batch first ingested under it.

A re-send under an id that was already ingested is a no-op (that is what makes re-sends
exactly once). That is only right when the re-send carries the same rows; a client that changed
them (a corrected file, another chunking, another source reusing ids) would lose the new rows
with no error. The ingest records its row count (``sstore_sys.commits.n_rows``) and this
fingerprint (``sstore_sys.commits.fingerprint``) with the batch, and a re-send whose count or
fingerprint differs is refused (``ResendMismatchError``).

Ingest is on the hot path, so the fingerprint is computed from the Arrow buffers without
converting a value to Python: SHA-1 (cut to 64 bits; not for security, it is the fastest
strong hash in ``hashlib`` with the CPU's SHA instructions, twice blake2b's speed) over the
bytes each column's values occupy: about 0.03 ms for a TPC-DI batch of 250 lines, 0.7 ms for
10,000 (measured on the 2-core test machine). It must depend on the values only, never on how
Arrow happens to lay them out, or an identical re-send read differently (other chunks, a slice
of a bigger table, a round trip through the input log's IPC) would be refused:

- the chunks of a column are joined first;
- only the bytes of the array's own slice are read (its offset; string offsets are made
  relative to the first);
- nulls are hashed as their positions, and their slots dropped (a null slot may hold anything);
- booleans are hashed as bytes (bit-packed, a slice may start mid-byte).

Types without a plain buffer layout (lists, structs, maps, views...) fall back to their
values' Python representation: correct, slower, and rare in streams. Row order counts: a
re-send with the same rows in another order has another fingerprint (a re-read of the same
source sends them in the same order).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.types as pt

_ITEM = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_OFFSETS = {pa.string(): np.int32, pa.binary(): np.int32,
            pa.large_string(): np.int64, pa.large_binary(): np.int64}


#: from about this many values on, a batch's fingerprint is computed on a thread of its own,
#: beside the transaction that ingests it (``soon``); below, the handover costs more than it
#: saves (a TPC-DI batch of 250 lines: 0.03 ms)
SOON_VALUES = 100_000
_workers: dict[int, ThreadPoolExecutor] = {}  # by process: a forked child has no thread


def _worker() -> ThreadPoolExecutor:
    """This process's worker. Not one inherited through ``fork``: the child has no thread
    behind it, and its idle count would send work to that thread, never to run."""
    pid = os.getpid()
    worker = _workers.get(pid)
    if worker is None:
        worker = _workers[pid] = ThreadPoolExecutor(max_workers=1,
                                                   thread_name_prefix="sstore-fingerprint")
    return worker


def soon(table: pa.Table) -> Callable[[], int]:
    """``table``'s fingerprint, to be had by calling the result. A large batch's is computed
    on a worker thread meanwhile: hashing releases the GIL, so on a second core it overlaps
    the ingest's DuckDB work (10,000 Nexmark events: 3 ms of a 20 ms batch), which needs it
    only for the commit record at the end (or at once for a re-send, ``ingest._admit``).
    A failure is raised by the call, where the inline computation would have raised it."""
    if table.num_rows * table.num_columns < SOON_VALUES:
        value = fingerprint(table)
        return lambda: value
    return _worker().submit(fingerprint, table).result


def fingerprint(table: pa.Table) -> int:
    """The fingerprint of ``table``'s rows: a signed 64-bit integer (a DuckDB ``BIGINT``)."""
    h = hashlib.sha1(usedforsecurity=False)
    h.update(table.num_rows.to_bytes(8, "little"))
    for name, column in zip(table.column_names, table.columns):
        h.update(name.encode())
        h.update(b"\x00")
        _column(h, column.combine_chunks() if column.num_chunks != 1 else column.chunk(0))
    return int.from_bytes(h.digest()[:8], "little", signed=True)


def _column(h: hashlib._Hash, arr: pa.Array) -> None:
    """Feed the values of ``arr`` (one chunk) to ``h``, independent of its layout."""
    if pt.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if arr.null_count and _nullable_fast(h, arr):
        return
    if arr.null_count:
        nulls = arr.is_null().to_numpy(zero_copy_only=False)
        h.update(b"N")
        h.update(np.flatnonzero(nulls).astype(np.int64).tobytes())
        arr = arr.drop_null()
    h.update(b"V")
    kind = arr.type
    if pt.is_boolean(kind):
        h.update(arr.to_numpy(zero_copy_only=False).tobytes())  # one byte per value
        return
    offsets_type = _OFFSETS.get(kind)
    if offsets_type is not None:
        buffers = arr.buffers()
        offsets = np.frombuffer(buffers[1], dtype=offsets_type, count=len(arr) + 1,
                                offset=arr.offset * np.dtype(offsets_type).itemsize)
        first, last = int(offsets[0]), int(offsets[-1])
        h.update((offsets - first).tobytes())
        if buffers[2] is not None:
            h.update(memoryview(buffers[2])[first:last])
        return
    width = _byte_width(kind)
    if width:
        data = arr.buffers()[1]
        if data is not None:
            h.update(memoryview(data)[arr.offset * width:(arr.offset + len(arr)) * width])
        return
    if pt.is_null(kind):
        return
    h.update(repr(arr.to_pylist()).encode())  # nested and other types: slow, exact


#: the last validity bitmap seen (its slice's offset, length and bytes), its mask and the
#: bytes of its null positions: the columns of one kind of a sparse stream have the same
#: bitmap (Nexmark's person, auction and bid fields), computed once for them all
_last_valid: tuple[tuple[int, int, bytes], np.ndarray, bytes] | None = None


def _valid(arr: pa.Array) -> tuple[np.ndarray, bytes]:
    """Which slots of ``arr`` hold a value, read from its validity bitmap (no compute call),
    and the positions of the others as int64 bytes."""
    global _last_valid
    end = arr.offset + len(arr)
    key = (arr.offset, len(arr), memoryview(arr.buffers()[0])[:(end + 7) // 8].tobytes())
    last = _last_valid
    if last is not None and last[0] == key:
        return last[1], last[2]
    bits = np.unpackbits(np.frombuffer(key[2], dtype=np.uint8), bitorder="little", count=end)
    valid = bits[arr.offset:].view(np.bool_)
    nulls = np.flatnonzero(~valid).astype(np.int64, copy=False).tobytes()
    _last_valid = (key, valid, nulls)
    return valid, nulls


def _nullable_fast(h: hashlib._Hash, arr: pa.Array) -> bool:
    """The bytes ``_column`` feeds for a column with nulls (their positions, then the values
    left once they are dropped), computed with numpy from the buffers instead of Arrow's
    ``is_null`` and ``drop_null`` kernels, which copied every column of a wide sparse batch
    (Nexmark's events: 11 of 14 columns mostly null) and were a third of its ingest. Only for
    plain fixed-width and string columns; False (nothing fed) for any other, which takes the
    general path. The bytes are the same as that path's: a state file's recorded
    fingerprints keep matching re-sends (tests/engine/test_fingerprint.py compares both)."""
    kind = arr.type
    offsets_type = _OFFSETS.get(kind)
    width = 0 if offsets_type is not None else _byte_width(kind)
    if offsets_type is None and not width:
        return False
    valid, nulls = _valid(arr)
    buffers = arr.buffers()
    if offsets_type is not None:
        offsets = np.frombuffer(buffers[1], dtype=offsets_type, count=len(arr) + 1,
                                offset=arr.offset * np.dtype(offsets_type).itemsize)
        lengths = np.diff(offsets)
        if lengths[~valid].any():
            return False  # a null slot that spans bytes: the general path drops them
    h.update(b"N")
    h.update(nulls)
    h.update(b"V")
    if offsets_type is not None:
        kept = np.zeros(int(valid.sum()) + 1, dtype=offsets_type)
        np.cumsum(lengths[valid], out=kept[1:])
        h.update(kept.tobytes())
        if buffers[2] is not None:
            h.update(memoryview(buffers[2])[int(offsets[0]):int(offsets[-1])])
    elif buffers[1] is not None:  # one item per value: a 1-D mask, 15x a 2-D one's speed
        values = np.frombuffer(buffers[1], dtype=_ITEM.get(width, np.dtype(f"V{width}")),
                               count=len(arr), offset=arr.offset * width)
        h.update(values[valid].tobytes())
    return True


def _byte_width(kind: pa.DataType) -> int:
    """Bytes per value of a fixed-width type stored in one data buffer (0: not such a type)."""
    if (pt.is_integer(kind) or pt.is_floating(kind) or pt.is_temporal(kind)
            or pt.is_decimal(kind) or pt.is_fixed_size_binary(kind)):
        try:
            bits = kind.bit_width
        except ValueError:
            return 0
        return bits // 8 if bits % 8 == 0 else 0
    return 0
