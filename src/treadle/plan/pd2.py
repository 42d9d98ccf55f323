"""The PD2 seat schedule of :mod:`treadle.plan.schedule`, simulated for many chunks of the
period at once with numpy; the same schedule as :mod:`treadle.plan.pd2_serial`, bit for bit.

**Tables.** For rates ``a_c / p`` (``0 <= a_c < p``): ``J(s)``, the components whose
``floor(s*a_c/p)`` steps up at ``s+1``, and ``W(s)``, those with ``(s+1)*a_c/p`` whole, as one
64-bit word per step (at most 64 components), and ``K(s+1)``, the seats ahead after step ``s``
(the cumulative sum of ``R - |J|``). ``J`` is built from each component's jump positions
(``ceil(k*p/a) - 1``), or for ``a > p/2`` from its fewer non-jumps (``floor(k*p/(p-a))``).

**Transition.** :func:`step` is the PD2 transition of :func:`treadle.plan.pd2_serial.run` for
a vector of (step, state) rows: the same candidates, the same order (the earlier deadline,
b-bit 1 first, heavy tasks by later group deadline, then the lower index), decided with bit
operations level by level, and by explicit keys (:func:`_by_key`) for deadlines more than
``LEVELS`` steps away.

**Chunks.** The period is cut into ~``sqrt(p/8)``-step chunks (a few thousand for
``p = 10**6``); every chunk starts ``WARMUP`` steps before its first step from a guessed
state (the ``K(t)`` components due soonest) and all chunks advance together, one numpy call
per operation for all of them, their tables gathered ``SLAB`` steps at a time one row per
step. A PD2 state mostly forgets where it came from within a few dozen steps (tiny shares and
equal ones remember longer), so a chunk's state at its first step is almost always the one
the chunk before it ends with. :func:`simulate` re-runs, in order and one step at a time, each
chunk whose start differs from the end of the chunk before it, until its new path meets the
old one, so the schedule equals the step-by-step one whatever the guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd, isqrt

import numpy as np

from treadle.plan import pd2_serial

LEVELS = 32
"""Deadline levels decided with the jump table at most; after ``FEW_LEVELS``, the rows still
choosing go to explicit keys once they are under 1/16 of the rows or a level settles under a
quarter of them."""
FEW_LEVELS = 8
WARMUP = 32
"""Steps each chunk runs before its first step, from a guessed state."""
SLAB = 128
"""Steps whose tables are gathered at once for all chunks (one row per step)."""
MIN_PERIOD = 1 << 14
"""Shorter periods are simulated one step at a time (:mod:`treadle.plan.pd2_serial`)."""
_ONE = np.uint64(1)


def fits(rates: Sequence[int], p: int) -> bool:
    """Whether :func:`simulate` serves rates ``a_c / p``: at most 64 components, a period
    from :data:`MIN_PERIOD` to ``2**23`` steps."""
    return len(rates) <= 64 and MIN_PERIOD <= p <= 1 << 23


def chunk_steps(p: int) -> int:
    """Steps per chunk: about ``sqrt(p/8)``, so that ``p/length`` rows share each numpy call."""
    return max(WARMUP, min(1024, isqrt(p // 8)))


def _where(flags: np.ndarray) -> np.ndarray:
    """Indices of the true entries of a 1-d array (``np.flatnonzero`` without its wrappers)."""
    return flags.nonzero()[0]


def _popcount(x: np.ndarray) -> np.ndarray:
    return np.bitwise_count(x).astype(np.int64)


class Tables:
    """``J``, ``W`` (one uint64 per step) and ``need`` (``K(s+1)``) for rates ``a_c / p``, at most 64 components."""

    def __init__(self, rates: Sequence[int], p: int):
        self.rates = tuple(int(a) for a in rates)
        self.p = p
        self.seats = sum(self.rates) // p
        bits = [_ONE << np.uint64(c) for c in range(len(self.rates))]
        heavy_j = sum(1 << c for c, a in enumerate(self.rates) if 2 * a > p)
        jumps = np.full(p, heavy_j, dtype=np.uint64)
        whole = np.zeros(p, dtype=np.uint64)
        for c, a in enumerate(self.rates):
            if not a:
                continue
            if 2 * a > p:  # non-jumps: t = floor(k*p/b), k = 0..b-1
                b = p - a
                jumps[np.arange(0, b * p, p, dtype=np.int64) // b] &= ~bits[c]
            else:  # jumps: s = ceil(k*p/a) - 1 = floor((k*p - 1)/a), k = 1..a
                jumps[np.arange(p - 1, a * p, p, dtype=np.int64) // a] |= bits[c]
            g = gcd(a, p)
            whole[np.arange(p // g - 1, p, p // g, dtype=np.int64)] |= bits[c]
        self.jumps = jumps
        self.whole = whole
        self.need = np.cumsum(self.seats - _popcount(jumps))
        self.active = np.uint64(sum(1 << c for c, a in enumerate(self.rates) if a))
        self.heavy = np.uint64(sum(1 << c for c, a in enumerate(self.rates) if a and 2 * a >= p))
        hidx = [c for c, a in enumerate(self.rates) if a and 2 * a >= p]
        self.h_idx = np.asarray(hidx, dtype=np.int64)
        self.h_rest = np.asarray([p - self.rates[c] for c in hidx], dtype=np.int64)
        self.h_bits = np.asarray([1 << c for c in hidx], dtype=np.uint64)
        act = [c for c, a in enumerate(self.rates) if a]
        self.a_idx = np.asarray(act, dtype=np.int64)
        self.a_rate = np.asarray([self.rates[c] for c in act], dtype=np.int64)
        self.a_bits = np.asarray([1 << c for c in act], dtype=np.uint64)
        self.a_heavy = 2 * self.a_rate >= p


def guess(tb: Tables, t: np.ndarray) -> np.ndarray:
    """A state for each step ``t``: the ``K(t)`` components (``t*f_c`` not whole) whose
    ``floor(t*f_c)`` steps up soonest, as earliest-deadline-first would have them ahead."""
    prod = t[:, None] * tb.a_rate[None, :]
    frac = prod % tb.p
    k = t * tb.seats - (prod // tb.p).sum(axis=1)
    soon = np.where(frac > 0, (tb.p - frac) / tb.a_rate[None, :], np.inf)
    order = np.argsort(soon, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(order.shape[1])[None, :], axis=1)
    pick = (rank < k[:, None]) & (frac > 0)
    return np.bitwise_or.reduce(np.where(pick, tb.a_bits[None, :], 0), axis=1)


def step(tb: Tables, t: np.ndarray, ahead: np.ndarray, at: _Slab) -> np.ndarray:
    """``A(t+1)`` from ``A(t) = ahead`` for each row (``0 <= t < p``; ``at``: the tables at
    ``t`` and after). A row whose state is not a PD2 state gets some state (the caller
    checks the result)."""
    j = at.jumps(0)
    keep = ahead & ~j
    n = at.need() - _popcount(keep)
    cands = (ahead & j & ~at.whole(0)) | (tb.active & ~(ahead | j))
    k = _popcount(cands)
    out = keep | np.where((n > 0) & (k <= n), cands, 0)
    sel = _where((n > 0) & (k > n))
    if sel.size:
        out[sel] |= _choose(tb, at, sel, t[sel], cands[sel], n[sel])
    return out


class _Slab:
    """The tables at row ``i`` (and the rows after) of tables laid out one row per step, one
    column per chunk (the first ``cols`` chunks)."""

    def __init__(self, slab: tuple[np.ndarray, np.ndarray, np.ndarray], i: int, cols: int):
        self.slab, self.i, self.cols = slab, i, cols

    def jumps(self, lev: int, rows: np.ndarray | None = None) -> np.ndarray:
        row = self.slab[0][self.i + lev, : self.cols]
        return row if rows is None else row[rows]

    def whole(self, lev: int, rows: np.ndarray | None = None) -> np.ndarray:
        row = self.slab[1][self.i + lev, : self.cols]
        return row if rows is None else row[rows]

    def need(self) -> np.ndarray:
        return self.slab[2][self.i, : self.cols]


def _choose(
    tb: Tables, at: _Slab, rows: np.ndarray, t: np.ndarray, cands: np.ndarray, n: np.ndarray
) -> np.ndarray:
    """The ``n`` candidates PD2 ranks first at steps ``t`` (``rows`` of ``at``; each has more
    than ``n``): whole deadline levels while they fit, then a tie broken within one level (all
    rows' ties at once, :func:`_tie`)."""
    chosen = np.zeros_like(cands)
    pos = np.arange(t.size)
    tied: list[tuple[np.ndarray, ...]] = []
    for lev in range(1, LEVELS + 1):
        level = cands & at.jumps(lev, rows)
        k = _popcount(level)
        tie = k > n
        ties = _where(tie)
        if ties.size:
            w = at.whole(lev, rows[ties])
            tied.append((pos[ties], t[ties] + (lev + 1), level[ties], n[ties], w))
        chosen[pos] |= np.where(tie, 0, level)
        n = np.where(tie, 0, n - k)
        cands = cands & ~level
        left = _where(n)
        done = pos.size - left.size
        if done:
            pos, rows, t, cands, n = pos[left], rows[left], t[left], cands[left], n[left]
        if not pos.size or (
            lev >= FEW_LEVELS and (pos.size * 16 < chosen.size or done * 4 < pos.size)
        ):
            break  # the rest by keys: one call instead of levels that settle few rows each
    if pos.size:
        chosen[pos] |= _by_key(tb, t, cands, n)
    if tied:
        pos, deadline, level, n, w = (np.concatenate(x) for x in zip(*tied))
        chosen[pos] |= _tie(tb, deadline, level, n, w)
    return chosen


def _tie(
    tb: Tables, deadline: np.ndarray, level: np.ndarray, n: np.ndarray, whole: np.ndarray
) -> np.ndarray:
    """``n`` of the candidates ``level``, all due at ``deadline`` (more than ``n`` each):
    b-bit 1 (not in ``whole``) before b-bit 0, then :func:`_heavy_first`."""
    sub = level & ~whole
    k = _popcount(sub)
    first = k >= n
    rest = np.where(first, sub, level & whole)
    return np.where(first, 0, sub) | _heavy_first(tb, deadline, rest, np.where(first, n, n - k))


def _heavy_first(tb: Tables, deadline: np.ndarray, x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``n`` of ``x``: heavy tasks first, by later group deadline then lower index
    (:func:`_by_group`), then light tasks by lower index."""
    h = x & tb.heavy
    k = _popcount(h)
    out = np.where(k <= n, h, 0)
    light = _where(k < n)
    if light.size:
        out[light] |= _lowest(x[light] & ~tb.heavy, n[light] - k[light])
    many = _where(k > n)
    if many.size:
        out[many] = _by_group(tb, deadline[many], h[many], n[many])
    return out


def _lowest(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The ``n`` lowest set bits of each ``x``."""
    out = np.zeros_like(x)
    for i in range(int(n.max())):
        low = np.where(n > i, x & (~x + _ONE), 0)
        out |= low
        x = x ^ low
    return out


def _select(keys: np.ndarray, member: np.ndarray, n: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """Per row, the bits of the ``n`` members with the smallest (distinct) keys."""
    keys = np.where(member, keys, np.iinfo(np.int64).max)
    kth = np.sort(keys, axis=1)[np.arange(keys.shape[0]), n - 1]
    pick = member & (keys <= kth[:, None])
    return np.bitwise_or.reduce(np.where(pick, bits[None, :], 0), axis=1)


def _group(deadline: np.ndarray, rest: np.ndarray, p: int) -> np.ndarray:
    """Heavy tasks' group deadlines ``ceil(ceil(d*(1-wt)) / (1-wt))``, ``rest = p*(1-wt)``."""
    return -(-(-(-(deadline * rest) // p) * p) // rest)


def _by_group(tb: Tables, deadline: np.ndarray, h: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``n`` of the heavy tasks ``h`` (all due at ``deadline``): later group deadline first,
    then lower index."""
    group = _group(deadline[:, None], tb.h_rest[None, :], tb.p)
    member = (h[:, None] & tb.h_bits[None, :]) != 0
    return _select(-group * 64 + tb.h_idx[None, :], member, n, tb.h_bits)


def _by_key(tb: Tables, t: np.ndarray, cands: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The ``n`` candidates first by the whole PD2 key at step ``t`` (``_pd2_key``): the
    earlier deadline, b-bit 1, later group deadline (heavy tasks), lower index."""
    p, a = tb.p, tb.a_rate[None, :]
    k = (t[:, None] + 1) * a // p + 1
    deadline = -(-(k * p) // a)
    bbit = (k * p) % a != 0
    span = 1 << 25  # p <= 2**23: deadline - t and group - deadline are below 2**24
    group = _group(deadline, np.where(tb.a_heavy, p - a, 1), p) - deadline
    part = np.where(tb.a_heavy[None, :], span - 2 - group, span - 1)
    key = ((2 * (deadline - t[:, None]) + 1 - bbit) * span + part) * 64 + tb.a_idx[None, :]
    member = (cands[:, None] & tb.a_bits[None, :]) != 0
    return _select(key, member, n, tb.a_bits)


def run_chunks(tb: Tables, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``A(t)`` for ``0 <= t <= p`` with the period cut into chunks of ``length`` steps, the
    chunks' first steps, and the state each chunk started from (chunk 0: ``A(0) = 0``)."""
    p = tb.p
    starts = np.arange(0, p, length, dtype=np.int64)
    cols = starts.size
    steps = WARMUP + length
    out_t = np.zeros((length, cols), dtype=np.uint64)
    ahead = guess(tb, (starts - WARMUP) % p)
    first = ahead
    for i0 in range(0, steps, SLAB):
        span = min(SLAB, steps - i0)
        idx = (starts[None, :] + (i0 - WARMUP + np.arange(span + LEVELS + 1))[:, None]) % p
        slab = (tb.jumps[idx], tb.whole[idx], tb.need[idx])
        for i in range(span):
            tau = i0 + i - WARMUP
            if tau == 0:
                ahead[0] = 0
                first = ahead.copy()
            if tau == p - int(starts[-1]):  # the last chunk is shorter
                cols -= 1
                ahead = ahead[:cols]
            ahead = step(tb, idx[i, :cols], ahead, _Slab(slab, i, cols))
            if tau >= 0:
                out_t[tau, :cols] = ahead
    out = np.zeros(p + 1, dtype=np.uint64)
    out[1:] = out_t.T.reshape(-1)[:p]  # chunk by chunk: A(1), ..., A(p)
    return out, starts, first


def _serial(tb: Tables, t0: int, count: int, ahead: int) -> np.ndarray:
    """``A(t+1)`` for ``t0 <= t < t0 + count`` from ``A(t0) = ahead``, one step at a time."""
    t1 = t0 + count + pd2_serial.LOOKAHEAD
    window = np.arange(t0, t1) % tb.p
    got = pd2_serial.run(
        ahead,
        tb.jumps[window].tolist(),
        tb.whole[window].tolist(),
        tb.need[t0 : t0 + count].tolist(),
        pd2_serial.group_orders(np.asarray(tb.rates, dtype=np.int64), tb.p, t0, t1),
        count,
        t0,
        int(tb.active),
        int(tb.heavy),
        tb.rates,
        tb.p,
    )
    return np.asarray(got, dtype=np.uint64)


def simulate(tb: Tables) -> np.ndarray:
    """``A(t)`` for ``0 <= t <= p`` (one uint64 per step), equal to the step-by-step
    simulation: :func:`run_chunks`, then every chunk whose start differs from the end of the
    chunk before it re-run from that end, in order, one step at a time."""
    length = chunk_steps(tb.p)
    out, starts, first = run_chunks(tb, length)
    bad = (_where(first[1:] != out[starts[1:]]) + 1).tolist()
    k = 0
    while k < len(bad):
        i = bad[k]
        k += 1
        t0 = int(starts[i])
        end = min(t0 + length, tb.p)
        while t0 < end:  # until the new path meets the old one: the rest is the same
            count = min(WARMUP, end - t0)
            got = _serial(tb, t0, count, int(out[t0]))
            t0 += count
            same = got[-1] == out[t0]
            out[t0 - count + 1 : t0 + 1] = got
            if same:
                break
        nxt = i + 1
        if nxt < starts.size and first[nxt] != out[starts[nxt]] and bad[k : k + 1] != [nxt]:
            bad.insert(k, nxt)
    return out
