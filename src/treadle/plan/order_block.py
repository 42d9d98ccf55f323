"""The block shuffle (``td.BlockShuffle``): each epoch of a component is a permutation of its
eligible moments in which consecutive draws stay within a few blocks of consecutive moments.

A component has ``N`` eligible moments (indices ``0..N-1`` in table order). Its parameters:
``b`` (``block_rows``), ``w`` (``window_blocks``), ``P`` (``partitions``).

**Partitions.** Index ``i`` of an epoch (draw ``j``: epoch ``e = j div N``, ``i = j mod N``)
belongs to partition ``p = i mod P`` and is its ``m = i div P``-th draw of the epoch.
Partition ``p`` is the contiguous range of ``N_p = N div P + (p < N mod P)`` eligible
moments starting at ``p * (N div P) + min(p, N mod P)``: exactly as many as the epoch draws
from it. Everything below happens inside one partition (size ``n = N_p``), keyed by
``k = mix64(epoch_key ^ mix64(p + GOLDEN))``, ``epoch_key = mix64(base_c + e * GOLDEN)``,
``base_c = derive_key(BLOCK_DOMAIN, seed, c)``. With ``P = 1`` the partition is the component.

**Blocks.** The partition is cut into ``K = ceil(n / b)`` blocks of ``b`` consecutive
moments; the last, physical block ``K-1``, holds ``r = n - (K-1) b`` (``1 <= r <= b``). The
block order puts that short block at position ``q = mix64(k ^ Q) mod K`` and the ``K-1``
full blocks at the other positions in the order of a Feistel bijection of ``[0, K-1)`` keyed by
``k`` (:mod:`treadle.plan.permute`): position ``t != q`` holds full block
``perm_k(t - [t > q])``.

**Segments.** The block at position ``t`` (``n_t`` rows: ``b``, or ``r`` at ``q``) is cut into
``w`` parts, part ``x`` its rows ``[floor(x n_t / w), floor((x+1) n_t / w))``, and part ``x``
is consumed in segment ``t + x``. So segment ``s`` (``0 <= s < K + w - 1``) holds part
``s - t`` of every block at position ``t`` in ``s-w+1 .. s``: at most ``w`` blocks are
open at once, each block is read over ``w`` consecutive segments, ``b / w`` rows each (parts
may be empty when ``b < w``). Segments follow each other in order; the rows of segment ``s``
are ordered by a Feistel bijection of its size keyed by ``mix64(k ^ mix64((s+1) GOLDEN))``.
Within it, before that permutation, full blocks' parts come first by ascending ``x`` (they tile
block rows ``[floor(x_lo b/w), floor((x_hi+1) b/w))`` less the short block's part), then the
short block's part when ``q`` is among the segment's blocks.

**The epoch's ends.** The first ``w-1`` segments hold parts of fewer than ``w`` blocks
(segment 0: part 0 of the first block only), and so do the last ``w-1`` (segment ``K+w-2``:
the last part of the last block): the epoch ramps up and down, and it ends exactly after its
``N`` draws, when every block's last part has been read. The next epoch starts with a new
block order (a new ``e``); no block is open across an epoch boundary.

**Exclusions** (``plan.exclude``) redraw an excluded draw *within its segment*:
:meth:`BlockOrder.eligible` with ``attempt=a`` moves the draw from its segment position ``o``
to ``(o + 1 + h_a mod (L-1)) mod L`` (``L`` the segment's size, ``h_a`` keyed by the segment
key and ``a``), so the replacement comes from the same open blocks (see
:mod:`treadle.plan.exclude`).

Costs: a draw is ``O(log w)`` vectorised numpy work (the segment is found by bisection over
closed-form segment starts, within ``w + 1`` of ``m div b``); nothing is materialised per
epoch. The exact arithmetic is part of the shuffle ``treadle.block/1`` that a run record
names.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from treadle.plan.permute import GOLDEN, derive_key, domains_of_sizes, epoch_keys, mix64, permute

BLOCK_DOMAIN = 0x626C6B73  # "blks"
_GOLDEN = np.uint64(GOLDEN)
_Q = np.uint64(0x3C6EF372FE94F82B)  # the short block's position
_NEAR = np.uint64(0xA54FF53A5F1D36F1)  # an exclusion's redraw offsets
MAX_WINDOW_BLOCKS = 1024


def _mix(key: np.ndarray, value: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return mix64(key ^ mix64(value.astype(np.uint64) + _GOLDEN))


class BlockOrder:
    """The block shuffle of every component (vectorised; see the module docstring)."""

    def __init__(
        self,
        seed: int,
        eligible: Sequence[int],
        block_rows: Sequence[int],
        window_blocks: int,
        partitions: int,
    ):
        self.n = np.asarray(eligible, dtype=np.int64)
        self.b = np.asarray(block_rows, dtype=np.int64)
        self.w = int(window_blocks)
        self.partitions = int(partitions)
        self._base = np.asarray(
            [derive_key(BLOCK_DOMAIN, seed, c) for c in range(len(self.n))], dtype=np.uint64
        )
        # cp[c, y] = sum over x = 1..y of floor(x b_c / w): rows of parts before a segment
        x = np.arange(self.w + 1, dtype=np.int64)
        parts = self.b[:, None] * x[None, :] // self.w
        self._cp = np.cumsum(parts, axis=1) if len(self.n) else parts

    def partition(self, comp: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The partition of each epoch index: ``index mod P``."""
        return np.asarray(index, np.int64) % self.partitions

    def eligible(
        self, comp: np.ndarray, epoch: np.ndarray, index: np.ndarray, attempt: int | None = None
    ) -> np.ndarray:
        """Eligible index (int64) of each draw (component, epoch, index within the epoch);
        ``attempt``: an exclusion's ``attempt``-th redraw within the draw's segment."""
        comp = np.asarray(comp, np.int64)
        index = np.asarray(index, np.int64)
        big = self.partitions
        p, m = np.divmod(index, big)[::-1] if big > 1 else (np.zeros_like(index), index)
        n_c = self.n[comp]
        start_p = p * (n_c // big) + np.minimum(p, n_c % big)
        n = n_c // big + (p < n_c % big)
        key = _mix(epoch_keys(self._base[comp], np.asarray(epoch, np.int64)), p)
        return start_p + self._within(comp, n, key, m, attempt)

    def _within(self, comp, n, key, m, attempt):
        b, w = self.b[comp], self.w
        blocks = -(-n // b)
        short = n - (blocks - 1) * b
        q = (mix64(key ^ _Q) % blocks.astype(np.uint64)).astype(np.int64)
        s = self._segment(comp, b, blocks, short, q, m)
        begin = self._start(comp, b, blocks, short, q, s)
        size = self._start(comp, b, blocks, short, q, s + 1) - begin
        seg_key = _mix(key, s + 1)
        at = permute(m - begin, np.arange(len(m)), domains_of_sizes(size), seg_key)
        at = at.astype(np.int64)
        if attempt is not None:
            hop = mix64(seg_key ^ _NEAR ^ np.uint64(attempt)) % np.maximum(size - 1, 1).astype(
                np.uint64
            )
            at = np.where(size > 1, (at + 1 + hop.astype(np.int64)) % size, at)
        row, pos = self._place(b, w, blocks, short, q, s, at)
        full = pos != q
        phys = np.full(pos.shape, 0, np.int64)
        phys[~full] = blocks[~full] - 1
        if full.any():
            j = pos[full] - (pos[full] > q[full])
            order = permute(j, np.arange(int(full.sum())), domains_of_sizes(blocks[full] - 1),
                            key[full])  # fmt: skip
            phys[full] = order.astype(np.int64)
        return phys * b + row

    def _start(self, comp, b, blocks, short, q, s):
        """Rows in segments before ``s`` (closed form)."""
        w = self.w

        def g(y):  # sum over x = 1..y of floor(x b / w), parts saturating at b past w
            yc = np.minimum(np.maximum(y, 0), w)  # np.clip costs several times more
            return self._cp[comp, yc] + np.maximum(y - w, 0) * b

        x = np.minimum(np.maximum(s - q, 0), w)
        return g(s) - g(s - blocks) + (short * x // w - b * x // w)

    def _segment(self, comp, b, blocks, short, q, m):
        """The segment of each sub-index: bisection over :meth:`_start`, between bounds
        ``w + 1`` segments apart: ``start(s) <= s b`` (segments before ``s`` hold parts of
        at most ``s`` blocks) and ``start(s) >= (s - w) b`` (the blocks at positions up to
        ``s - w`` are read whole, at most one of them short), so ``m // b <= s <= m // b + w``."""
        lo = m // b
        hi = np.minimum(blocks + self.w - 1, lo + self.w + 1)
        while True:
            open_ = hi - lo > 1
            if not open_.any():
                return lo
            mid = (lo + hi) // 2
            right = open_ & (self._start(comp, b, blocks, short, q, mid) <= m)
            lo = np.where(right, mid, lo)
            hi = np.where(open_ & ~right, mid, hi)

    @staticmethod
    def _place(b, w, blocks, short, q, s, at):
        """(row in its block, block position) of segment position ``at``."""
        x_lo = np.maximum(0, s - blocks + 1)
        x_hi = np.minimum(w - 1, s)
        xq = s - q
        has_q = (xq >= 0) & (xq < w)
        xqc = np.minimum(np.maximum(xq, 0), w - 1)
        hole = np.where(has_q, b * (xqc + 1) // w - b * xqc // w, 0)
        low = b * x_lo // w
        full_len = b * (x_hi + 1) // w - low - hole
        y = low + at
        y = np.where(has_q & (y >= b * xqc // w), y + hole, y)
        x = ((y + 1) * w - 1) // b  # the part holding block row y
        in_full = at < full_len
        row = np.where(in_full, y, short * xqc // w + (at - full_len))
        pos = np.where(in_full, s - x, q)
        return row, pos


def block_index(
    seed: int,
    component: int,
    epoch: int,
    index: int,
    eligible: int,
    block_rows: int,
    window_blocks: int,
    partitions: int = 1,
) -> int:
    """The eligible index of one draw of a block shuffle (pure)."""
    order = BlockOrder(
        seed, [1] * component + [eligible], [1] * component + [block_rows], window_blocks,
        partitions,
    )  # fmt: skip
    one = np.asarray([component], np.int64)
    return int(order.eligible(one, np.asarray([epoch]), np.asarray([index]))[0])
