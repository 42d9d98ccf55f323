"""Chunks a lookahead step found no room for when it entered the window, asked for again.

A step enters a loader's lookahead window (:mod:`treadle.read.lookahead`) ``lookahead``
steps before it is read. Its chunks that find no room then (the chunks of the steps before
it, held for them, fill the cache) are **owed**, not dropped: each time a step is read and
lets its chunks go, the owed chunks of the steps past the reader's ``read_ahead`` (it may
be reading the others' rows already) are asked for again, nearest step first, as Belady's
policy would fetch them when needed; the stage's thread downloads those that found room.
A chunk counts once for its step: a hit where it is present when asked for again (fetched
for an earlier step), a miss where it is fetched, or, when its step is read while it is
still owed, a miss not kept (:meth:`ChunkStore.unserved`). Asking again as each step read
lets its chunks go (the stage's thread releases the steps read, in order, before its next
round), not once per round, keeps the counts those of
:func:`treadle.plan.simcache.lookahead`'s replay when several steps were read meanwhile.
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
    """The owed chunks of the steps in a lookahead's window, per step, and the chunks
    reserved for them that the stage's thread has yet to download."""

    def __init__(self, chunks: ChunkStore, read_ahead: int) -> None:
        self.chunks, self.read_ahead = chunks, int(read_ahead)
        self._steps: dict[int, list[tuple[Store, ObjectChunks, list[int]]]] = {}
        self._reserved: Reserved = {}
        self._closed = False  # no thread downloads: nothing more is reserved
        self._lock = threading.Lock()

    def add(self, step: int, store: Store, obj: ObjectChunks, chunks: list[int]) -> None:
        """``chunks`` of ``obj`` (of ``store``) found no room for ``step``."""
        if chunks:
            with self._lock:
                self._steps.setdefault(step, []).append((store, obj, list(chunks)))

    def due(self, now: int) -> bool:
        """Whether chunks wait for a download, or a step after the reader's
        (``now + read_ahead``) owes some."""
        with self._lock:
            return bool(self._reserved) or any(s > now + self.read_ahead for s in self._steps)

    def read(self, step: int) -> None:
        """Step ``step`` was read (the window starts at ``step + 1`` now): what it still owes
        was read another way (misses); then the owed chunks of the steps after the reader's
        are asked for again, nearest step first. Those that find room (where the steps read
        let theirs go) are reserved for the stage's thread to download (:meth:`take`): room
        is made as the window moves, whenever the thread gets to it."""
        with self._lock:
            self._count(self._steps.pop(step, []))
            now = step + 1
            todo = (
                [] if self._closed else sorted(s for s in self._steps if s > now + self.read_ahead)
            )
            for s in todo:
                still = []
                for store, obj, ids in self._steps.pop(s):
                    got, skip = self.chunks.reserve([(obj, ids, [s] * len(ids))], now, at=s,
                                                    defer=True)  # fmt: skip
                    if got[0]:
                        self._reserved.setdefault(id(store), (store, []))[1].append((obj, got[0]))
                    if skip[0]:
                        still.append((store, obj, skip[0]))
                if still:
                    self._steps[s] = still

    def take(self) -> Reserved:
        """The chunks reserved for owed ones, to download (the caller's from now on)."""
        with self._lock:
            out, self._reserved = self._reserved, {}
        return out

    def abandon(self) -> None:
        """No thread downloads from now on: give back the room of the reserved chunks, and
        reserve no more."""
        with self._lock:
            self._closed = True
        for _, items in self.take().values():
            self.chunks.abandon(items)

    def _count(self, items: list[tuple[Store, ObjectChunks, list[int]]]) -> None:
        for _, obj, ids in items:
            self.chunks.unserved(obj, len(ids))
