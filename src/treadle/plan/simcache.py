"""Caches of fixed-size chunks replayed over a known sequence of steps (``treadle simulate``).

Each step needs a set of chunk ids (ints). A step's chunks are all fetched before the step runs;
a chunk in the cache is a hit, any other a miss (fetched, then cached). When the cache is over
``capacity`` chunks, chunks not needed by the current step are evicted:

- :func:`belady`: the chunk whose next use is farthest in the future (never used again: first).
  Over fixed-size chunks this is the optimum (Belady's MIN): no policy has fewer misses. It is
  what a cache driven by the plan can do, since the plan knows every future step.
- :func:`lru`: the least recently used chunk (what a cache that does not know the plan does).

Both return a :class:`Replay`: per step, the chunks missed (in ascending order) and hits.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NEVER = 1 << 62


@dataclass
class Replay:
    """What a cache did over the steps: the misses of each step, and hit/access counts."""

    misses: list[np.ndarray]
    hits: int
    accesses: int
    over: int
    """Steps whose own chunks did not fit in the cache (counted as fetched, then dropped)."""

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses if self.accesses else 1.0


def _next_uses(steps: Sequence[np.ndarray]) -> list[np.ndarray]:
    """For each step and each of its chunks, the next step that needs the chunk (or NEVER)."""
    last: dict[int, int] = {}
    out: list[np.ndarray] = [np.empty(0, np.int64)] * len(steps)
    for s in range(len(steps) - 1, -1, -1):
        chunks = steps[s].tolist()
        out[s] = np.asarray([last.get(c, NEVER) for c in chunks], np.int64)
        for c in chunks:
            last[c] = s
    return out


def rank_next_uses(ranks: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """What each rank's own lookahead knows, on a node whose ranks share a cache: per step
    (``ranks[s][r]``: the sorted distinct chunks rank ``r`` needs), for each chunk of the
    union of the step's chunks (sorted), its next use by the ranks that use it at this step
    only (another rank's nearer use unknown)."""
    count = len(ranks[0]) if ranks else 0
    own = [_next_uses([step[r] for step in ranks]) for r in range(count)]
    out = []
    for s, step in enumerate(ranks):
        union = np.unique(np.concatenate(step))
        best = np.full(union.size, NEVER, np.int64)
        for r in range(count):
            np.minimum.at(best, np.searchsorted(union, step[r]), own[r][s])
        out.append(best)
    return out


def belady(steps: Sequence[np.ndarray], capacity: int,
           nexts: Sequence[np.ndarray] | None = None) -> Replay:  # fmt: skip
    """Replay with eviction by farthest next use (the optimum over fixed-size chunks).
    ``nexts``: the next use of each step's chunks as known (default: the true ones; with
    :func:`rank_next_uses`, what ranks that know only their own steps reach)."""
    nxt = _next_uses(steps) if nexts is None else nexts
    cached: dict[int, int] = {}  # chunk -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, chunk); stale entries skipped
    misses, hits, total, over = [], 0, 0, 0
    for s, chunks in enumerate(steps):
        miss = []
        for c, n in zip(chunks.tolist(), nxt[s].tolist()):
            total += 1
            if c in cached:
                hits += 1
            else:
                miss.append(c)
            cached[c] = n
            heapq.heappush(heap, (-n, c))
        misses.append(np.asarray(miss, np.int64))
        while len(cached) > capacity:
            neg, c = heapq.heappop(heap)
            if cached.get(c) == -neg:  # else a stale entry
                del cached[c]
        if len(chunks) > capacity:
            over += 1
    return Replay(misses, hits, total, over)


def lru(steps: Sequence[np.ndarray], capacity: int) -> Replay:
    """Replay with eviction of the least recently used chunk."""
    cached: OrderedDict[int, None] = OrderedDict()
    misses, hits, total, over = [], 0, 0, 0
    for chunks in steps:
        miss = []
        for c in chunks.tolist():
            total += 1
            if c in cached:
                hits += 1
                cached.move_to_end(c)
            else:
                miss.append(c)
                cached[c] = None
        misses.append(np.asarray(miss, np.int64))
        while len(cached) > capacity:
            cached.popitem(last=False)
        if len(chunks) > capacity:
            over += 1
    return Replay(misses, hits, total, over)


def requests(misses: np.ndarray, chunk_bits: int) -> int:
    """HTTP requests for one step's missed chunks: runs of consecutive chunks of one object
    are one ranged GET (obstore merges ranges that touch). Chunk ids are
    ``object << chunk_bits | chunk index``."""
    if misses.size == 0:
        return 0
    m = np.sort(misses)
    gaps = np.diff(m) != 1
    same_obj = (m[1:] >> chunk_bits) == (m[:-1] >> chunk_bits)
    return int(1 + np.count_nonzero(gaps | ~same_obj))
