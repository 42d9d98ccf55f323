"""The clock of a bag and which message each topic gives at each of its moments (pure).

Times are integer nanoseconds. For one episode (one bag):

- **Latched topics** publish once; they take no part in the start and the end of the clock.
- **The clock** starts at ``t_0``, the first time at which every other topic has published,
  and ticks at ``fps`` (a fraction ``num/den``): ``t_k = t_0 + floor(k * 10**9 * den / num)``.
  It runs while ``t_k`` is not later than the earliest last message of those topics (for a
  topic aligned ``"next"``: while ``t_k`` is earlier than its last message, which is the
  last one that can come after a moment).
- **Values**: ``"hold"`` (the default) takes a topic's latest message with time ``<= t_k``;
  ``"linear"`` interpolates between that message and the next one; ``"next"`` takes the first
  message with time ``> t_k``. A latched topic before its message has none (index -1).
- **Age**: ``t_k`` minus the time of the message used (the earlier one under ``"linear"``;
  negative under ``"next"``), in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from treadle.errors import CorruptData

ALIGNS = ("hold", "linear", "next")
NS = 10**9


def as_fraction(fps: object) -> Fraction:
    """``fps`` (``30``, ``29.97``, ``"30000/1001"``, a ``Fraction``) as a positive fraction;
    a float is read as the nearest fraction with a denominator up to 1001."""
    try:
        if isinstance(fps, (float, np.floating)):  # np.float32(30) too
            f = Fraction(float(fps)).limit_denominator(1001)
        else:
            f = Fraction(str(fps)) if isinstance(fps, str) else Fraction(fps)  # type: ignore[arg-type]
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):  # inf: OverflowError
        raise ValueError(
            f"fps must be a number or a fraction such as '30000/1001', got {fps!r}"
        ) from None
    if f <= 0:
        raise ValueError(f"fps must be positive, got {fps!r}")
    return f


def clock_moments(first: list[int], last: list[int], nexts: list[int], fps: Fraction) -> int:
    """How many moments :func:`clock` gives (computed without making them)."""
    t0 = max(first)
    end = min([*last, *(t - 1 for t in nexts)])
    if end < t0:
        return 0
    # floor(k * NS * den / num) <= end - t0  <=>  k * NS * den < (end - t0 + 1) * num
    return ((end - t0 + 1) * fps.numerator - 1) // (NS * fps.denominator) + 1


def clock(first: list[int], last: list[int], nexts: list[int], fps: Fraction) -> np.ndarray:
    """The moments ``t_k`` (int64 ns) of a clock over topics whose first and last message
    times are ``first``/``last`` (and the last times ``nexts`` of topics aligned "next")."""
    t0 = max(first)
    num, den = fps.numerator, fps.denominator
    k = np.arange(clock_moments(first, last, nexts, fps), dtype=object)
    return np.asarray([t0 + (i * NS * den) // num for i in k], dtype=np.int64)


@dataclass(frozen=True)
class Picks:
    """Per moment, the message index a topic gives (``-1``: none yet), its age in seconds,
    and for ``"linear"`` the next message's index and the weight of it (else ``None``)."""

    index: np.ndarray
    age_s: np.ndarray
    upper: np.ndarray | None = None
    weight: np.ndarray | None = None


def pick(times: np.ndarray, ticks: np.ndarray, align: str) -> Picks:
    """Which message of a topic (message times ``times``, increasing) each tick uses."""
    if align == "next":
        idx = np.searchsorted(times, ticks, side="right")
        if idx.size and idx.max() >= times.size:
            raise CorruptData("a moment has no later message for an align='next' topic")
        return Picks(idx, (ticks - times[idx]) / NS)
    idx = np.searchsorted(times, ticks, side="right") - 1
    have = idx >= 0
    age = np.full(ticks.shape, np.nan)
    age[have] = (ticks[have] - times[idx[have]]) / NS
    if align == "hold":
        return Picks(idx, age)
    upper = np.minimum(idx + 1, times.size - 1)
    exact = ~have | (times[np.maximum(idx, 0)] == ticks) | (upper == idx)
    span = (times[upper] - times[np.maximum(idx, 0)]).astype(np.float64)
    weight = np.where(exact, 0.0, (ticks - times[np.maximum(idx, 0)]) / np.where(exact, 1, span))
    return Picks(idx, age, np.where(exact, idx, upper), weight)


def order(times: np.ndarray, window_ns: int, where: str) -> np.ndarray:
    """The positions of messages (in log order, times ``times``) sorted by time, of equal
    times the last in log order only. A message more than ``window_ns`` earlier than one
    logged before it is out of the reorder window: an error naming ``where``."""
    if times.size == 0:
        return np.zeros(0, np.int64)
    running = np.maximum.accumulate(times)
    late = np.flatnonzero(running - times > window_ns)
    if late.size:
        i = int(late[0])
        raise CorruptData(
            f"{where}: message {i} is {(running[i] - times[i]) / NS:.3f} s earlier than one "
            f"logged before it (the reorder window is {window_ns / NS:g} s)"
        )
    pos = np.argsort(times, kind="stable")
    sorted_times = times[pos]
    keep = np.ones(pos.size, bool)
    keep[:-1] = sorted_times[:-1] != sorted_times[1:]  # of equal times, the last logged
    return pos[keep]


def usage(index: np.ndarray, upper: np.ndarray | None, count: int) -> dict[str, int]:
    """How many of ``count`` messages the moments used once, more than once, never."""
    used = np.bincount(index[index >= 0], minlength=count)
    if upper is not None:
        used = used + np.bincount(upper[(upper >= 0) & (upper != index)], minlength=count)
    return {
        "used_once": int((used == 1).sum()),
        "used_more": int((used > 1).sum()),
        "never_used": int((used == 0).sum()),
    }
