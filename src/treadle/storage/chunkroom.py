"""Room in the chunk store (:mod:`treadle.storage.chunkstore`) for one reservation's misses.

A reservation (a round of the lookahead stage: a few steps' chunks of every object) makes
room for its missing chunks one after the other, nearest next use first, each by evicting
the chunks needed later than it, farthest first (Belady). Under the folder's lock nothing
but this reservation changes the states, so one scan of the folder serves all its misses:
the bytes used go down by each eviction and up by each chunk reserved, and the candidates,
sorted once, are taken from the front. The chunks kept and evicted are those of a fresh scan
per miss (which each miss cost before: a listing of the folder and a sort of every present
chunk, per missing chunk).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from treadle.storage.chunkfiles import alive
from treadle.storage.chunkfolder import FETCHING, NEVER, PRESENT

__all__ = ["Room"]

Scan = list[tuple[Any, np.ndarray, np.ndarray]]  # (object, states, bytes held per chunk)


class Room:
    """``scan()``: the folder's objects holding chunks (scanned when room is first short);
    ``evict(object, chunk)``: evict one (whether it was: a fetch taken for dead may be alive). ``now``: the earliest step not yet read (next uses
    before it are stale: never)."""

    def __init__(self, scan: Callable[[], Scan], max_bytes: int, now: int,
                 evict: Callable[[Any, int], bool]) -> None:  # fmt: skip
        self._scan_folder, self.max_bytes, self.now, self._evict = scan, max_bytes, now, evict
        self.scanned = False
        self.used = 0
        self._scan: Scan = []
        self._order: tuple[np.ndarray, ...] | None = None  # candidates, farthest use first
        self._gone = np.empty(0, bool)  # candidates evicted
        self._at = 0  # candidates before this one were evicted

    def make(self, size: int, next_use: int) -> bool:
        """Evict chunks needed later than ``next_use`` (farthest first) until ``size`` more
        bytes fit the bound; whether they do (then they count as used: the chunk is
        reserved)."""
        if not self.scanned:
            self._scan, self.scanned = self._scan_folder(), True
            self.used = sum(int(held.sum()) for _, _, held in self._scan)
        if self.used + size > self.max_bytes:
            self._evict_for(size, next_use)
        if self.used + size > self.max_bytes:
            return False
        self.used += size
        return True

    def _evict_for(self, size: int, next_use: int) -> None:
        """Evict candidates needed later than ``next_use`` (a dead process's fetch: always),
        in order, until ``size`` more bytes fit."""
        nus, objs, ids, sizes, dead = self._candidates()
        i = self._at
        while self.used + size > self.max_bytes and i < len(nus):
            if nus[i] <= next_use and not dead[i]:
                if nus[i] < NEVER:
                    break  # the rest are needed sooner than this chunk (dead ones come first)
            elif not self._gone[i]:
                if self._evict(self._scan[objs[i]][0], int(ids[i])):
                    self.used -= int(sizes[i])
                self._gone[i] = True  # or its fetch's writer is alive: left as it is
            i += 1
        while self._at < len(nus) and self._gone[self._at]:
            self._at += 1

    def _candidates(self) -> tuple[np.ndarray, ...]:
        """Present chunks and those a dead process was fetching (next use never), as
        ``(next use, scan index, chunk, bytes, dead)``, farthest first, ties by object key then
        chunk (the simulator's order), then in scan order."""
        if self._order is not None:
            return self._order
        nus, objs, ids, sizes, deads, keys = [], [], [], [], [], []
        for k, (obj, states, held) in enumerate(self._scan):
            nu = np.asarray(obj.words[:, 1])
            dead = (states == FETCHING) & ~alive(np.asarray(obj.words[:, 2]))
            at = np.flatnonzero((states == PRESENT) | dead)
            nus.append(np.where(dead | (nu < self.now), NEVER, nu)[at])
            objs.append(np.full(len(at), k, np.int64))
            ids.append(at)
            sizes.append(held[at])
            deads.append(dead[at])
            keys.append(obj.key)
        if not nus:
            self._order = (np.empty(0, np.int64),) * 4 + (np.empty(0, bool),)
            self._gone = np.empty(0, bool)
            return self._order
        rank = {key: r for r, key in enumerate(sorted(set(keys)))}
        nu, obj = np.concatenate(nus), np.concatenate(objs)
        chunk, size = np.concatenate(ids), np.concatenate(sizes)
        key = np.asarray([rank[keys[k]] for k in range(len(keys))], np.int64)[obj]
        order = np.lexsort((chunk, key, -nu))  # stable: equal keys keep the scan's order
        self._order = (
            nu[order],
            obj[order],
            chunk[order],
            size[order],
            np.concatenate(deads)[order],
        )
        self._gone = np.zeros(len(order), bool)
        return self._order
