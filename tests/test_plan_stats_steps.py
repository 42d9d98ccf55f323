"""``plan.stats(..., steps=)``: the statistics of the samples of some steps, each component
weighed by its samples there, the pooled statistics a run with a weight schedule has (it
had none: ``by_component=True`` and pooling by hand, which gets quantiles wrong)."""

from __future__ import annotations

import numpy as np
import pytest

import treadle as td
from embodiment_helpers import make_robots
from treadle.errors import PlanError

FIELDS = ("count", "mean", "std", "min", "max", "q01", "q99")


@pytest.fixture(scope="module")
def robots(tmp_path_factory):
    return make_robots(str(tmp_path_factory.mktemp("robots")), video=False)


def _comps(robots, weights=(1, 1, 1)):
    w = td.Windows({"state": td.Rows([-1, 0], pad=True), "speed": td.Rows([0])})
    pad = {"state": 14}
    tables = [("arm4", pad), ("arm7", pad), ("bi14", None)]
    return [td.Component(robots.table(t), w, weight=x, pad_to=p)
            for (t, p), x in zip(tables, weights) if x]  # fmt: skip


def _same(got, want):
    for n in want:
        for f in FIELDS:
            a, b = getattr(got[n], f), getattr(want[n], f)
            np.testing.assert_array_equal(a, b, err_msg=f"{n}.{f}")


@pytest.mark.filterwarnings("ignore:plan.stats. column .state.")
@pytest.mark.parametrize("steps", [10, (2, 9), (0, 3)])
def test_a_scheduled_run_pools_over_the_steps_asked(robots, steps):
    sched = td.Schedule([(0, [1, 1, 0]), (3, td.Ramp([1, 2, 3], steps=4))])
    plan = td.Recipe(seed=1, batch_size=6, components=_comps(robots), schedule=sched).plan()
    a, b = (0, steps) if isinstance(steps, int) else steps
    counts = np.asarray(plan.cumulative(b)) - np.asarray(plan.cumulative(a))
    # the same samples, drawn by an unscheduled run with those counts as weights
    flat = td.Recipe(seed=1, batch_size=6, components=_comps(robots, counts.tolist())).plan()
    got = plan.stats(["state", "speed"], steps=steps)
    _same(got, flat.stats(["state", "speed"]))
    if counts[2] == 0:  # no 14-D samples in those steps: its dimensions have no values
        assert (got["state"].count[7:] == 0).all()


def test_without_steps_a_scheduled_run_says_how(robots):
    sched = td.Schedule([(0, [1, 1, 0]), (3, [1, 1, 1])])
    plan = td.Recipe(seed=1, batch_size=6, components=_comps(robots), schedule=sched).plan()
    with pytest.raises(PlanError, match=r"steps=N"):
        plan.stats(["state"])
    for bad in (0, (3, 3), (-1, 4), (1, 2, 3), 2.5, True):
        with pytest.raises(PlanError, match="steps must be"):
            plan.stats(["state"], steps=bad)
    assert set(plan.stats(["state"], by_component=True)) == {"arm4", "arm7", "bi14"}


def test_steps_on_a_plain_run_weigh_by_the_samples_there(robots):
    plan = td.Recipe(seed=2, batch_size=5, components=_comps(robots, (1, 1, 2))).plan()
    counts = np.asarray(plan.cumulative(7))
    flat = td.Recipe(seed=2, batch_size=5, components=_comps(robots, counts.tolist())).plan()
    _same(plan.stats(["state"], steps=7), flat.stats(["state"]))
