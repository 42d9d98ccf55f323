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
``tests/plan_helpers.py`` step for step. :mod:`treadle.plan.pd2_serial` picks candidates
level by level from ``J(t+1), J(t+2), ...`` with bit operations, one Python iteration per step
(about 1.3 us of CPU per step for 16 components); :mod:`treadle.plan.pd2` makes the same
decisions for ~``sqrt(P/8)`` chunks of the period at once with numpy, each chunk started from
a guessed state a few dozen steps early, and re-runs step by step every chunk whose start
differs from the end of the chunk before it, so both give the same schedule bit for bit
(``tests/test_plan_pd2.py`` pins it).

**Costs.** The simulation runs once over one period ``P`` (``P <= D`` when the shares are
exact, ``P <= ceil(10**6/B)`` when approximated, so at most ``10**6`` except for several
shares below ``1e-6``): chunked for periods from 16,384 steps with up to 64 components, about
0.2 us of CPU per step (0.2 s for 16 components and ``P = 10**6``, against 1.3 s step by
step, on the 2-core development machine; shares below ~``1e-4`` make more chunks re-run, up
to half of them, still 1.4-2.7x faster than step by step), else step by step (40 ms for
``P = 15625``). It is memoised per (rates, period), so
rebuilding a plan from its record costs nothing more. The result is verified with numpy (the
sets stay inside the windows above, ``|A(t)| = K(t)``, and ``A(P)`` is empty, so the schedule
repeats); a failure raises instead of planning wrong shares. The schedule is stored as one
64-bit word per step per 64 components (8 MB for ``P = 10**6``); ``counts`` and
``cumulative`` at any step are O(components) integer arithmetic:
``N_c(s) = q_c*s + floor(s*f_c) + delta_c(s mod P)``.

``w_c`` here is the share planned: the share asked for when it is exact (common denominator
up to ``10**6``), else within ``1e-6`` of it, and then ``floor``/``ceil`` of ``w_c*B`` still
equal those of the asked share (:mod:`treadle.plan.shares`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from math import gcd

import numpy as np

from treadle.errors import PlanError
from treadle.plan import pd2, pd2_serial

MAX_SCHEDULE_WORDS = 1 << 23
"""Largest schedule kept: period x ceil(components/64) words of 8 bytes (64 MiB)."""


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
    """``A(t)`` for ``0 <= t <= period``, ``(period + 1, words)`` uint64, one step at a time."""
    return pd2_serial.simulate(rates, period)


def _serial_tables(
    rates: tuple[int, ...], period: int, words: int
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]:
    arr = np.asarray(rates, dtype=np.int64)
    block = pd2_serial.block_steps(len(rates))
    for t0 in range(0, period, block):
        t1 = min(period, t0 + block)
        yield (t0, t1, *pd2_serial.step_flags(arr, period, t0, t1, words))


@lru_cache(maxsize=4)
def pd2_masks(rates: tuple[int, ...], period: int) -> np.ndarray:
    """``A(t)`` for ``0 <= t < period``: read-only ``(period, words)`` uint64, bit ``c`` set
    when component ``c`` (rate ``rates[c]/period``) is one extra seat ahead; verified."""
    if sum(rates) % period:
        raise PlanError(f"fractional rates {list(rates)} do not sum to whole seats")
    words = (len(rates) + 63) // 64
    if pd2.fits(rates, period):
        tables = pd2.Tables(rates, period)
        masks = pd2.simulate(tables)[:, None]
        blocks: Iterable[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]] = (
            (t0, t1, tables.jumps[t0:t1, None], tables.whole[t0:t1, None], tables.need[t0:t1])
            for t0 in range(0, period, 1 << 18)
            for t1 in [min(period, t0 + (1 << 18))]
        )
    else:
        masks = _simulate(rates, period)
        blocks = _serial_tables(rates, period, words)
    active = pd2_serial.pack((np.asarray(rates) > 0)[None, :], words)[0]
    for t0, t1, jumps, whole, need in blocks:
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
