"""Caches of fixed-size chunks replayed over a known sequence of steps (``treadle simulate``).

Each step needs a set of chunk ids (ints). A step's chunks are all fetched before the step runs;
a chunk in the cache is a hit, any other a miss (fetched, then cached). When the cache is over
``capacity`` chunks, chunks not needed by the current step are evicted:

- :func:`belady`: the chunk whose next use is farthest in the future (never used again: first).
  Over fixed-size chunks this is the optimum (Belady's MIN): no policy has fewer misses. It is
  what a cache driven by the plan can do, since the plan knows every future step.
- :func:`lru`: the least recently used chunk (what a cache that does not know the plan does).
- :func:`lookahead`: what the loader's ``lookahead`` stage does (it knows next uses only
  within its window, fetches a step's chunks when the step enters it, and holds them for it).

Both return a :class:`Replay`: per step, the chunks missed (in ascending order) and hits.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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
    stopped: int | None = None
    """:func:`lookahead`: the first step of the round at which the stage gave up (most of
    the chunks it asked for found no room); it fetches nothing from there on, and ``hits``
    and ``accesses`` count the steps asked until then. None: it never gave up."""

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


@dataclass
class _Stage:
    """The state :func:`lookahead` replays: the chunk store's words and the stage's uses."""

    room: int
    size: Callable[[int], int]
    tie: Callable[[int], tuple[object, int]]
    cached: dict[int, int]  # chunk -> its next use (present or being fetched)
    uses: dict[int, deque[int]]  # chunk -> steps of the window that need it
    deferred: dict[int, list[int]] = field(default_factory=dict)  # step -> chunks owed
    used: int = 0
    hits: int = 0
    asked: int = 0
    skipped: int = 0  # chunks that found no room when their step entered the window
    unserved: int = 0  # chunks still owed when their step was read


def lookahead(steps: Sequence[np.ndarray], max_bytes: int, size: Callable[[int], int],
              window: int, group: int = 8,
              tie: Callable[[int], tuple[object, int]] | None = None,
              horizon: int = 64, read_ahead: int = 0) -> Replay:  # fmt: skip
    """What a loader's ``lookahead`` stage does (:mod:`treadle.read.lookahead` over
    :class:`treadle.storage.chunkstore.ChunkStore`), one rank, rounds in turn with its steps:
    a step enters the window ``[now, now + window]`` (the first window in rounds of ``group``
    steps) and its chunks are asked for once, object by object (``chunk >> 28``, ascending):
    present ones are hits and held for the step; each missing one is fetched where room is
    made (``max_bytes``, chunks of ``size(chunk)`` bytes) by evicting present chunks needed
    after the step (farthest first, ties by ``tie(chunk)``: the store's (key, index)), else
    it is **owed**: each later round (each time the window moves on, the steps entering it
    after), before the steps entering, asks again for the owed chunks of steps past the
    ``read_ahead`` steps the reader may be reading (``now + read_ahead``), nearest step
    first: present (fetched for an earlier step), a hit; fetched, a miss; else still owed.
    A chunk still owed when its step is read is a miss. After each round the uses of the next
    ``group`` steps (or the rest) become known, all at once, when the first of them lies
    within ``now + horizon``; when a step is read its chunks
    take their next use among the known steps (none: never). ``misses`` of a step: the
    chunks it did not find; ``over``: chunks still owed when their step was read;
    ``stopped``: where the stage gave up, as the loader's does when more than half of the
    chunks asked for found no room."""
    st = _Stage(max_bytes, size, tie or (lambda c: (c >> 28, c & ((1 << 28) - 1))), {}, {})
    misses: list[list[int]] = [[] for _ in steps]
    pending, now, total, known = 0, 0, 0, -1
    horizon = max(horizon, window)
    for done in range(-1, len(steps)):
        if done >= 0:
            _release(st, steps[done].tolist(), done)
            st.unserved += len(st.deferred.pop(done, ()))
            now = done + 1
        if pending >= len(steps) and done >= 0:  # no step enters: a round for what is owed
            _retry(st, now, now + read_ahead, set(), misses)
        while pending < len(steps) and pending <= now + window:
            first, last = pending, min(now + window, len(steps) - 1, pending + group - 1)
            fetching: set[int] = set()
            _retry(st, now, now + read_ahead, fetching, misses)
            for step in range(pending, last + 1):
                if step > known:
                    known = _known(st, steps[step].tolist(), step)
                misses[step] = _ask(st, steps[step].tolist(), step, now, fetching)
                total += len(steps[step])
            pending = last + 1
            upto = min(known + group, len(steps) - 1)  # a round of steps at once, in reach
            for step in range(known + 1, upto + 1) if known < now + horizon else ():
                known = _known(st, steps[step].tolist(), step)
            if st.asked >= 64 and st.skipped > st.asked // 2:  # the stage gives up
                return _replay(misses, st, total, stopped=first)
    return _replay(misses, st, total)


def _replay(misses: list[list[int]], st: _Stage, total: int, stopped: int | None = None
            ) -> Replay:  # fmt: skip
    out = [np.asarray(sorted(m), np.int64) for m in misses]
    over = st.unserved + sum(map(len, st.deferred.values()))
    return Replay(out, st.hits, total, over, stopped=stopped)


def _known(st: _Stage, chunks: list[int], step: int) -> int:
    """The uses of ``step`` are known."""
    for c in chunks:
        st.uses.setdefault(c, deque()).append(step)
    return step


def _ask(st: _Stage, chunks: list[int], step: int, now: int, fetching: set[int]) -> list[int]:
    """A step enters the window: its chunks asked for, object by object; those that find
    no room are owed."""
    missed = []
    for obj in sorted({c >> 28 for c in chunks}):
        missed += _object(st, [c for c in chunks if c >> 28 == obj], step, now, fetching)
    st.asked += len(chunks)
    st.skipped += len(st.deferred.get(step, ()))
    return missed


def _retry(st: _Stage, now: int, reading: int, fetching: set[int],
           misses: list[list[int]]) -> None:  # fmt: skip
    """Ask again for the owed chunks of steps after ``reading`` (the last the reader may be
    reading), nearest step first, object by object: present, a hit (no longer a miss);
    fetched, a miss; else still owed."""
    for step in sorted(s for s in st.deferred if s > reading):
        owed = st.deferred.pop(step)
        for obj in sorted({c >> 28 for c in owed}):
            mine = [c for c in owed if c >> 28 == obj]
            absent = _object(st, mine, step, now, fetching)
            for c in set(mine).difference(absent):
                misses[step].remove(c)


def _object(st: _Stage, mine: list[int], step: int, now: int, fetching: set[int]) -> list[int]:
    """Chunks of one object asked for ``step`` (the store's ``reserve``): present ones are
    hits, held for it; each absent one is fetched where room is made, else owed. Returns
    the absent ones."""
    absent = [c for c in mine if c not in st.cached]
    for c in mine:
        if c in st.cached:
            st.hits += 1
            held = st.cached[c]
            st.cached[c] = step if held < now or held == step else min(held, step)
    for c in absent:
        if _room(st, st.size(c), step, now, fetching):
            st.cached[c] = step
            st.used += st.size(c)
            fetching.add(c)
        else:
            st.deferred.setdefault(step, []).append(c)
    return absent


def _room(st: _Stage, size: int, step: int, now: int, fetching: set[int]) -> bool:
    """Evict present chunks needed after ``step`` (stale next uses: never), farthest
    first, until ``size`` more bytes fit."""
    if st.used + size <= st.room:
        return True
    cands = [(NEVER if n < now else n, c) for c, n in st.cached.items() if c not in fetching]
    cands = sorted((x for x in cands if x[0] > step), key=lambda x: (-x[0], st.tie(x[1])))
    for _, c in cands:
        if st.used + size <= st.room:
            break
        del st.cached[c]
        st.used -= st.size(c)
    return st.used + size <= st.room


def _release(st: _Stage, chunks: list[int], step: int) -> None:
    """Step ``step`` was read: each chunk takes its next use in the window."""
    for c in chunks:
        q = st.uses.get(c)
        if q and q[0] == step:
            q.popleft()
        n = q[0] if q else NEVER
        if q is not None and not q:
            del st.uses[c]
        if c in st.cached:
            held = st.cached[c]
            st.cached[c] = n if held < step or held == step else min(held, n)
