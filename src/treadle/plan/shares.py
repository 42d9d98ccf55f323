"""Shares of a batch: the normalised weights a user asked for, and the exact rationals planned.

A weight is read as the decimal it prints as (``0.0012`` is ``12/10000``, ``3.0`` is ``3``), so
decimal weights and integer counts (table sizes) are exact rationals; the *asked* share of a
component is its weight over the sum of all weights.

* **Exact.** When the asked shares have a common denominator ``D <= 10**6`` they are planned as
  they are: numerators ``n_c = w_c * D`` over ``D`` (the least common denominator).
* **Approximate.** Otherwise each share is moved by at most ``1e-6``. With batch size ``B``,
  ``w_c * B = q_c + f_c`` (``q_c`` whole seats, ``0 <= f_c < 1``); the fractional rate ``f_c``
  becomes ``a_c / L`` with ``L = k * ceil(10**6 / B)`` for the least ``k <= 8`` that fits
  (``k > 1`` only when several shares are below ``1e-6``, each still planned > 0), so the
  realised share ``(q_c*L + a_c) / (B*L)`` differs from ``w_c`` by ``|a_c/L - f_c| / B <= 1e-6``.
  The ``a_c`` sum to ``L * sum(f_c)``, lie in ``[1, L-1]`` when ``f_c > 0`` and are 0 when
  ``f_c = 0``, so every batch still holds ``floor(w_c*B)`` or ``ceil(w_c*B)`` samples of the
  asked share, and the schedule's period divides ``L``.

Both are pure functions of (weights, batch size): a run record re-derives and checks them.

**Never moved silently.** :func:`check_planned` (called by ``Recipe.plan()``) refuses a plan
in which a share would move by more than :data:`MAX_RELATIVE_MOVE` (1%) of itself, naming
the asked and the planned share (tiny weights: ``[1e-12, 1]`` would plan the small share at
about ``1e-6``, a million times what was asked) and the fix (a share of at least
:data:`ALWAYS_PLANNED`, ``1e-4``, always plans at any batch size: the factor the weight needs),
and for any smaller move warns (:class:`~treadle.errors.PlanWarning`) in one line: how many
shares moved, the largest relative move with its component's asked and planned share and how
many steps its running count takes to drift one more sample from the asked share's, and the
component that drifts first. A run record of an approximated plan is still parsed and resumed
as it was planned.
"""

from __future__ import annotations

import heapq
import math
import warnings
from collections.abc import Sequence
from fractions import Fraction
from math import ceil, floor, gcd, lcm
from typing import Any

import numpy as np

from treadle.errors import PlanError, PlanWarning

MAX_DENOMINATOR = 10**6
"""Asked shares with a common denominator up to this are planned exactly."""
SHARE_TOLERANCE = Fraction(1, 10**6)
"""Otherwise each realised share is within this of the asked one."""
MAX_COMPONENTS = 1000
MAX_RELATIVE_MOVE = Fraction(1, 100)
"""A plan whose share would move by more than this part of itself is refused."""
ALWAYS_PLANNED = SHARE_TOLERANCE / MAX_RELATIVE_MOVE
"""1e-4: a share of at least this always plans, at any batch size (moved by at most 1e-6,
at most 1% of itself); a smaller one plans when the shares are exact or it happens to
move by at most 1% of itself."""


def printed_float(weight: Any) -> float:
    """A real weight as the float of the decimal it prints as: a numpy float of less than
    double precision (``np.float32(0.3)`` prints as 0.3 but holds 0.30000001192...) is read
    from its shortest repr, so it plans as that decimal (3/10), not as its binary value."""
    if isinstance(weight, np.floating) and weight.dtype.itemsize < 8:
        return float(str(weight))
    return float(weight)


def decimal_weight(weight: float) -> Fraction:
    """The weight as the exact decimal it prints as (``repr``), e.g. ``0.0012 -> 3/2500``."""
    value = Fraction(repr(float(weight)))
    if value <= 0:
        raise PlanError(f"weights must be positive, got {weight!r}")
    return value


