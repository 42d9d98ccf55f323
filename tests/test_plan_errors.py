"""Bad input to Component, Recipe, Plan.batch: a clear PlanError (a ValueError) naming the thing."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from plan_helpers import FakeRef, FakeTable
from treadle.errors import PlanError
from treadle.plan.recipe import Component, Recipe
from treadle.plan.windows import Rows, Video, Windows


def table(name="t", lengths=(20, 30), **kw):
    return FakeRef(FakeTable(name, list(lengths), video=("cam",), **kw))


def plan(batch_size=8):
    return Recipe(1, batch_size, [Component(table("a")), Component(table("b"))]).plan()


@pytest.mark.parametrize(
    "weight", [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf, "0.3", None, True, False, [1]]
)
def test_bad_weights(weight):
    with pytest.raises(PlanError, match=r"weight of table 't'") as e:
        Component(table(), weight=weight)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("weight", [1, 0.001, 1e-9, Fraction(1, 3), np.float32(0.5), np.int64(2)])
def test_good_weights(weight):
    assert Component(table(), weight=weight).weight > 0


def test_not_a_table():
    with pytest.raises(PlanError, match="table"):
        Component("failed_grasps")
    with pytest.raises(PlanError, match="Windows"):
        Component(table(), windows=["cam"])


def test_windows_may_be_a_plain_dict():
    c = Component(table(), {"action": Rows(range(3))})
    assert c.windows == Windows({"action": Rows(range(3))})


def test_empty_and_bad_component_lists():
    with pytest.raises(PlanError, match="components is empty"):
        Recipe(1, 8, [])
    with pytest.raises(PlanError, match=r"components\[1\]"):
        Recipe(1, 8, [Component(table()), "b"])
    with pytest.raises(PlanError, match="list of td.Component"):
        Recipe(1, 8, Component(table()))


@pytest.mark.parametrize("seed", [-1, 2**64, 1.0, "1", None, True])
def test_bad_seeds(seed):
    with pytest.raises(PlanError, match="seed"):
        Recipe(seed, 8, [Component(table())])


@pytest.mark.parametrize("seed", [0, 2**64 - 1, np.uint64(2**64 - 1)])
def test_extreme_seeds_plan(seed):
    p = Recipe(seed, 8, [Component(table())]).plan()
    assert p.seed == int(seed) and p.batch(5).moment.size == 8


@pytest.mark.parametrize("batch_size", [0, -8, 8.0, "8", None, False])
def test_bad_batch_size(batch_size):
    with pytest.raises(PlanError, match="batch_size"):
        Recipe(1, batch_size, [Component(table())])


def test_window_column_missing():
    c = Component(table("fails"), Windows({"wrist": Video(range(4))}))
    with pytest.raises(PlanError, match=r"window column 'wrist' is not a column of table 'fails'"):
        Recipe(1, 8, [c]).plan()


def test_video_window_on_a_non_video_column():
    c = Component(table("fails"), Windows({"action": Video(range(4))}))
    with pytest.raises(PlanError, match=r"'action', which is not a video column"):
        Recipe(1, 8, [c]).plan()


def test_rows_window_on_a_video_column():
    c = Component(table("fails"), Windows({"cam": Rows(range(4))}))
    with pytest.raises(PlanError, match=r"td.Rows window on video column 'cam'"):
        Recipe(1, 8, [c]).plan()


def test_windows_longer_than_every_episode():
    ok = Component(table("short_ok", [100]))
    c = Component(table("short", [20, 30, 0]), Windows({"cam": Video(range(31))}))
    with pytest.raises(PlanError, match=r"component 1 \(table 'short'\) has no eligible") as e:
        Recipe(1, 8, [ok, c]).plan()
    assert "31 moments" in str(e.value) and "has 30" in str(e.value)
    # Exactly as long as the longest episode: one eligible moment.
    c = Component(table("short", [20, 30]), Windows({"cam": Video(range(30))}))
    assert Recipe(1, 8, [c]).plan().eligible(0) == 1


def test_an_empty_table_has_no_eligible_moments():
    with pytest.raises(PlanError, match="no eligible moments"):
        Recipe(1, 8, [Component(table("empty", []))]).plan()


def test_components_from_two_projects():
    a, b = table("a", project="p1"), table("b", project="p2")
    with pytest.raises(PlanError, match="projects"):
        Recipe(1, 8, [Component(a), Component(b)]).plan()


@pytest.mark.parametrize(
    "args, match",
    [
        ((-1,), "step must be >= 0"),
        ((1.0,), "step must be an integer"),
        (("3",), "step must be an integer"),
        ((True,), "step must be an integer"),
        ((2**63,), "past the last step"),
        ((0, 0, 3), "batch_size 8 is not divisible by world_size 3"),
        ((0, 0, 0), "world_size must be >= 1"),
        ((0, 4, 4), r"rank must be in 0..3"),
        ((0, -1, 4), r"rank must be in 0..3"),
        ((0, 0, 16), "not divisible"),
    ],
)
def test_bad_batch_arguments(args, match):
    with pytest.raises(PlanError, match=match):
        plan().batch(*args)


def test_bad_component_and_position_queries():
    p = plan()
    with pytest.raises(PlanError, match="component must be in 0..1"):
        p.eligible(2)
    with pytest.raises(PlanError, match="position must be >= 0"):
        p.at(-1)
    with pytest.raises(PlanError, match="draw indices"):
        p.moments(0, [-1])


def test_last_step_still_plans():
    p = plan(batch_size=8)
    last = (2**63 - 1) // 8 - 1
    b = p.batch(last)
    assert int(b.position[-1]) == last * 8 + 7


def _mix(weights, batch_size=64):
    refs = [table(f"t{i}") for i in range(len(weights))]
    return Recipe(1, batch_size, [Component(r, weight=w) for r, w in zip(refs, weights)])


@pytest.mark.parametrize(
    ("weights", "component", "asked"),
    [([1e-12, 1], 0, "1e-12"), ([1, 1e-9, 1e9], 1, "1e-18"), ([3, 5_000_000], 0, "6e-07")],
)
def test_tiny_weights_are_refused_not_oversampled(weights, component, asked):
    # Before: planned silently at 1e-6 (10**6 x asked), [1, 1e-9, 1e9] gave its first two
    # components equal shares (5e-7 each), and [3, 5e6] drew 6 samples instead of 3.84 in
    # 10**5 steps.
    with pytest.raises(
        PlanError,
        match=rf"component {component} \(table 't{component}'\): "
        rf"share asked {asked} cannot be planned exactly",
    ) as e:
        _mix(weights).plan()
    assert "times what was asked" in str(e.value) and "common denominator" in str(e.value)


def test_a_share_moved_within_1e_6_warns_with_asked_and_planned():
    # Before: planned 9997/40000 for an asked 0.249925022... without a word.
    from treadle.errors import PlanWarning

    with pytest.warns(
        PlanWarning,
        match=r"component 1 \(table 't1'\): share asked "
        r"0\.000299910027, planned 3/10000 = 0\.0003 \(.* every 173,664 steps",
    ):
        plan = _mix([1 / 3, 0.0004, 1.0]).plan()
    assert plan.weights != plan.asked_weights


@pytest.mark.parametrize("weights", [[0.3, 0.7], [1, 999_999], [0.000001, 0.999999], [1 / 3] * 3])
def test_exact_shares_plan_without_a_warning(weights):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = _mix(weights).plan()
    assert plan.weights == plan.asked_weights
