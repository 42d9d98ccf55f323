"""Partial statistics of one column of one plan component, and their pooling over
components by the plan's weights (:mod:`treadle.read.planstats` says what is pooled).

A component's values all weigh the same (each of its anchors weighs ``share / eligible``),
so each component keeps unweighted :class:`~treadle.read.moments.Moments` and a
:class:`~treadle.read.moments.Sketch` per group (one, or one per window offset), over its
real elements only; pooling weighs them by ``a_c = share_c / eligible_c``: means and
population variances exactly (Chan's merge, weighted), quantiles as numpy's weighted
``inverted_cdf`` over every item held (each item weighs ``2^level * a_c``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from treadle.read.columnstats import ColumnStats
from treadle.read.moments import Moments, Sketch, rank_error_bound


@dataclass
class Part:
    """One column of one component: a (Moments, Sketch) per group, over the component's real
    elements, which sit at ``index`` among the column's ``size`` elements."""

    shape: tuple[int, ...]  # the column's per-group shape (after pad_to)
    index: np.ndarray  # flat element positions this component has (its real dimensions)
    groups: list[tuple[Moments, Sketch]] = field(default_factory=list)

    @classmethod
    def new(cls, shape: tuple[int, ...], real: int | None, groups: int, budget: int) -> Part:
        full = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
        index = full[..., :real].reshape(-1) if shape and real is not None else full.reshape(-1)
        per = max(1, budget // groups)
        return cls(shape, index, [(Moments(), Sketch(len(index), per)) for _ in range(groups)])

    def add(self, g: int, x: np.ndarray, w: np.ndarray | None = None) -> None:
        """Values ``x`` (``[rows, real elements]``) into group ``g``, each ``w`` times."""
        mom, sk = self.groups[g]
        x = np.ascontiguousarray(x, np.float64)
        if w is None:
            mom.add(x)
            sk.add(x)
        else:
            mom.add_weighted(x, w)
            sk.add_weighted(x, w)


@dataclass
class HistPart:
    """A video column of one component: per-channel counts of values 0..255 (``[C, 256]``)
    over its sampled frames."""

    hist: np.ndarray
    frames: int  # frames counted (padded ones left out)
    anchors: int  # anchors sampled (each weighs share / anchors in the pool)


def pool(parts: list[tuple[float, Part]], qs: tuple[float, ...]) -> ColumnStats:
    """Statistics of the mixture: part ``p`` weighted ``a`` per value."""
    shape, groups = parts[0][1].shape, len(parts[0][1].groups)
    e = math.prod(shape)
    count = np.zeros((groups, e), np.int64)
    wsum, msum = np.zeros((groups, e)), np.zeros((groups, e))
    lo, hi = np.full((groups, e), np.inf), np.full((groups, e), -np.inf)
    for a, p in parts:
        for g, (mom, _) in enumerate(p.groups):
            if mom.n:
                ix = p.index
                count[g, ix] += mom.n
                wsum[g, ix] += a * mom.n
                msum[g, ix] += a * mom.n * mom.mean
                lo[g, ix] = np.minimum(lo[g, ix], mom.lo)
                hi[g, ix] = np.maximum(hi[g, ix], mom.hi)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = msum / wsum
        m2 = np.zeros((groups, e))
        for a, p in parts:
            for g, (mom, _) in enumerate(p.groups):
                if mom.n:
                    m2[g, p.index] += a * (mom.m2 + mom.n * (mom.mean - mean[g, p.index]) ** 2)
        std = np.sqrt(np.maximum(m2 / wsum, 0.0))
    empty = count == 0
    lo[empty], hi[empty] = np.nan, np.nan
    values, err = _quantiles(parts, qs, groups, e)
    out_shape = (groups, *shape) if groups > 1 else shape
    r = lambda x: np.asarray(x, np.float64).reshape(out_shape)  # noqa: E731
    quant = {q: r(values[i]) for i, q in enumerate(qs)}
    samples = int(count.max(initial=0))  # values per element: what LeRobot's count counts
    return ColumnStats(count.reshape(out_shape), r(mean), r(std), r(lo), r(hi), quant[0.01],
                       quant[0.99], rank_error=err, quantiles=quant,
                       samples=samples)  # fmt: skip


def _quantiles(
    parts: list[tuple[float, Part]], qs: tuple[float, ...], groups: int, e: int
) -> tuple[np.ndarray, int]:
    """Weighted ``inverted_cdf`` quantiles per group and element, and their rank error
    bound (in values: the worst part's error as a fraction of its values, of the total)."""
    out = np.full((len(qs), groups, e), np.nan)
    worst, total = 0.0, 0
    for g in range(groups):
        held = []
        for a, p in parts:
            mom, sk = p.groups[g]
            if not mom.n:
                continue
            items, w = sk.weighted_items()
            pos = np.full(e, -1, np.int64)
            pos[p.index] = np.arange(len(p.index))
            held.append((items, w * a, pos))
            if sk.compacted:
                err = rank_error_bound(sk.n, sk.k, len(sk.compacted))
                worst = max(worst, err / sk.n)
            total = max(total, int(mom.n))
        for j in range(e):
            got = [(items[:, pos[j]], w) for items, w, pos in held if pos[j] >= 0]
            if got:
                vals = np.concatenate([v for v, _ in got])
                weights = np.concatenate([w for _, w in got])
                out[:, g, j] = weighted_quantiles(vals, weights, qs)
    return out, int(math.ceil(worst * total))


def weighted_quantiles(
    values: np.ndarray, weights: np.ndarray, qs: tuple[float, ...]
) -> np.ndarray:
    """numpy's ``quantile(values, qs, weights=weights, method="inverted_cdf")``: the first
    value (in sorted order) whose cumulative weight share reaches ``q``."""
    order = np.argsort(values, kind="stable")
    cdf = np.cumsum(weights[order], dtype=np.float64)
    cdf /= cdf[-1]
    idx = np.minimum(np.searchsorted(cdf, np.asarray(qs, np.float64), side="left"), len(cdf) - 1)
    return values[order][idx]


def pool_hist(parts: list[tuple[float, HistPart]], qs: tuple[float, ...]) -> ColumnStats:
    """Per-channel statistics of the weighted mixture of uint8 histograms."""
    hist = sum(a * p.hist for a, p in parts)
    count = sum(p.hist for _, p in parts).sum(axis=1)[0]
    v = np.arange(hist.shape[1], dtype=np.float64)
    n = hist.sum(axis=1)
    mean = (hist * v).sum(axis=1) / n
    std = np.sqrt((hist * (v - mean[:, None]) ** 2).sum(axis=1) / n)
    nz = hist > 0
    lo = nz.argmax(axis=1).astype(np.float64)
    hi = (hist.shape[1] - 1 - nz[:, ::-1].argmax(axis=1)).astype(np.float64)
    quant = {}
    for q in qs:
        cdf = np.cumsum(hist, axis=1) / n[:, None]
        idx = [min(int(np.searchsorted(cdf[c], q, side="left")), 255) for c in range(len(n))]
        quant[q] = np.asarray(idx, np.float64)
    frames = sum(p.frames for _, p in parts)
    return ColumnStats(np.asarray(count, np.int64), mean, std, lo, hi, quant[0.01], quant[0.99],
                       quantiles=quant, video=True, samples=frames)  # fmt: skip
