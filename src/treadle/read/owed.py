"""Chunks a lookahead step found no room for when it entered the window, asked for again.

A step enters a loader's lookahead window (:mod:`treadle.read.lookahead`) ``lookahead``
steps before it is read. Its chunks that find no room then (the chunks of the steps before
it, held for them, fill the cache) are **owed**, not dropped: each later round, as the
window moves on and the steps read let their chunks go, the stage asks for them again,
nearest step first, as Belady's policy would fetch them when they are needed. Only the
steps past the reader's ``read_ahead`` are asked for again (the reader may be reading the
others' rows already). A chunk counts once for its step: a hit where it is present when
asked for again (fetched for an earlier step), a miss where it is fetched, or, when the
step is read while it is still owed, a miss not kept (:meth:`ChunkStore.unserved`).
:func:`treadle.plan.simcache.lookahead` replays the same.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from treadle.storage.chunkstore import ChunkStore, ObjectChunks
    from treadle.storage.store import Store

__all__ = ["Owed"]

Reserved = dict[int, tuple["Store", list[tuple["ObjectChunks", list[int]]]]]
"""Per store (by id): the store and the chunks reserved of each object (to download)."""


class Owed:
    """The owed chunks of the steps in a lookahead's window, per step."""

    def __init__(self, chunks: ChunkStore, read_ahead: int) -> None:
        self.chunks, self.read_ahead = chunks, int(read_ahead)
        self._steps: dict[int, list[tuple[Store, ObjectChunks, list[int]]]] = {}
        self._read = -1  # the last step read
        self._lock = threading.Lock()

    def add(self, step: int, store: Store, obj: ObjectChunks, chunks: list[int]) -> None:
        """``chunks`` of ``obj`` (of ``store``) found no room for ``step``."""
        if chunks:
            with self._lock:
                self._steps.setdefault(step, []).append((store, obj, list(chunks)))

    def due(self, now: int) -> bool:
        """Whether a step after the reader's (``now + read_ahead``) owes chunks."""
        with self._lock:
            return any(s > now + self.read_ahead for s in self._steps)

    def retry(self, now: int, reserved: Reserved) -> None:
        """Ask again for the owed chunks of the steps after ``now + read_ahead``, nearest
        first; those that find room are added to ``reserved``, the others stay owed."""
        with self._lock:
            todo = sorted(s for s in self._steps if s > now + self.read_ahead)
        for step in todo:
            with self._lock:
                items = self._steps.pop(step, [])
            still = []
            for store, obj, ids in items:
                got, skip = self.chunks.reserve([(obj, ids, [step] * len(ids))], now, at=step,
                                                defer=True)  # fmt: skip
                reserved.setdefault(id(store), (store, []))[1].append((obj, got[0]))
                if skip[0]:
                    still.append((store, obj, skip[0]))
            with self._lock:
                if step <= self._read:  # read meanwhile: what it still owed went without it
                    self._count(still)
                elif still:
                    self._steps[step] = still

    def read(self, step: int) -> None:
        """Step ``step`` was read: what it still owes was read another way (misses)."""
        with self._lock:
            self._read = max(self._read, step)
            self._count(self._steps.pop(step, []))

    def _count(self, items: list[tuple[Store, ObjectChunks, list[int]]]) -> None:
        for _, obj, ids in items:
            self.chunks.unserved(obj, len(ids))
