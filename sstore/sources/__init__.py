"""Sources: feed a border stream from an outside system exactly once (issue 40).

``feed(engine, source, stream)`` is the one loop (``sstore.sources.base``); a source says where
it is (positions), reads a contiguous range as one batch (batch-id from the position) and is
acknowledged only after the engine committed that batch together with its position. See
docs/sources.md."""

from __future__ import annotations

from sstore.sources.base import (
    Chunk,
    DeadLetter,
    FeedReport,
    Source,
    SourceError,
    dead_letters,
    feed,
    forget,
)
from sstore.sources.files import FileChangedError, FileSource

__all__ = ["Chunk", "DeadLetter", "FeedReport", "FileChangedError", "FileSource", "Source",
           "SourceError", "dead_letters", "feed", "forget"]