def asked_shares(
    weights: Sequence[float], sizes: Sequence[int] | None = None
) -> tuple[Fraction, ...]:
    """Normalised shares exactly as asked: each decimal weight over their sum; with ``sizes``
    (``weigh_by="moments"``: each component's eligible moments) each weight times its size,
    an exact rational (never a float product)."""
    if len(weights) == 0:
        raise PlanError("no weights to plan")
    exact = [decimal_weight(w) for w in weights]
    if sizes is not None:
        if len(sizes) != len(exact) or any(int(n) < 1 for n in sizes):
            raise PlanError(f"sizes {list(sizes)} must be one positive count per weight")
        exact = [w * int(n) for w, n in zip(exact, sizes, strict=True)]
    total = sum(exact)
    return tuple(w / total for w in exact)


def realise_weights(
    weights: Sequence[float], batch_size: int, sizes: Sequence[int] | None = None
) -> tuple[tuple[int, ...], int]:
    """``(numerators, denominator)`` of the shares planned for ``weights`` at ``batch_size``
    (with ``sizes``: for each weight times its size, :func:`asked_shares`).

    Exact when the asked shares have a common denominator <= ``MAX_DENOMINATOR``; else within
    ``SHARE_TOLERANCE`` of each (see the module docstring). Numerators are >= 1 and sum to the
    denominator.
    """
    if len(weights) > MAX_COMPONENTS:
        raise PlanError(f"{len(weights)} components; at most {MAX_COMPONENTS} are supported")
    if batch_size < 1:
        raise PlanError(f"batch_size must be >= 1, got {batch_size}")
    return realise_shares(asked_shares(weights, sizes), batch_size)


def realise_shares(shares: Sequence[Fraction], batch_size: int) -> tuple[tuple[int, ...], int]:
    """:func:`realise_weights` of exact shares summing to 1; a share of 0 stays 0 (a
    component absent from a schedule's stage)."""
    if any(s < 0 for s in shares) or sum(shares) != 1:
        raise PlanError(f"shares {[str(s) for s in shares]} must be >= 0 and sum to 1")
    live = [i for i, s in enumerate(shares) if s > 0]
    if len(live) < len(shares):
        nums, den = realise_shares([shares[i] for i in live], batch_size)
        out = [0] * len(shares)
        for i, n in zip(live, nums, strict=True):
            out[i] = n
        return tuple(out), den
    d = lcm(*(s.denominator for s in shares))
    if d <= MAX_DENOMINATOR:
        return tuple(int(s * d) for s in shares), d
    return _approximate(shares, batch_size)


