"""Exact per-batch shares: a PD2 Pfair schedule of the fractional seats, one bitmask per step.

**Rates.** With normalised weights ``w_c = n_c / D`` (see :mod:`treadle.plan.shares`) and batch
size ``B``, component ``c`` gets ``q_c = floor(n_c*B/D)`` seats in every batch, and the
``R = B - sum(q_c)`` remaining seats go to components with fractional rates ``f_c = a_c / P``
(``a_c = (n_c*B mod D) / g``, ``P = D / g``, ``g = gcd(D, n_c*B mod D ...)``; ``sum(f_c) = R``).

**State.** Write the extra seats ``c`` got in steps ``0..t-1`` as
``E_c(t) = floor(t*f_c) + delta_c(t)``. A schedule keeps both invariants

* every batch holds ``q_c`` or ``q_c + 1`` samples of ``c`` (floor or ceil of ``w_c*B``), and
* after any ``s`` batches, ``|N_c(s) - w_c*B*s| < 1``

exactly when ``delta_c(t)`` is 0 or 1, is 0 wherever ``t*f_c`` is whole, and each step adds 0
or 1 to ``E_c``. So the state at step ``t`` is one set ``A(t) = {c : delta_c(t) = 1}`` (the
components one seat ahead), of size ``K(t) = t*R - sum(floor(t*f_c))``.

**Transition (PD2).** Let ``J(t)`` be the components whose ``floor(t*f_c)`` steps up at
``t+1``. Then ``A(t) - J(t)`` must stay in ``A(t+1)`` (their next seat is not released),
``J(t) - A(t)`` must leave (their seat is due now), and the candidates
``(A & J minus those with (t+1)*f_c whole) | (active - A - J)`` compete for the remaining
places. Every candidate's next seat is ``floor((t+1)*f_c) + 1``, so its PD2 priority depends on
``t`` alone: the earlier deadline (the next step ``s > t`` with ``c`` in ``J(s)``), then b-bit 1
over 0 (``(s+1)*f_c`` not whole), then the later group deadline (heavy tasks, ``f_c >= 1/2``),
then the lower index. This is PD2 (Srinivasan and Anderson), optimal for synchronous periodic
tasks of total weight ``R``, so every choice exists; it reproduces the textbook simulation in
``tests/plan_helpers.py`` step for step. The loop picks candidates level by level from
``J(t+1), J(t+2), ...`` with bit operations, one Python iteration per step.

**Costs.** ``J``, ``K``, the whole-point masks and the heavy tasks' group-deadline order
are computed with numpy in blocks; the simulation runs once over one period ``P`` (``P <= D``
when the shares are exact, ``P <= ceil(10**6/B)`` when approximated, so at most ``10**6``
except for several shares below ``1e-6``), about 1.3 us of CPU per step for 16 components
(1.3 s for ``P = 10**6``, 40 ms for ``P = 15625``, on the 2-core development machine), and is
memoised per (rates, period), so rebuilding a plan from its record costs nothing more. Each
block is verified with numpy (the sets stay inside the windows above, ``|A(t)| = K(t)``, and
``A(P)`` is empty, so the schedule repeats); a failure raises instead of planning wrong
shares. The schedule is stored as one 64-bit word per step per 64 components (8 MB for
``P = 10**6``); ``counts`` and ``cumulative`` at any step are O(components) integer
arithmetic: ``N_c(s) = q_c*s + floor(s*f_c) + delta_c(s mod P)``.

``w_c`` here is the share planned: the share asked for when it is exact (common denominator
up to ``10**6``), else within ``1e-6`` of it, and then ``floor``/``ceil`` of ``w_c*B`` still
equal those of the asked share (:mod:`treadle.plan.shares`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache
from math import gcd

import numpy as np

from treadle.errors import PlanError

MAX_SCHEDULE_WORDS = 1 << 23
"""Largest schedule kept: period x ceil(components/64) words of 8 bytes (64 MiB)."""
_LOOKAHEAD = 64  # deadline levels scanned from tables before computing priorities directly


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pd2_key(t: int, c: int, a: int, p: int) -> tuple[int, int, int, int]:
    """PD2 priority at step ``t`` of candidate ``c`` (rate ``a/p``); smaller sorts first."""
    k = (t + 1) * a // p + 1  # its next seat
    deadline = _ceil_div(k * p, a)
    bbit = 1 if (k * p) % a else 0
    group = 0
    if 2 * a >= p:  # heavy task: group deadline ceil(ceil(d*(1-wt)) / (1-wt))
        group = _ceil_div(_ceil_div(deadline * (p - a), p) * p, p - a)
    return (deadline, -bbit, -group, c)


def _width(m: int) -> int:
    return max(1, (m - 1).bit_length())


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _pick(t: int, cands: int, n: int, rates: Sequence[int], p: int) -> int:
    """The ``n`` candidates PD2 ranks first at step ``t``, by computing their priorities."""
    keys = sorted(_pd2_key(t, c, rates[c], p) for c in _bits(cands))
    out = 0
    for key in keys[:n]:
        out |= 1 << key[3]
    return out


def _by_group(cands: int, n: int, order: int, width: int) -> int:
    """The first ``n`` candidates in ``order``: heavy tasks' indices, ``width`` bits each, by
    later group deadline, then lower index."""
    out = 0
    low = (1 << width) - 1
    while n:
        bit = 1 << (order & low)
        order >>= width
        if cands & bit:
            out |= bit
            n -= 1
    return out


def _encode(rows: np.ndarray, width: int) -> list[int]:
    """Each row of small non-negative ints as one Python int, ``width`` bits per entry."""
    per = 64 // width
    cols = rows.shape[1]
    out: list[int] | None = None
    for w, start in enumerate(range(0, cols, per)):
        part = rows[:, start : start + per].astype(np.uint64)
        shifts = (np.arange(part.shape[1], dtype=np.uint64) * np.uint64(width))[None, :]
        word = np.bitwise_or.reduce(part << shifts, axis=1).tolist()
        shift = w * per * width
        out = word if out is None else [x | (y << shift) for x, y in zip(out, word, strict=True)]
    assert out is not None
    return out


def _pack(flags: np.ndarray, words: int) -> np.ndarray:
    """Rows of booleans as bitmasks, ``(rows, words)`` uint64."""
    rows, m = flags.shape
    padded = np.zeros((rows, words * 64), dtype=bool)
    padded[:, :m] = flags
    return np.packbits(padded, axis=1, bitorder="little").view("<u8")


def _ints(u: np.ndarray) -> list[int]:
    """``(rows, words)`` uint64 bitmasks as Python ints."""
    ints = u[:, 0].tolist()
    for w in range(1, u.shape[1]):
        ints = [x | (y << (64 * w)) for x, y in zip(ints, u[:, w].tolist(), strict=True)]
    return ints


def _unpack(masks: Sequence[int], words: int) -> np.ndarray:
    if words == 1:
        return np.asarray(masks, dtype=np.uint64)[:, None]
    full = (1 << 64) - 1
    return np.asarray([[(x >> (64 * w)) & full for w in range(words)] for x in masks], np.uint64)


def _flags(
    rates: np.ndarray, p: int, t0: int, t1: int, words: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For steps ``t0 <= t < t1``: ``J(t)`` and ``W(t)`` (``(t+1)*f_c`` whole) as uint64
    words, and ``K(t+1)``."""
    t = np.arange(t0, t1 + 1, dtype=np.int64)[:, None]
    prod = t * rates[None, :]
    fl = prod // p
    jumps = _pack(fl[1:] != fl[:-1], words)
    whole = _pack((prod[1:] % p == 0) & (rates > 0)[None, :], words)
    seats = int(rates.sum()) // p
    need = t[1:, 0] * seats - fl[1:].sum(axis=1)
    return jumps, whole, need


