"""Random streams: one independent numpy ``Generator`` per concern, derived from the seed.

Every file (or simulation) draws from its own stream, keyed by a name. Adding a draw to one
file therefore never shifts the values of another, and optional output (``bad_rows``) can be
switched on without changing a single byte of the regular files.
"""

from __future__ import annotations

import string
import zlib
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")

UPPER = string.ascii_uppercase
LOWER = string.ascii_lowercase
_POOL_TRIES = 64


def substream(seed: int, name: str) -> np.random.Generator:
    """The generator for ``name`` under ``seed``: stable across runs, platforms and versions.

    ``zlib.crc32`` (not ``hash``) keys the name, because ``hash`` of a string changes between
    Python processes.
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))


class Draw:
    """Scalar draws for record-at-a-time generation (names, addresses, XML actions).

    A numpy ``Generator`` call costs microseconds; generating customers one field at a time
    would spend most of its time there. ``Draw`` takes uniforms from the generator in blocks
    and derives every scalar from them, which keeps the sequence a pure function of the seed.
    """

    __slots__ = ("_block", "_buf", "_pos", "rng")

    def __init__(self, rng: np.random.Generator, block: int = 4096) -> None:
        self.rng = rng
        self._block = block
        self._buf: list[float] = []
        self._pos = 0

    def uniform(self) -> float:
        """A float in [0, 1)."""
        if self._pos >= len(self._buf):
            self._buf = self.rng.random(self._block).tolist()
            self._pos = 0
        value = self._buf[self._pos]
        self._pos += 1
        return value

    def _take(self, n: int) -> list[float]:
        """The next ``n`` uniforms of the same stream, in one slice."""
        if self._pos + n > len(self._buf):
            self._buf = self._buf[self._pos:] + self.rng.random(max(self._block, n)).tolist()
            self._pos = 0
        out = self._buf[self._pos:self._pos + n]
        self._pos += n
        return out

    def integer(self, low: int, high: int) -> int:
        """An int in [low, high], both inclusive."""
        return low + int(self.uniform() * (high - low + 1))

    def chance(self, p: float) -> bool:
        """True with probability ``p``."""
        return self.uniform() < p

    def pick(self, items: Sequence[T]) -> T:
        """One element of ``items``, uniformly."""
        return items[int(self.uniform() * len(items))]

    def weighted(self, items: Sequence[T], weights: Sequence[float]) -> T:
        """One element of ``items`` with the given (not necessarily normalized) weights."""
        target = self.uniform() * sum(weights)
        for item, weight in zip(items, weights):
            target -= weight
            if target < 0:
                return item
        return items[-1]

    def digits(self, n: int) -> str:
        """``n`` decimal digits (leading zeros allowed)."""
        return "".join([str(int(u * 10)) for u in self._take(n)])

    def letters(self, n: int, alphabet: str = UPPER) -> str:
        """``n`` letters from ``alphabet``."""
        k = len(alphabet)
        return "".join([alphabet[int(u * k)] for u in self._take(n)])

    def word(self, low: int, high: int) -> str:
        """A capitalized pseudo-word of ``low``..``high`` letters."""
        n = self.integer(low, high)
        return self.letters(1) + self.letters(n - 1, LOWER)

    def text(self, low: int, high: int) -> str:
        """Letters and single spaces, ``low``..``high`` characters, no edge spaces."""
        n = self.integer(low, high)
        words: list[str] = []
        length = 0
        while length < n:
            words.append(self.word(2, 9))
            length += len(words[-1]) + 1
        out = " ".join(words)[:n].rstrip()
        return out if len(out) >= low else (out + self.letters(low - len(out), LOWER))


class IndexPool:
    """A set of ints with O(1) add, remove and uniform pick (the active entities of a
    simulation). ``choose`` finds a random member that satisfies a condition: a few random
    tries, then a scan from a random start, so it is fast when most members qualify and still
    exact when few do."""

    def __init__(self) -> None:
        self.items: list[int] = []
        self._where: dict[int, int] = {}

    def add(self, item: int) -> None:
        self._where[item] = len(self.items)
        self.items.append(item)

    def remove(self, item: int) -> None:
        pos = self._where.pop(item)
        last = self.items.pop()
        if last != item:
            self.items[pos] = last
            self._where[last] = pos

    def choose(self, draw: Draw, ok: Callable[[int], bool]) -> int | None:
        """A random item satisfying ``ok``: random tries first, then a full scan."""
        if not self.items:
            return None
        for _ in range(_POOL_TRIES):
            item = self.items[int(draw.uniform() * len(self.items))]
            if ok(item):
                return item
        start = int(draw.uniform() * len(self.items))
        for k in range(len(self.items)):
            item = self.items[(start + k) % len(self.items)]
            if ok(item):
                return item
        return None
