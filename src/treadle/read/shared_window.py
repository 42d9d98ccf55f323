"""A lookahead's window, shared with the worker processes that read its steps.

With ``workers=N`` and ``lookahead``, one :class:`~treadle.read.lookahead.Lookahead` in the
loader's process fetches the chunks of every step (one walk of the plan: each chunk fetched
once, eviction by the loader's position), and the workers read rows from the same chunk
store. A worker must not read a step before its fetches ended, as the reader of a
``workers=0`` loader waits at :meth:`Lookahead.gate <treadle.read.lookahead.Lookahead.gate>`.
:class:`SharedWindow` is the few numbers that takes: the stage's position, its last fetched
step and whether it stopped, in a small anonymous shared-memory file (a ``memfd``, handed to
each worker like its batch slots), and per worker the rows it read from chunks and took
otherwise, and the video windows it read from chunks and fetched with range requests (the
stage's report counts them). Whole aligned 8-byte words are written and read,
so a reader sees each number either before or after a change, never half of it.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

__all__ = ["SharedWindow"]

_NOW, _FETCHED, _STOP, _LOOKAHEAD, _HEAD = 0, 1, 2, 3, 4
_POLL_S = (0.0002, 0.005)  # a waiting worker's first and longest sleep
_COUNTS = ("rows_read", "rows_taken", "windows_read", "windows_fetched")  # per worker


class SharedWindow:
    """``now``, ``fetched``, ``stopped`` and ``lookahead`` of a stage, and rows and windows
    counted per worker. Made by the loader (``fd=None``: a new memfd for ``workers`` workers, the stage
    at step ``start``), mapped again in a worker from the descriptor it inherits."""

    def __init__(self, workers: int = 0, start: int = 0, lookahead: int = 0,
                 fd: int | None = None) -> None:  # fmt: skip
        if fd is None:
            fd = os.memfd_create("treadle-lookahead-window")
            os.ftruncate(fd, 8 * (_HEAD + len(_COUNTS) * max(1, workers)))
            made = True
        else:
            made = False
        self.fd = fd
        self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        self.words = np.frombuffer(self._map, np.int64)
        if made:
            self.words[_NOW], self.words[_FETCHED] = start, start - 1
            self.words[_LOOKAHEAD] = lookahead

    def close(self) -> None:
        """Close the descriptor once no worker is started any more (the mapping stays)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def publish(self, now: int | None, fetched: int, stopped: bool) -> None:
        """The stage's state (its thread and the loader call this under its condition)."""
        if now is not None:
            self.words[_NOW] = now
        self.words[_FETCHED] = fetched
        self.words[_STOP] = int(stopped)

    def gate(self, steps: Iterable[int]) -> Iterator[int]:
        """``steps``, each once the stage fetched it, stopped, or left it beyond its window
        (read at once, as :meth:`Lookahead.gate` does): never waits for the loader to move."""
        w = self.words
        for step in steps:
            pause = _POLL_S[0]
            while not w[_STOP] and w[_FETCHED] < step and step <= w[_NOW] + w[_LOOKAHEAD]:
                time.sleep(pause)
                pause = min(2 * pause, _POLL_S[1])
            yield step

    def count(self, worker: int, stats: Any) -> None:
        """Worker ``worker``'s counts so far (a :class:`ChunkStats`: rows read from chunks
        and taken, windows read from chunks and fetched)."""
        at = _HEAD + len(_COUNTS) * worker
        if at + len(_COUNTS) <= len(self.words):
            self.words[at : at + len(_COUNTS)] = [getattr(stats, n) for n in _COUNTS]

    def counts(self) -> dict[str, int]:
        """Rows every worker read from chunks and took otherwise, and windows every worker
        read from chunks and fetched otherwise (``ChunkStats`` field names)."""
        per = self.words[_HEAD:].reshape(-1, len(_COUNTS)).sum(axis=0)
        return {n: int(v) for n, v in zip(_COUNTS, per)}