def _orders(rates: np.ndarray, p: int, t0: int, t1: int) -> list[int] | None:
    """Per step ``t0 <= t < t1``, the heavy tasks' indices in PD2 order for seats due at
    ``t+1``: later group deadline first, then lower index (None without heavy tasks)."""
    heavy = np.flatnonzero((rates > 0) & (2 * rates >= p))
    if not heavy.size:
        return None
    rest = p - rates[heavy]  # p*(1 - wt)
    deadline = np.arange(t0 + 1, t1 + 1, dtype=np.int64)[:, None]
    group = -(-(-(-(deadline * rest) // p) * p) // rest)  # ceil(ceil(d*(1-wt)) / (1-wt))
    rank = np.argsort(heavy - group * len(rates), axis=1, kind="stable")
    return _encode(heavy[rank], _width(len(rates)))


def _due_first(
    level: int, w: int, heavy: int, n: int, orders: list[int] | None, s: int, width: int
) -> tuple[int, int]:
    """Up to ``n`` of the candidates ``level`` (due at the same step), PD2's tie-break:
    b-bit 1 before b-bit 0, then heavy tasks by later group deadline, then light tasks by
    lower index. Returns (the chosen bits, how many are still to choose)."""
    keep = 0
    for sub in (level & ~w, level & w):
        k = sub.bit_count()
        if k <= n:
            keep |= sub
            n -= k
            if not n:
                break
            continue
        h = sub & heavy
        k = h.bit_count()
        if k > n:
            return keep | _by_group(h, n, orders[s], width), 0  # type: ignore[index]
        keep |= h
        n -= k
        sub ^= h
        while n:
            low = sub & -sub
            keep |= low
            sub ^= low
            n -= 1
        break
    return keep, n


def _run(
    ahead: int,
    jumps: list[int],
    whole: list[int],
    need: list[int],
    orders: list[int] | None,
    count: int,
    t0: int,
    active: int,
    heavy: int,
    rates: Sequence[int],
    p: int,
) -> list[int]:
    """``A(t+1)`` for ``t0 <= t < t0 + count`` from ``A(t0) = ahead`` (the PD2 transition)."""
    out = [0] * count
    last = len(jumps)
    width = _width(len(rates))
    for i in range(count):
        j = jumps[i]
        keep = ahead & ~j
        n = need[i] - keep.bit_count()
        if n > 0:
            cands = (ahead & j & ~whole[i]) | (active & ~(ahead | j))
            spare = cands.bit_count() - n
            if spare == 0:
                keep |= cands
            elif spare < 0:
                raise PlanError(f"internal: PD2 has too few candidates at step {t0 + i}")
            else:
                s = i + 1
                while n:
                    if s == last:  # deadlines beyond the table: rank the rest directly
                        keep |= _pick(t0 + i, cands, n, rates, p)
                        break
                    level = cands & jumps[s]  # candidates due at step s + 1
                    if level:
                        k = level.bit_count()
                        if k <= n:  # the whole level fits: no tie to break
                            keep |= level
                            n -= k
                        else:
                            got, n = _due_first(level, whole[s], heavy, n, orders, s, width)
                            keep |= got
                        cands ^= level
                    s += 1
        elif n < 0:
            raise PlanError(f"internal: PD2 has more seats ahead than allowed at step {t0 + i}")
        ahead = keep
        out[i] = ahead
    return out


def _verify(
    prev: np.ndarray,
    nxt: np.ndarray,
    jumps: np.ndarray,
    whole: np.ndarray,
    need: np.ndarray,
    active: np.ndarray,
) -> None:
    """Every transition keeps both invariants (see the module docstring), vectorised."""
    bad = (nxt & ~active) | (nxt & whole) | (prev & ~jumps & ~nxt) | (~prev & jumps & nxt)
    if bad.any():
        raise PlanError("internal: schedule gives a seat outside its Pfair window")
    if np.any(np.bitwise_count(nxt).sum(axis=1, dtype=np.int64) != need):
        raise PlanError("internal: schedule does not fill every batch")


def _simulate(rates: tuple[int, ...], period: int) -> np.ndarray:
    """``A(t)`` for ``0 <= t <= period`` under PD2, ``(period + 1, words)`` uint64."""
    m = len(rates)
    words = (m + 63) // 64
    arr = np.asarray(rates, dtype=np.int64)
    active = sum(1 << c for c, a in enumerate(rates) if a)
    heavy = sum(1 << c for c, a in enumerate(rates) if a and 2 * a >= period)
    out = np.zeros((period + 1, words), dtype=np.uint64)
    ahead = 0
    block = _block(m)
    for t0 in range(0, period, block):
        count = min(period, t0 + block) - t0
        t1 = t0 + count + _LOOKAHEAD
        jumps, whole, need = _flags(arr, period, t0, t1, words)
        orders = _orders(arr, period, t0, t1)
        got = _run(
            ahead,
            _ints(jumps),
            _ints(whole),
            need.tolist(),
            orders,
            count,
            t0,
            active,
            heavy,
            rates,
            period,
        )
        out[t0 + 1 : t0 + count + 1] = _unpack(got, words)
        ahead = got[-1]
    return out


def _block(m: int) -> int:
    return max(256, min(1 << 14, (1 << 18) // m))


@lru_cache(maxsize=4)
def pd2_masks(rates: tuple[int, ...], period: int) -> np.ndarray:
    """``A(t)`` for ``0 <= t < period``: read-only ``(period, words)`` uint64, bit ``c`` set
    when component ``c`` (rate ``rates[c]/period``) is one extra seat ahead; verified."""
    if sum(rates) % period:
        raise PlanError(f"fractional rates {list(rates)} do not sum to whole seats")
    m = len(rates)
    words = (m + 63) // 64
    arr = np.asarray(rates, dtype=np.int64)
    masks = _simulate(rates, period)
    active = _pack((arr > 0)[None, :], words)[0]
    block = _block(m)
    for t0 in range(0, period, block):
        t1 = min(period, t0 + block)
        jumps, whole, need = _flags(arr, period, t0, t1, words)
        _verify(masks[t0:t1], masks[t0 + 1 : t1 + 1], jumps, whole, need, active)
    if masks[period].any():
        raise PlanError("internal: schedule is not periodic")
    out = masks[:period]
    out.flags.writeable = False
    return out


class Schedule:
    """Seat counts per component for every step; O(components) per query after one period."""

    def __init__(self, numerators: Sequence[int], denominator: int, batch_size: int):
        if sum(numerators) != denominator or min(numerators) < 0:
            raise PlanError(
                f"weight numerators {list(numerators)} must be >= 0 and sum to {denominator}"
            )
        self.numerators = tuple(int(n) for n in numerators)
        self.denominator = int(denominator)
        self.batch_size = int(batch_size)
        d_, b = self.denominator, self.batch_size
        m = len(self.numerators)
        self.base = tuple(n * b // d_ for n in self.numerators)
        raw = tuple(n * b % d_ for n in self.numerators)
        self.extra_seats = sum(raw) // d_
        g = gcd(d_, *raw)
        self.period = d_ // g
        self.rates = tuple(r // g for r in raw)
        """Fractional rates as numerators over ``period``."""
        words = (m + 63) // 64
        if self.period * words > MAX_SCHEDULE_WORDS:
            raise PlanError(
                f"weights {list(self.numerators)}/{d_} at batch size {b} repeat only every "
                f"{self.period} steps; at most {MAX_SCHEDULE_WORDS // words} are supported"
            )
        self._masks = pd2_masks(self.rates, self.period)
        c = np.arange(m)
        self._word = c // 64
        self._bit = (c % 64).astype(np.uint64)
        self._base = np.asarray(self.base, dtype=np.int64)
        self._rates = np.asarray(self.rates, dtype=np.int64)

    @property
    def num_components(self) -> int:
        return len(self.numerators)

    def _ahead(self, r: int) -> np.ndarray:
        return ((self._masks[r, self._word] >> self._bit) & np.uint64(1)).astype(np.int64)

    def counts(self, step: int) -> np.ndarray:
        """Samples of each component in the batch of ``step`` (int64, sums to ``batch_size``)."""
        p = self.period
        r = step % p
        jump = (r + 1) * self._rates // p - r * self._rates // p
        return self._base + jump + self._ahead((r + 1) % p) - self._ahead(r)

    def cumulative(self, step: int) -> list[int]:
        """``N_c(step)``: samples of each component in batches ``0..step-1`` (exact ints)."""
        ahead = self._ahead(step % self.period).tolist()
        return [
            q * step + step * a // self.period + d
            for q, a, d in zip(self.base, self.rates, ahead, strict=True)
        ]
