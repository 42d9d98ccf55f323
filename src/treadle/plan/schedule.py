"""Exact per-batch shares: quantised weights and a PD2 Pfair schedule of the fractional seats.

With normalised weights ``w_c = n_c / D`` (integers ``n_c``, fixed denominator ``D``) and batch
size ``B``, component ``c`` gets ``q_c = floor(n_c*B/D)`` seats in every batch, and the
``R = B - sum(q_c)`` remaining seats are scheduled among components with fractional rates
``a_c / D`` (``a_c = n_c*B mod D``, ``sum(a_c) = R*D``) by the PD2 Pfair algorithm on ``R``
"processors": the k-th extra seat of ``c`` lies in its Pfair window
``[floor((k-1)*D/a_c), ceil(k*D/a_c))`` and, among released subtasks, earlier deadline wins,
then b-bit 1 over 0, then the later group deadline (heavy tasks), then the lower component
index. PD2 is optimal for synchronous periodic tasks with total weight ``R``, so every extra seat
is scheduled inside its window, which gives both invariants:

* every batch holds ``q_c`` or ``q_c + 1`` samples of ``c`` (floor or ceil of ``w_c*B``), and
* after any ``s`` batches, ``|N_c(s) - w_c*B*s| < 1``.

The schedule repeats with period ``P = D / gcd(D, a_1, ..., a_m)`` (at most ``D``), so one
period is computed at setup and ``N_c(s)`` is O(1) at any step. All arithmetic is on integers.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from math import floor, gcd

import numpy as np

from treadle.errors import PlanError

WEIGHT_DENOMINATOR = 1000


def quantise_weights(
    weights: Sequence[float], denominator: int = WEIGHT_DENOMINATOR
) -> tuple[int, ...]:
    """Integer numerators over ``denominator``: each >= 1, summing exactly to ``denominator``.

    Largest-remainder rounding of ``denominator * w / sum(w)`` (exact rationals, ties to the
    lower index); a component that would round to 0 gets 1, taken from the component whose
    rounded share most exceeds its exact share.
    """
    m = len(weights)
    if m == 0:
        raise PlanError("no weights to quantise")
    if m > denominator:
        raise PlanError(f"{m} components exceed the weight denominator {denominator}")
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    if total <= 0 or any(w <= 0 for w in exact):
        raise PlanError(f"weights must be positive, got {list(weights)}")
    ideal = [w * denominator / total for w in exact]
    n = [floor(x) for x in ideal]
    left = denominator - sum(n)
    for i in sorted(range(m), key=lambda i: (-(ideal[i] - n[i]), i))[:left]:
        n[i] += 1
    for i in range(m):
        if n[i] == 0:
            j = max((k for k in range(m) if n[k] >= 2), key=lambda k: (n[k] - ideal[k], -k))
            n[j] -= 1
            n[i] = 1
    assert sum(n) == denominator and min(n) >= 1
    return tuple(n)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pd2_key(k: int, a: int, d_: int, index: int) -> tuple[int, int, int, int]:
    """PD2 priority of subtask ``k`` (1-based) of a task of weight ``a/d_``; smaller sorts first."""
    deadline = _ceil_div(k * d_, a)
    bbit = 1 if (k * d_) % a else 0
    group = 0
    if 2 * a >= d_:  # heavy task: group deadline ceil(ceil(d*(1-wt)) / (1-wt))
        group = _ceil_div(_ceil_div(deadline * (d_ - a), d_) * d_, d_ - a)
    return (deadline, -bbit, -group, index)


def pd2_period(rates: Sequence[int], denominator: int, period: int) -> np.ndarray:
    """Extra seats per step, shape ``(period, m)`` of 0/1, for rates ``a_c/denominator``."""
    m = len(rates)
    total = sum(rates)
    if total % denominator:
        raise PlanError(f"fractional rates {list(rates)} do not sum to whole seats")
    seats = total // denominator
    out = np.zeros((period, m), dtype=np.int64)
    done = [0] * m  # subtasks scheduled so far
    for t in range(period):
        ready = []
        for c, a in enumerate(rates):
            if a == 0:
                continue
            k = done[c] + 1
            if (k - 1) * denominator // a <= t:  # released
                ready.append((_pd2_key(k, a, denominator, c), c))
        if len(ready) < seats:
            raise PlanError(f"internal: PD2 found {len(ready)} ready tasks for {seats} seats")
        ready.sort()
        for _, c in ready[:seats]:
            out[t, c] = 1
            done[c] += 1
    return out


class Schedule:
    """Seat counts per component for every step; O(1) per query after a one-period setup."""

    def __init__(self, numerators: Sequence[int], denominator: int, batch_size: int):
        if sum(numerators) != denominator or min(numerators) < 1:
            raise PlanError(
                f"quantised weights {list(numerators)} must be >= 1 and sum to {denominator}"
            )
        self.numerators = tuple(int(n) for n in numerators)
        self.denominator = int(denominator)
        self.batch_size = int(batch_size)
        d_, b = self.denominator, self.batch_size
        self.base = tuple(n * b // d_ for n in self.numerators)
        self.rates = tuple(n * b % d_ for n in self.numerators)
        self.extra_seats = sum(self.rates) // d_
        self.period = d_ // gcd(d_, *self.rates)
        extra = pd2_period(self.rates, d_, self.period)
        self._base = np.asarray(self.base, dtype=np.int64)
        self._extra = extra
        self._cum = np.zeros((self.period + 1, len(self.numerators)), dtype=np.int64)
        np.cumsum(extra, axis=0, out=self._cum[1:])
        self._cum_list = self._cum.tolist()
        self._per_period = tuple(a * self.period // d_ for a in self.rates)
        self._verify()

    def _verify(self) -> None:
        """Both invariants over one period (the schedule repeats, so this covers every step)."""
        d_ = self.denominator
        if not np.all(self._extra.sum(axis=1) == self.extra_seats):
            raise PlanError("internal: schedule does not fill every batch")
        steps = np.arange(self.period + 1, dtype=np.int64)[:, None]
        lag = self._cum * d_ - np.asarray(self.rates, dtype=np.int64)[None, :] * steps
        if np.any(np.abs(lag) >= d_):
            raise PlanError("internal: schedule drifts by a whole sample")
        if tuple(self._cum[-1].tolist()) != self._per_period:
            raise PlanError("internal: schedule is not periodic")

    @property
    def num_components(self) -> int:
        return len(self.numerators)

    def counts(self, step: int) -> np.ndarray:
        """Samples of each component in the batch of ``step`` (int64, sums to ``batch_size``)."""
        return self._base + self._extra[step % self.period]

    def cumulative(self, step: int) -> list[int]:
        """``N_c(step)``: samples of each component in batches ``0..step-1`` (exact ints)."""
        full, rest = divmod(step, self.period)
        row = self._cum_list[rest]
        return [
            q * step + full * p + r
            for q, p, r in zip(self.base, self._per_period, row, strict=True)
        ]
