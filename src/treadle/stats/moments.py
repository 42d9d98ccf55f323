"""Mergeable partial statistics of a column: float64 moments and a quantile sketch.

Both merge with another partial state of the same column (:meth:`Moments.merge`,
:meth:`Sketch.merge`): batch by batch in one scan, and scan by scan (an executor's tasks)
on the driver, with the same code. :mod:`treadle.stats.table_stats` says what is exact.

**The sketch's memory is bounded whatever the number of values**: at most
``2k * FULL_LEVELS`` items per element between calls (levels of ``2k`` items up to
:data:`FULL_LEVELS` levels, then ``2k * FULL_LEVELS / levels`` each: :func:`capacity`),
plus, during an ``add``, the values added and one level being compacted. Its rank error
grows instead: :func:`rank_error_bound` ``= ceil(C n / capacity(k, C + 1)) + 2^C`` for
``C`` compacted levels, about ``C^2 n / (6k)`` past ``FULL_LEVELS`` (``k`` = 149,796,
a 7-element column of ``table.stats``: 1e7 values, 6 levels: 532 values, 5e-5 of them;
1e9: 14 levels, 2.5e-4; 1e10: 18 levels, 4.1e-4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

FULL_LEVELS = 3  # levels of 2k items each before the per-level capacity shrinks


def capacity(k: int, levels: int) -> int:
    """Items per element a level holds before it is compacted, with ``levels`` levels in
    the sketch: ``2k`` up to :data:`FULL_LEVELS` levels, then ``2k * FULL_LEVELS / levels``
    (even), so the sketch never holds more than ``2k * FULL_LEVELS`` items per element."""
    if levels <= FULL_LEVELS:
        return 2 * k
    return max(2, (2 * k * FULL_LEVELS // levels) & ~1)


def rank_error_bound(n: int, k: int, levels: int) -> int:
    """Worst-case rank error of a sketch of ``n`` values with ``levels`` compacted levels:
    a compaction at level ``h`` (items of weight ``2^h``) moves a rank by at most ``2^h``
    and consumes at least ``c = capacity(k, levels + 1)`` items (capacities only shrink
    as levels are added), so it happens at most ``n / (c 2^h)`` times; all compactions
    move a rank by at most ``levels * n / c``, and the query adds one item's weight.
    With ``c = 2k`` (up to :data:`FULL_LEVELS` levels) that is ``levels * n / (2k)``."""
    if levels == 0:
        return 0
    return int(math.ceil(levels * n / capacity(k, levels + 1))) + 2**levels


class Moments:
    """count, mean, M2, min, max per element, merged batch by batch (Chan et al.).

    min and max of integer values (given as ``raw``) are kept in their dtype, merged as
    numpy promotes (int8 with int64: int64; int64 with uint64: float64, as
    ``np.concatenate`` does), so they equal numpy's over the values, also past ``2**53``.

    The mean is kept as ``shift + rel``: ``shift`` a value of the first batch (per element,
    0 where not finite), ``rel`` the mean of ``x - shift``. Values far from 0 with a small
    spread (``1e9 + noise``) keep their deviations: merged means differ by ``rel``s that
    float64 holds to full precision, where means rounded at ``1e9`` would add their rounding
    (``ulp(1e9) = 1.2e-7``) squared to the variance of every merge."""

    def __init__(self) -> None:
        self.n = 0
        self.shift: np.ndarray | None = None
        self.rel: np.ndarray | None = None
        self.m2: np.ndarray | None = None
        self.lo: np.ndarray | None = None
        self.hi: np.ndarray | None = None

    @property
    def mean(self) -> np.ndarray | None:
        """The mean per element (``shift + rel``)."""
        return None if self.rel is None else self.shift + self.rel

    def add(self, x: np.ndarray, times: int = 1, raw: np.ndarray | None = None) -> None:
        """Values ``x`` float64 ``[rows, E]`` (column-major is fastest), each counted
        ``times`` times (count and M2 times ``times``: the spread of that many copies).
        ``raw``: the same values as read; integers give min and max in their own dtype,
        exact where float64 rounds them (timestamps in ns, past ``2**53``)."""
        if len(x):
            part = Moments()
            part.shift = np.where(np.isfinite(x[0]), x[0], 0.0)
            d = x - part.shift
            part.rel = d.mean(axis=0)
            d -= part.rel
            d *= d
            part.n, part.m2 = len(x) * times, d.sum(axis=0) * times
            ext = raw if raw is not None and raw.dtype.kind in "iu" else x
            part.lo, part.hi = ext.min(axis=0), ext.max(axis=0)
            self.merge(part)

    def merge(self, o: Moments) -> None:
        """Add another partial state (a batch here, a Ray task's rows on the driver)."""
        if o.n == 0:
            return
        if self.n == 0:
            self.n, self.shift, self.rel, self.m2 = o.n, o.shift, o.rel, o.m2
            self.lo, self.hi = o.lo, o.hi
            return
        n = self.n + o.n
        delta = (o.shift - self.shift) + (o.rel - self.rel)
        self.rel = self.rel + delta * (o.n / n)
        self.m2 = self.m2 + o.m2 + delta**2 * (self.n * o.n / n)
        self.lo, self.hi, self.n = np.minimum(self.lo, o.lo), np.maximum(self.hi, o.hi), n


class Sketch:
    """Deterministic compactor sketch per element; exact while nothing was compacted.

    Level ``h`` holds items of weight ``2^h`` as runs ``[E, m]`` (one row per element,
    contiguous, so sorting is along rows); when it holds :func:`capacity` items it is
    sorted and every other item (alternating which) moves up. Level 0 takes the values
    as they come (sorted by numpy's quicksort), every higher level sorted runs (merged by
    its stable sort, linear in the items). At most ``2k * FULL_LEVELS`` items per element
    are held between calls, whatever the number of values."""

    def __init__(self, elements: int, budget: int) -> None:
        self.k = max(64, budget // max(1, elements))  # items per element and level
        self.levels: list[list[np.ndarray]] = [[]]  # runs [E, m] per level
        self.sizes = [0]
        self.flip: list[int] = [0]
        self.n = 0
        self.compacted: set[int] = set()  # levels that were compacted at least once

    def add(self, x: np.ndarray) -> None:
        """Values ``x`` ``[rows, E]``; kept by reference when column-major float64 (the
        caller does not change them after), copied per element otherwise."""
        if len(x):
            xt = np.ascontiguousarray(np.asarray(x, np.float64).T)
            self.n += xt.shape[1]
            self.levels[0].append(xt)
            self.sizes[0] += xt.shape[1]
            self._settle()

    def merge(self, o: Sketch) -> None:
        """Add another sketch of the same column, level by level (same ``k``): exact while
        the two hold fewer than ``2k`` values together, as one sketch of all of them."""
        self.n += o.n
        for h, (items, size) in enumerate(zip(o.levels, o.sizes)):
            if h == len(self.levels):
                self._grow()
            self.levels[h].extend(items)
            self.sizes[h] += size
        self.compacted |= o.compacted
        self._settle()

    def _grow(self) -> None:
        self.levels.append([])
        self.sizes.append(0)
        self.flip.append(0)

    def _settle(self) -> None:
        settled = False
        while not settled:  # a new level shrinks every level's capacity: settle again
            settled = True
            cap = capacity(self.k, len(self.levels))
            for h in range(len(self.levels)):
                if self.sizes[h] >= cap:
                    self._compact(h)
                    settled = False
                    break

    def _compact(self, h: int) -> None:
        self.compacted.add(h)
        lv = self.levels[h]
        items = np.concatenate(lv, axis=1) if len(lv) > 1 else lv[0].copy()
        items.sort(axis=1, kind="quicksort" if h == 0 else "stable")
        size = items.shape[1]
        m = size - (size % 2)
        up = items[:, self.flip[h] : m : 2].copy()  # copies: never keep `items` alive
        self.flip[h] ^= 1
        self.levels[h] = [items[:, m:].copy()] if m < size else []
        self.sizes[h] = size - m
        if h + 1 == len(self.levels):
            self._grow()
        self.levels[h + 1].append(up)
        self.sizes[h + 1] += up.shape[1]

    @property
    def compacted_levels(self) -> int:
        return len(self.levels) - 1

    def rank_error(self) -> int:
        """:func:`rank_error_bound` of this sketch (0 while exact)."""
        return rank_error_bound(self.n, self.k, self.compacted_levels)

    def sorted_levels(self) -> list[tuple[int, np.ndarray]]:
        """The non-empty levels as ``(level, items [E, m] sorted per element)``, not to be
        changed: each level keeps that one sorted run as its items (no second copy)."""
        out = []
        for h, lv in enumerate(self.levels):
            if self.sizes[h]:
                items = np.concatenate(lv, axis=1) if len(lv) > 1 else lv[0].copy()
                items.sort(axis=1, kind="quicksort" if h == 0 else "stable")
                self.levels[h] = [items]
                out.append((h, items))
        return out

    def quantiles(self, qs: Sequence[float]) -> list[np.ndarray]:
        if self.compacted_levels == 0:
            values = np.concatenate(self.levels[0], axis=1)
            return [np.quantile(values, q, axis=1) for q in qs]
        items = np.concatenate([a for lv in self.levels for a in lv], axis=1).T  # [m, E]
        weights = np.concatenate(
            [np.full(a.shape[1], 2**h, np.int64) for h, lv in enumerate(self.levels) for a in lv]
        )
        order = np.argsort(items, axis=0, kind="stable")
        cum = np.cumsum(weights[order], axis=0)  # [m, E]
        out = []
        for q in qs:
            target = q * (self.n - 1)
            # first item whose cumulative weight exceeds the target rank
            idx = (cum <= target).sum(axis=0)
            idx = np.minimum(idx, len(items) - 1)
            cols = np.arange(items.shape[1])
            out.append(items[order[idx, cols], cols])
        return out


def histogram_moments(
    hist: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(count, mean, population std, min, max)`` per channel of the values ``0..K-1``
    counted (or weighted) by ``hist`` ``[C, K]``, exact in float64."""
    v = np.arange(hist.shape[1], dtype=np.float64)
    n = hist.sum(axis=1)
    mean = (hist * v).sum(axis=1) / n
    std = np.sqrt((hist * (v - mean[:, None]) ** 2).sum(axis=1) / n)
    nz = hist > 0
    lo = nz.argmax(axis=1).astype(np.float64)
    hi = (hist.shape[1] - 1 - nz[:, ::-1].argmax(axis=1)).astype(np.float64)
    return n, mean, std, lo, hi