def _approximate(shares: Sequence[Fraction], batch_size: int) -> tuple[tuple[int, ...], int]:
    whole = [floor(s * batch_size) for s in shares]
    frac = [s * batch_size - q for s, q in zip(shares, whole)]
    seats = batch_size - sum(whole)  # sum(frac), a whole number
    slack = SHARE_TOLERANCE * batch_size  # allowed error of each fractional rate
    unit = max(2, ceil(1 / slack))
    for length in range(unit, 9 * unit, unit):
        rates = _round_rates(frac, seats, length, slack)
        if rates is not None:
            nums = [q * length + a for q, a in zip(whole, rates)]
            den = batch_size * length
            g = gcd(den, *nums)
            return tuple(n // g for n in nums), den // g
    raise PlanError(
        f"shares {[float(s) for s in shares]} cannot all be planned within "
        f"{float(SHARE_TOLERANCE)} at batch size {batch_size} with every component > 0 "
        f"(too many shares below {float(SHARE_TOLERANCE)}); use integer or decimal weights"
    )


def _round_rates(
    frac: Sequence[Fraction], seats: int, length: int, slack: Fraction
) -> list[int] | None:
    """Integers ``a_c`` near ``length*f_c`` (within ``length*slack``) summing to
    ``length*seats``, in ``[1, length-1]`` where ``f_c > 0`` and 0 where ``f_c = 0``; None if
    there are none."""
    lo, hi, target = [], [], []
    for f in frac:
        t = f * length
        target.append(t)
        if f == 0:
            lo.append(0)
            hi.append(0)
        else:
            lo.append(max(1, ceil(t - length * slack)))
            hi.append(min(length - 1, floor(t + length * slack)))
    if any(a > b for a, b in zip(lo, hi)) or not sum(lo) <= length * seats <= sum(hi):
        return None
    rates = [min(max(floor(t + Fraction(1, 2)), a), b) for t, a, b in zip(target, lo, hi)]
    diff = length * seats - sum(rates)
    step = 1 if diff > 0 else -1
    # Move the components furthest behind (or ahead) of their target, one unit at a time.
    heap = [(-(t - r) * step, c) for c, (t, r) in enumerate(zip(target, rates))]
    heapq.heapify(heap)
    while diff:
        _, c = heapq.heappop(heap)
        if not lo[c] <= rates[c] + step <= hi[c]:
            continue
        rates[c] += step
        diff -= step
        heapq.heappush(heap, (-(target[c] - rates[c]) * step, c))
    return rates


def check_planned(
    asked: Sequence[Fraction],
    planned: Sequence[Fraction],
    batch_size: int,
    labels: Sequence[str],
) -> None:
    """Refuse shares planned more than 1% off the asked ones; warn about any other move.

    ``labels`` name the components (``component 0 (table 'grasps')``). Exact plans pass
    silently.
    """
    moved = [(i, a, p) for i, (a, p) in enumerate(zip(asked, planned, strict=True)) if a != p]
    if not moved:
        return
    worst = max(moved, key=lambda m: abs(m[2] - m[1]) / m[1])
    i, a, p = worst
    if abs(p - a) > MAX_RELATIVE_MOVE * a:
        raise PlanError(
            f"{labels[i]}: share asked {float(a):.6g} cannot be planned exactly at batch size "
            f"{batch_size} (the shares have no common denominator up to {MAX_DENOMINATOR}); "
            f"it would be planned at {float(p):.6g}, {float(p / a):.4g} times what was "
            f"asked. A share of at least {float(ALWAYS_PLANNED):g} always plans: multiply this "
            f"component's weight by at least {_round_up(_factor_to_plan(a)):g}, drop it, or "
            f"give weights whose shares have a common denominator up to {MAX_DENOMINATOR} "
            f"(integer counts summing to at most {MAX_DENOMINATOR}, or decimals with at most "
            f"6 digits)"
        )
    fastest = min(moved, key=lambda m: _departure(m[1], m[2], batch_size))
    first = "" if fastest[0] == i else (
        f"; the first to drift one sample is {labels[fastest[0]]}, every "
        f"{_departure(fastest[1], fastest[2], batch_size):,} steps"
    )  # fmt: skip
    warnings.warn(
        "shares planned within 1e-6 of the asked ones, not exactly (no common denominator up "
        f"to {MAX_DENOMINATOR}; {len(moved)} of {len(asked)} moved). Largest relative move "
        f"{float(abs(p - a) / a):.2g}, {labels[i]}: share asked {float(a):.9g}, planned "
        f"{p.numerator}/{p.denominator} = {float(p):.9g} (its running count may drift from "
        f"the asked one by one more sample every {_departure(a, p, batch_size):,} steps)" + first,
        PlanWarning,
        stacklevel=3,
    )


def _factor_to_plan(asked: Fraction) -> float:
    """What a component's weight must be multiplied by for its share to reach
    :data:`ALWAYS_PLANNED` (the other weights unchanged)."""
    floor_share = ALWAYS_PLANNED
    return float(floor_share * (1 - asked) / ((1 - floor_share) * asked))


def _round_up(x: float) -> float:
    """``x`` rounded up to two significant digits."""
    if x <= 0:
        return x
    scale = 10.0 ** (floor(math.log10(x)) - 1)
    return ceil(x / scale) * scale


def _departure(asked: Fraction, planned: Fraction, batch_size: int) -> int:
    """The first step count ``s`` with ``|planned - asked| * B * s >= 1``."""
    return ceil(1 / (abs(planned - asked) * batch_size))
