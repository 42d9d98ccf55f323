"""The bag clock and message picks (importers/ros2/ros2_align.py), pure, on small cases."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from treadle.errors import CorruptData
from treadle.importers.ros2.ros2_align import as_fraction, clock, order, pick, usage

MS = 1_000_000


def test_clock_ticks_are_exact_fractions():
    ticks = clock([5], [5 + 10**9], [], Fraction(30000, 1001))
    k = np.arange(ticks.size)
    assert ticks[0] == 5 and ticks.size == 30  # 29.97 ticks in one second: 0..29
    assert list(ticks - 5) == [(int(i) * 10**9 * 1001) // 30000 for i in k]
    assert clock([0], [100], [], Fraction(10)).tolist() == [0]
    assert clock([200], [100], [], Fraction(10)).size == 0  # topics never overlap


def test_clock_starts_when_every_topic_has_published_and_stops_at_the_first_last():
    ticks = clock([0, 30 * MS], [900 * MS, 500 * MS], [], Fraction(10))
    assert ticks.tolist() == [30 * MS + k * 100 * MS for k in range(5)]
    # a topic aligned "next" needs a message after the last moment
    assert clock([0], [10**9], [500 * MS], Fraction(10)).tolist()[-1] == 400 * MS


def test_hold_linear_next_and_ages():
    times = np.array([0, 100, 200]) * MS
    ticks = np.array([0, 50, 100, 150, 200]) * MS
    hold = pick(times, ticks, "hold")
    assert hold.index.tolist() == [0, 0, 1, 1, 2] and hold.age_s.tolist() == [0, 0.05, 0, 0.05, 0]
    lin = pick(times, ticks, "linear")
    assert lin.weight.tolist() == [0, 0.5, 0, 0.5, 0] and lin.upper.tolist() == [0, 1, 1, 2, 2]
    nxt = pick(times, ticks[:-1], "next")
    assert nxt.index.tolist() == [1, 1, 2, 2] and nxt.age_s.tolist() == [-0.1, -0.05, -0.1, -0.05]
    before = pick(np.array([120 * MS]), ticks, "hold")  # a latched topic: nothing before it
    assert before.index.tolist() == [-1, -1, -1, 0, 0] and np.isnan(before.age_s[:3]).all()
    assert usage(hold.index, None, 3) == {"used_once": 1, "used_more": 2, "never_used": 0}


def test_order_keeps_the_last_logged_of_equal_times_and_bounds_reordering():
    times = np.array([10, 30, 20, 30, 40])  # log order; two messages at 30
    assert order(times, 100, "t").tolist() == [0, 2, 3, 4]
    with pytest.raises(CorruptData, match="reorder window"):
        order(np.array([0, 5 * 10**9, 10]), 10**9, "topic /x")


@pytest.mark.parametrize(("fps", "want"), [(30, Fraction(30)), ("30000/1001", Fraction(30000, 1001)),
                                            (29.97, Fraction(2997, 100))])  # fmt: skip
def test_fps_as_fraction(fps, want):
    assert as_fraction(fps) == want
    with pytest.raises(ValueError):
        as_fraction("fast")
