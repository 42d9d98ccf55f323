"""Partial statistics of one column of one plan component, and their pooling over
components by the plan's weights (:mod:`treadle.stats.plan_stats` says what is pooled).

A component's values all weigh the same (each of its anchors weighs ``share / eligible``),
so each component keeps unweighted :class:`~treadle.stats.moments.Moments` and a
:class:`~treadle.stats.moments.Sketch` per group (one, or one per window offset), over its
real elements only; pooling weighs them by ``a_c = share_c / eligible_c``: means and
population variances exactly (Chan's merge, weighted), quantiles as numpy's weighted
``inverted_cdf`` over every item held (each item weighs ``2^level * a_c``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from math import gcd, lcm

import numpy as np

from treadle.stats.column_stats import ColumnStats
from treadle.stats.moments import Moments, Sketch, histogram_moments

Weight = Fraction | float  # a value's weight in the pool: share / eligible, exactly


class Counted:
    """Rows that enter ``w`` times each: one unweighted :class:`Sketch` per multiplicity
    ``w`` (a window of ``T`` offsets takes most rows ``T`` times and the rows near an
    episode's ends fewer), so a row costs one sketch item whatever its multiplicity."""

    def __init__(self, elements: int, budget: int):
        self.elements, self.budget = elements, budget
        self.by: dict[int, Sketch] = {}

    def add(self, mom: Moments, x: np.ndarray, w: np.ndarray | None = None) -> None:
        """Rows ``x`` (``[rows, E]``, any numeric dtype), each ``w`` times (None: once),
        into these sketches and ``mom``: the rows of one multiplicity ``v``, picked from
        ``x`` as it is and then made :func:`column_major` (one pass), enter the moments as
        one batch of ``v``-fold weight (count and M2 times ``v``: the mean and the spread
        of ``v`` copies) and sketch ``v``."""
        if w is None:
            rows = column_major(x)
            mom.add(rows, raw=np.asarray(x))
            self._of(1).add(rows)
            return
        for v in np.flatnonzero(np.bincount(w)).tolist():
            if v > 0:
                mask = w == v
                picked = x if mask.all() else np.compress(mask, x, axis=0)
                rows = column_major(picked)
                mom.add(rows, v, raw=np.asarray(picked))  # integers: exact min/max
                self._of(v).add(rows)

    def _of(self, w: int) -> Sketch:
        if w not in self.by:
            self.by[w] = Sketch(self.elements, self.budget)
        return self.by[w]


@dataclass
class Part:
    """One column of one component: a (Moments, Sketch) per group, over the component's real
    elements, which sit at ``index`` among the column's ``size`` elements."""

    shape: tuple[int, ...]  # the column's per-group shape (after pad_to)
    index: np.ndarray  # flat element positions this component has (its real dimensions)
    groups: list[tuple[Moments, Counted]] = field(default_factory=list)
    per_offset: bool = False  # one group per window offset: fields [T, *shape], T = 1 too
    anchors: int = 0  # samples (anchors) whose values it holds: what LeRobot's count counts

    @classmethod
    def new(cls, shape: tuple[int, ...], real: int | None, groups: int, budget: int) -> Part:
        full = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
        index = full[..., :real].reshape(-1) if shape and real is not None else full.reshape(-1)
        per = max(1, budget // groups)
        return cls(shape, index, [(Moments(), Counted(len(index), per)) for _ in range(groups)])

    def add(self, g: int, x: np.ndarray, w: np.ndarray | None = None) -> None:
        """Values ``x`` (``[rows, real elements]``, not to be changed after: the sketches
        may keep it) into group ``g``, each ``w`` times."""
        mom, sk = self.groups[g]
        sk.add(mom, x, w)


def column_major(x: np.ndarray) -> np.ndarray:
    """Rows ``[rows, E]`` as float64 laid out element by element (``x.T`` C-contiguous):
    what the sketches sort and the moments reduce along; ``x`` itself when it already is,
    else one pass over it."""
    x = np.asarray(x)
    if x.dtype == np.float64 and x.T.flags.c_contiguous:
        return x
    return x.T.astype(np.float64, order="C").T


@dataclass
class HistPart:
    """A video column of one component: per-channel counts of values 0..255 (``[C, 256]``,
    or ``[T, C, 256]`` per window offset) over its sampled frames."""

    hist: np.ndarray
    frames: int  # frames counted (padded ones left out)
    anchors: int  # anchors sampled (each weighs share / anchors in the pool)


def pool(parts: list[tuple[Weight, Part]], qs: tuple[float, ...]) -> ColumnStats:
    """Statistics of the mixture: part ``p`` weighted ``a`` per value (a ``Fraction``: the
    quantiles weigh exactly; moments in float64)."""
    shape, groups = parts[0][1].shape, len(parts[0][1].groups)
    e = math.prod(shape)
    count = np.zeros((groups, e), np.int64)
    wsum, msum = np.zeros((groups, e)), np.zeros((groups, e))
    lo: list[np.ndarray | None] = [None] * groups  # in the values' dtype: exact integers
    hi: list[np.ndarray | None] = [None] * groups
    ref = np.full((groups, e), np.nan)  # a part's shift: means relative to it keep precision
    for a, p in ((float(a), p) for a, p in parts):
        for g, (mom, _) in enumerate(p.groups):
            if mom.n:
                ix = p.index
                ref[g, ix] = np.where(np.isnan(ref[g, ix]), mom.shift, ref[g, ix])
                lo[g] = _fold(lo[g], count[g] > 0, ix, mom.lo, np.minimum)
                hi[g] = _fold(hi[g], count[g] > 0, ix, mom.hi, np.maximum)
                count[g, ix] += mom.n
                wsum[g, ix] += a * mom.n
                msum[g, ix] += a * mom.n * _rel(mom, ref[g, ix])
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = msum / wsum
        m2 = np.zeros((groups, e))
        for a, p in ((float(a), p) for a, p in parts):
            for g, (mom, _) in enumerate(p.groups):
                if mom.n:
                    ix = p.index
                    dev = _rel(mom, ref[g, ix]) - rel[g, ix]
                    m2[g, ix] += a * (mom.m2 + mom.n * dev**2)
        std = np.sqrt(np.maximum(m2 / wsum, 0.0))
        mean = ref + rel
    lo_all, hi_all = _extremes(lo, count == 0), _extremes(hi, count == 0)
    values, err = _quantiles(parts, qs, groups, e)
    values[:, np.isnan(lo_all.astype(np.float64))] = np.nan  # a NaN value: NaN quantiles
    out_shape = (groups, *shape) if groups > 1 or parts[0][1].per_offset else shape
    r = lambda x: np.asarray(x, np.float64).reshape(out_shape)  # noqa: E731
    quant = {q: r(values[i]) for i, q in enumerate(qs)}
    # LeRobot counts samples (frames, each the anchor of its window), not values: a row that
    # T windows take is one value T times
    samples = sum(p.anchors for _, p in parts)
    return ColumnStats(count.reshape(out_shape), r(mean), r(std), lo_all.reshape(out_shape),
                       hi_all.reshape(out_shape), quant[0.01],
                       quant[0.99], rank_error=err, quantiles=quant,
                       samples=samples)  # fmt: skip


def _fold(
    cur: np.ndarray | None, seen: np.ndarray, ix: np.ndarray, v: np.ndarray, pick: np.ufunc
) -> np.ndarray:
    """A group's min (or max) per element, ``cur``, with a part's ``v`` at elements ``ix``
    (``seen``: elements that hold values already), in the dtype numpy's concatenation of the
    values would have (integers stay exact)."""
    dtype = np.result_type(v) if cur is None else np.result_type(cur, v)
    out = np.zeros(len(seen), dtype) if cur is None else cur.astype(dtype, copy=False)
    out[ix] = np.where(seen[ix], pick(out[ix], v), v)
    return out


def _extremes(per_group: list[np.ndarray | None], empty: np.ndarray) -> np.ndarray:
    """``[groups, E]`` min (or max): float64 with NaN where an element has no values (or
    where no group has any), else the values' dtype (integers exact)."""
    got = [v for v in per_group if v is not None]
    dtype = np.result_type(*got) if got else np.float64
    if empty.any():
        dtype = np.float64
    out = np.zeros(empty.shape, dtype)
    for g, v in enumerate(per_group):
        if v is not None:
            out[g] = v
    if empty.any():
        out[empty] = np.nan
    return out


def _rel(mom: Moments, ref: np.ndarray) -> np.ndarray:
    """``mom``'s mean relative to ``ref`` (shifts of nearby values subtract exactly)."""
    return (mom.shift - ref) + mom.rel


def _quantiles(
    parts: list[tuple[Weight, Part]], qs: tuple[float, ...], groups: int, e: int
) -> tuple[np.ndarray, int]:
    """Weighted ``inverted_cdf`` quantiles per group and element, and their rank error
    bound (in values: the worst part's error as a fraction of its values, of all values
    of a group, every part's)."""
    out = np.full((len(qs), groups, e), np.nan)
    worst, total = 0.0, 0
    for g in range(groups):
        total = max(total, sum(int(p.groups[g][0].n) for _, p in parts))
        held = []  # per part and sketch level: items sorted per element, their weight, where
        for a, p in parts:
            mom, counted = p.groups[g]
            if not mom.n:
                continue
            pos = np.full(e, -1, np.int64)
            pos[p.index] = np.arange(len(p.index))
            for times, sk in counted.by.items():
                for h, items in sorted_levels(sk):
                    held.append((items, Fraction(a) * times * 2**h, pos))
                if sk.compacted_levels:
                    worst = max(worst, sk.rank_error() / sk.n)
            total = max(total, int(mom.n))
        held = [(items, w, pos) for (items, _, pos), w in
                zip(held, integer_weights([w for _, w, _ in held]))]  # fmt: skip
        for j in range(e):
            got = [(items[pos[j]], w) for items, w, pos in held if pos[j] >= 0]
            if got:
                out[:, g, j] = weighted_quantiles(got, qs)
    return out, int(math.ceil(worst * total))


def sorted_levels(sk: Sketch) -> list[tuple[int, np.ndarray]]:
    """The sketch's non-empty levels as ``(level, items [E, m] sorted per element)``, sorted
    once (kept on the sketch: the pooled and the per-component statistics share them)."""
    got = getattr(sk, "_sorted", None)
    if got is None:
        got = sk.sorted_levels()
        sk._sorted = got
    return got


def integer_weights(weights: list[Fraction]) -> list[int]:
    """Exact weights as the least integers in the same ratios (over their common
    denominator): sums of them tie exactly where the weights do."""
    if not weights:
        return []
    den = lcm(*(w.denominator for w in weights))
    ints = [int(w * den) for w in weights]
    g = gcd(*ints) or 1
    return [w // g for w in ints]


def shares_reach(num: np.ndarray, total: int, q: np.ndarray) -> np.ndarray:
    """Whether each weight share ``num / total`` (exact integers) reaches ``q``, the share
    rounded once to float64 as numpy's weighted ``inverted_cdf`` rounds ``cumsum / sum``
    of integer weights (exactly: float64 holds integers below 2**53, and one division
    rounds correctly; beyond, Python's integer division does)."""
    if total < 2**53:
        return np.asarray(num, np.int64) / total >= q
    return np.asarray([int(x) / total for x in num], np.float64) >= q


def weighted_quantiles(levels: list[tuple[np.ndarray, int]], qs: tuple[float, ...]) -> np.ndarray:
    """numpy's ``quantile(values, qs, weights=w, method="inverted_cdf")`` over sorted runs of
    values of one integer weight each (:func:`integer_weights`): the least value ``v`` whose
    weight share ``W(<= v) / W`` reaches ``q``, found by bisection in each run (no sort of
    all values together), with the shares summed exactly."""
    q = np.asarray(qs, np.float64)
    total = sum(w * len(s) for s, w in levels)
    big = total >= 2**62  # sums int64 cannot hold: Python integers

    def reach(v: np.ndarray) -> np.ndarray:
        num = sum(np.searchsorted(s, v, side="right").astype(object if big else np.int64) * w
                  for s, w in levels)  # fmt: skip
        return shares_reach(num, total, q)

    best = np.full(len(q), np.inf)
    for s, _ in levels:
        lo, hi = np.zeros(len(q), np.int64), np.full(len(q), len(s), np.int64)
        while (lo < hi).any():  # least index whose share reaches q (len(s): none)
            mid = (lo + hi) // 2
            ok = reach(s[np.minimum(mid, len(s) - 1)])
            live = lo < hi
            hi = np.where(live & ok, mid, hi)
            lo = np.where(live & ~ok, mid + 1, lo)
        found = lo < len(s)
        best[found] = np.minimum(best[found], s[lo[found]])
    return best


def pool_hist(parts: list[tuple[Weight, HistPart]], qs: tuple[float, ...]) -> ColumnStats:
    """Per-channel statistics of the weighted mixture of uint8 histograms (``[C, 256]``, or
    ``[T, C, 256]`` per window offset: fields ``[T, C]``); quantiles from exact integer
    weights, as :func:`pool`'s."""
    hist = sum(float(a) * p.hist for a, p in parts)
    count = sum(p.hist for _, p in parts).sum(axis=-1)  # pixels per (offset and) channel
    count = count[0] if count.ndim == 1 else count  # pooled over offsets: one number, as ever
    flat = hist.reshape(-1, hist.shape[-1])  # every (offset, channel)
    n, mean, std, lo, hi = histogram_moments(flat)
    ints = integer_weights([Fraction(a) for a, _ in parts])
    exact = sum(p.hist.astype(np.int64).astype(object) * w for (_, p), w in zip(parts, ints))
    cum = np.cumsum(exact.reshape(-1, hist.shape[-1]), axis=1)  # Python integers: no overflow
    quant = {}
    for q in qs:  # the least value held (count > 0: q = 0 is the least, not bin 0)
        idx = [min(int(np.argmax(shares_reach(cum[c], int(cum[c, -1]), np.float64(q))
                                 & (cum[c] > 0))), 255)
               if cum[c, -1] else 0 for c in range(len(cum))]  # fmt: skip
        quant[q] = np.asarray(idx, np.float64).reshape(hist.shape[:-1])
    mean, std, lo, hi = (v.reshape(hist.shape[:-1]) for v in (mean, std, lo, hi))
    frames = sum(p.frames for _, p in parts)
    return ColumnStats(np.asarray(count, np.int64), mean, std, lo, hi, quant[0.01], quant[0.99],
                       quantiles=quant, video=True, samples=frames)  # fmt: skip
