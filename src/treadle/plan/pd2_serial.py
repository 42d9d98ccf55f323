"""PD2 one step at a time: the reference simulation of :mod:`treadle.plan.schedule`'s seat
schedule (see its docstring for the state, the transition and the priority order).

:func:`simulate` runs :func:`run`, one Python iteration per step with bit operations on one
integer per step, over blocks of steps whose tables (``J``, ``W``, ``K``, the heavy tasks'
group-deadline order) :func:`flags` and :func:`orders` compute with numpy. It serves schedules
with more than 64 components or short periods, and re-runs the chunks of
:mod:`treadle.plan.pd2` that a guessed start put on another path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from treadle.errors import PlanError

LOOKAHEAD = 64  # deadline levels scanned from tables before computing priorities directly


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


def bit_width(m: int) -> int:
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


def encode(rows: np.ndarray, width: int) -> list[int]:
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


def pack(flags: np.ndarray, words: int) -> np.ndarray:
    """Rows of booleans as bitmasks, ``(rows, words)`` uint64."""
    rows, m = flags.shape
    padded = np.zeros((rows, words * 64), dtype=bool)
    padded[:, :m] = flags
    return np.packbits(padded, axis=1, bitorder="little").view("<u8")


def ints(u: np.ndarray) -> list[int]:
    """``(rows, words)`` uint64 bitmasks as Python ints."""
    ints = u[:, 0].tolist()
    for w in range(1, u.shape[1]):
        ints = [x | (y << (64 * w)) for x, y in zip(ints, u[:, w].tolist(), strict=True)]
    return ints


def unpack(masks: Sequence[int], words: int) -> np.ndarray:
    if words == 1:
        return np.asarray(masks, dtype=np.uint64)[:, None]
    full = (1 << 64) - 1
    return np.asarray([[(x >> (64 * w)) & full for w in range(words)] for x in masks], np.uint64)


def step_flags(
    rates: np.ndarray, p: int, t0: int, t1: int, words: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For steps ``t0 <= t < t1``: ``J(t)`` and ``W(t)`` (``(t+1)*f_c`` whole) as uint64
    words, and ``K(t+1)``."""
    t = np.arange(t0, t1 + 1, dtype=np.int64)[:, None]
    prod = t * rates[None, :]
    fl = prod // p
    jumps = pack(fl[1:] != fl[:-1], words)
    whole = pack((prod[1:] % p == 0) & (rates > 0)[None, :], words)
    seats = int(rates.sum()) // p
    need = t[1:, 0] * seats - fl[1:].sum(axis=1)
    return jumps, whole, need


def group_orders(rates: np.ndarray, p: int, t0: int, t1: int) -> list[int] | None:
    """Per step ``t0 <= t < t1``, the heavy tasks' indices in PD2 order for seats due at
    ``t+1``: later group deadline first, then lower index (None without heavy tasks)."""
    heavy = np.flatnonzero((rates > 0) & (2 * rates >= p))
    if not heavy.size:
        return None
    rest = p - rates[heavy]  # p*(1 - wt)
    deadline = np.arange(t0 + 1, t1 + 1, dtype=np.int64)[:, None]
    group = -(-(-(-(deadline * rest) // p) * p) // rest)  # ceil(ceil(d*(1-wt)) / (1-wt))
    rank = np.argsort(heavy - group * len(rates), axis=1, kind="stable")
    return encode(heavy[rank], bit_width(len(rates)))


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
            return keep | _by_group(h, n, orders[s], width), 0
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


def run(
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
    width = bit_width(len(rates))
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


def simulate(rates: tuple[int, ...], period: int) -> np.ndarray:
    """``A(t)`` for ``0 <= t <= period`` under PD2, ``(period + 1, words)`` uint64."""
    m = len(rates)
    words = (m + 63) // 64
    arr = np.asarray(rates, dtype=np.int64)
    active = sum(1 << c for c, a in enumerate(rates) if a)
    heavy = sum(1 << c for c, a in enumerate(rates) if a and 2 * a >= period)
    out = np.zeros((period + 1, words), dtype=np.uint64)
    ahead = 0
    block = block_steps(m)
    for t0 in range(0, period, block):
        count = min(period, t0 + block) - t0
        t1 = t0 + count + LOOKAHEAD
        jumps, whole, need = step_flags(arr, period, t0, t1, words)
        orders = group_orders(arr, period, t0, t1)
        got = run(
            ahead,
            ints(jumps),
            ints(whole),
            need.tolist(),
            orders,
            count,
            t0,
            active,
            heavy,
            rates,
            period,
        )
        out[t0 + 1 : t0 + count + 1] = unpack(got, words)
        ahead = got[-1]
    return out


def block_steps(m: int) -> int:
    return max(256, min(1 << 14, (1 << 18) // m))
