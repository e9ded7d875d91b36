"""Replacing a file whole or not at all, durably: the one way sstore replaces a file.

Write-to-a-temporary-file-then-rename keeps readers from seeing half a file, but only with two
``fsync`` calls does it survive a power cut or a SIGKILL followed by one: the data before the
rename (else the renamed file can be empty or short after a crash: the rename reached the disk,
the data did not) and the directory after it (else the rename itself can be lost). The project
wrote this pattern six times and fsync'd in three; ``write_atomically`` is the one copy now.
"""

from __future__ import annotations

import os
from typing import cast

import pyarrow as pa

from sstore.base.faults import crash_point


def write_atomically(path: str, data: bytes | str, *, staging_dir: str | None = None,
                     mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8): a reader, and the file after
    a crash at any point, sees the old contents or the new, never a mix or an empty file.

    ``staging_dir``: where the temporary file is written (same file system as ``path``; by
    default ``path``'s directory), for a watched directory whose readers must not see it. The
    temporary file's name carries the writer's pid, so concurrent writers never share one.
    ``mode``: the new file's permissions (less the umask), set when the temporary file is
    created: a secret written with 0o600 is never readable by others, not even for a moment."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    staged = os.path.join(staging_dir or folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if os.path.exists(staged):  # left by a crash of a process that had this pid: its mode
        os.remove(staged)       # may be wider than ``mode``, and O_CREAT would keep it
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        crash_point("file.before_rename")
        replace_durably(staged, path)
    except BaseException:
        if os.path.exists(staged):
            os.remove(staged)
        raise


def replace_durably(staged: str, path: str) -> None:
    """Rename a complete file (written and fsync'd by whoever made it, e.g. DuckDB's
    checkpoint) over ``path``, and fsync the directory so the rename survives a crash."""
    os.replace(staged, path)
    sync_directory(os.path.dirname(os.path.abspath(path)))


def sync_directory(folder: str) -> None:
    """fsync a directory: what makes a rename, a create or an unlink in it durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def parquet_bytes(table: pa.Table) -> bytes:
    """A table as the bytes of one Parquet file (for ``write_atomically``)."""
    import pyarrow.parquet as pq  # only the benchmarks' file sources need it

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return cast(bytes, sink.getvalue().to_pybytes())
