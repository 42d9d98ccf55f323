"""Mergeable partial statistics of a column: float64 moments and a quantile sketch.

Both merge with another partial state of the same column (:meth:`Moments.merge`,
:meth:`Sketch.merge`): batch by batch in one scan, and scan by scan (an executor's tasks)
on the driver, with the same code. :mod:`treadle.stats.table_stats` says what is exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def rank_error_bound(n: int, k: int, levels: int) -> int:
    """Worst-case rank error of the sketch: each compaction at level ``h`` (weight ``2^h``)
    moves a rank by at most ``2^h`` and happens at most ``n / (2k 2^h)`` times, so all
    compactions move it by at most ``levels * n / (2k)``; the query adds one item's weight."""
    if levels == 0:
        return 0
    return int(math.ceil(levels * n / (2 * k))) + 2**levels


class Moments:
    """count, mean, M2, min, max per element, merged batch by batch (Chan et al.)."""

    def __init__(self) -> None:
        self.n = 0
        self.mean: np.ndarray | None = None
        self.m2: np.ndarray | None = None
        self.lo: np.ndarray | None = None
        self.hi: np.ndarray | None = None

    def add(self, x: np.ndarray) -> None:  # x: float64 [rows, E]
        if len(x):
            part = Moments()
            part.n, part.mean = len(x), x.mean(axis=0)
            part.m2 = ((x - part.mean) ** 2).sum(axis=0)
            part.lo, part.hi = x.min(axis=0), x.max(axis=0)
            self.merge(part)

    def merge(self, o: Moments) -> None:
        """Add another partial state (a batch here, a Ray task's rows on the driver)."""
        if o.n == 0:
            return
        if self.n == 0:
            self.n, self.mean, self.m2, self.lo, self.hi = o.n, o.mean, o.m2, o.lo, o.hi
            return
        n = self.n + o.n
        delta = o.mean - self.mean
        self.mean = self.mean + delta * (o.n / n)
        self.m2 = self.m2 + o.m2 + delta**2 * (self.n * o.n / n)
        self.lo, self.hi, self.n = np.minimum(self.lo, o.lo), np.maximum(self.hi, o.hi), n


class Sketch:
    """Deterministic compactor sketch per element; exact while nothing was compacted."""

    def __init__(self, elements: int, budget: int) -> None:
        self.k = max(64, budget // max(1, elements))  # items per element and level
        self.levels: list[list[np.ndarray]] = [[]]
        self.sizes = [0]
        self.flip: list[int] = [0]
        self.n = 0
        self.compacted: set[int] = set()  # levels that were compacted at least once

    def add(self, x: np.ndarray) -> None:
        self.n += len(x)
        self.levels[0].append(x)
        self.sizes[0] += len(x)
        self._settle()

    def merge(self, o: Sketch) -> None:
        """Add another sketch of the same column, level by level (same ``k``): exact while
        the two hold fewer than ``2k`` values together, as one sketch of all of them."""
        self.n += o.n
        for h, (items, size) in enumerate(zip(o.levels, o.sizes)):
            if h == len(self.levels):
                self.levels.append([])
                self.sizes.append(0)
                self.flip.append(0)
            self.levels[h].extend(items)
            self.sizes[h] += size
        self._settle()

    def _settle(self) -> None:
        h = 0
        while h < len(self.levels):
            if self.sizes[h] >= 2 * self.k:
                self._compact(h)
            h += 1

    def _compact(self, h: int) -> None:
        self.compacted.add(h)
        items = np.sort(np.concatenate(self.levels[h]), axis=0)
        m = len(items) - (len(items) % 2)
        up = items[self.flip[h] : m : 2]
        self.flip[h] ^= 1
        self.levels[h] = [items[m:]] if m < len(items) else []
        self.sizes[h] = len(items) - m
        if h + 1 == len(self.levels):
            self.levels.append([])
            self.sizes.append(0)
            self.flip.append(0)
        self.levels[h + 1].append(up)
        self.sizes[h + 1] += len(up)

    @property
    def compacted_levels(self) -> int:
        return len(self.levels) - 1

    def quantiles(self, qs: Sequence[float]) -> list[np.ndarray]:
        if self.compacted_levels == 0:
            values = np.concatenate(self.levels[0])
            return [np.quantile(values, q, axis=0) for q in qs]
        items = np.concatenate([a for lv in self.levels for a in lv])
        weights = np.concatenate(
            [np.full(len(a), 2**h, np.int64) for h, lv in enumerate(self.levels) for a in lv]
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
