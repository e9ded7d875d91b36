"""One engine per state: a second ``Engine`` on a state file or input log that an engine still
has open is refused (``DeclarationError``), not run beside the first.

DuckDB's file lock keeps a second *process* off a state file, but a second connection in the
same process (a notebook cell run twice, two services in one interpreter) shares the
database: both engines ran the same batches, doubling every write, and both handed out the
same next batch-id, after which the file could not be opened. A weak-durability engine's state
is in memory and its input log is a plain file, which nothing guarded at all: a second process
on the same log had its acknowledged batches erased by the first one's checkpoint.

- State files: a registry of the files open in this process (by real path), holding each
  engine weakly, so an engine that was dropped without ``close()`` frees its file when it is
  collected (a conflict runs the cycle collector once before it refuses: a program, or a
  test, that drops an engine to act as if its process died can open the file again).
- Input logs: an exclusive ``flock`` on ``<log>.lock`` held while the engine is open, which
  keeps out other processes and other engines of this one alike (the log itself is replaced
  at checkpoints, so it cannot carry the lock).
"""

from __future__ import annotations

import fcntl
import gc
import os
import threading
import weakref
from typing import IO

from sstore.base.errors import DeclarationError

_lock = threading.Lock()
_open: weakref.WeakValueDictionary[str, object] = weakref.WeakValueDictionary()


def claim_state(path: str, owner: object) -> str | None:
    """Register ``owner`` as the engine of the state file ``path``; return the key to
    ``release_state`` (None for an in-memory state, which is private to its engine)."""
    if path == ":memory:":
        return None
    key = os.path.realpath(path)
    if _open.get(key) is not None:
        gc.collect()  # an engine dropped without close() but kept by a cycle lets go now
    with _lock:
        if _open.get(key) is not None:
            raise DeclarationError(
                f"state file {path} is already open in this process by another Engine: close "
                f"that one first (engine.close()); two engines on one state file would run "
                f"the same batches twice")
        _open[key] = owner
    return key


def release_state(key: str | None, owner: object) -> None:
    if key is None:
        return
    with _lock:
        if _open.get(key) is owner:
            del _open[key]


def lock_input_log(path: str) -> IO[bytes]:
    """Hold ``<path>.lock`` exclusively; close the returned file to let go."""
    holder = open(f"{path}.lock", "ab")  # noqa: SIM115 - held for the engine's lifetime
    try:
        try:
            fcntl.flock(holder.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            gc.collect()  # as in claim_state: a dropped engine's lock file closes
            fcntl.flock(holder.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder.close()
        raise DeclarationError(
            f"input log {path} is in use by another engine (this process or another): one "
            f"engine per input log; its checkpoints would erase the other's batches") from None
    return holder
