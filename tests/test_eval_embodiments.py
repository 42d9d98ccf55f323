"""Evaluating one robot of a cross-embodiment mix: ``td.EvalLoader(plan, batch_size,
only=name)`` gives the keys, masks and flags the plan's ``TrainLoader`` gives, over every
eligible moment of that component once; a robot without an optional camera evaluates alone."""

from __future__ import annotations

import numpy as np
import pytest

import treadle as td
from embodiment_helpers import DIMS, make_robots, values
from treadle.errors import PlanError

TABLES = {"so100": "arm4", "arm7": "arm7", "aloha": "bi14"}


@pytest.fixture(scope="module")
def robots(tmp_path_factory):
    return make_robots(str(tmp_path_factory.mktemp("robots")))


def _windows() -> td.Windows:
    return td.Windows(
        {
            "state": td.Rows([-1, 0], pad=True),
            "action": td.Rows([0, 1, 2], pad=True),
            "cam": td.Video([0], size=(16, 16), optional=True),
        }
    )


@pytest.fixture(scope="module")
def plan(robots) -> td.Plan:
    pad = {"state": 14, "action": 14}
    comps = [
        td.Component(robots.table("arm4"), _windows(), weight=1, pad_to=pad, name="so100"),
        td.Component(robots.table("arm7"), _windows(), weight=1, pad_to=pad),
        td.Component(robots.table("bi14"), _windows(), weight=1, name="aloha"),
    ]
    return td.Recipe(seed=3, batch_size=12, components=comps).plan()


def _check(batches: list[dict], plan: td.Plan, c: int) -> np.ndarray:
    """Every batch is component ``c``'s, masked as training masks it; returns the valid
    moments in order."""
    name = plan.components[c]
    d = DIMS[TABLES[name]]
    moments = []
    for batch in batches:
        valid = np.asarray(batch["_valid"])
        assert (np.asarray(batch["_component"]) == c).all()
        for key in ("state_dim_mask", "action_dim_mask"):
            mask = np.asarray(batch[key])
            assert mask.shape[1] == 14
            assert (mask == (np.arange(14) < d)).all(), key
        assert not np.asarray(batch["action"])[..., d:].any()
        present = np.asarray(batch["cam_is_present"])
        assert (present == (name != "aloha")).all()
        cam = np.asarray(batch["cam"])
        assert cam.shape[1:] == (1, 16, 16, 3)
        assert cam.any() == (name != "aloha")
        table = plan.table(c)
        for i in np.flatnonzero(valid):
            e, f = int(batch["_episode"][i]), int(batch["_frame"][i])
            n = int(table.episodes().lengths[e])
            want = values(TABLES[name], e, n, d, 0.0)[f]
            np.testing.assert_array_equal(np.asarray(batch["state"])[i, 1, :d], want)
        moments.extend(np.asarray(batch["_moment"])[valid].tolist())
    return np.asarray(moments)


def test_one_component_of_a_mix_has_the_training_keys(plan):
    train = set(next(iter(td.TrainLoader(plan, steps=1))))
    for c, name in enumerate(plan.components):
        loader = td.EvalLoader(plan, 4, only=name)
        batches = list(loader)
        assert len(batches) == len(loader.__class__(plan, 4, only=c)) == -(-plan.eligible(c) // 4)
        for batch in batches:
            assert set(batch) == train | {"_valid"}, name
        got = _check(batches, plan, c)
        want = plan.eligible_moments(c, np.arange(plan.eligible(c)))
        np.testing.assert_array_equal(got, want)  # each moment once, in table order


def test_one_component_of_a_mix_across_ranks_and_a_restart(plan, robots):
    c = plan.components.index("aloha")
    whole = _check(list(td.EvalLoader(plan, 4, only="aloha")), plan, c)
    ranks = [list(td.EvalLoader(plan, 4, only="aloha", rank=r, world_size=2)) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1])
    seen = np.concatenate([_check(b, plan, c) for b in ranks])
    assert sorted(seen.tolist()) == sorted(whole.tolist())
    first = td.EvalLoader(plan, 4, only="aloha")
    it = iter(first)
    next(it)
    state = first.state_dict()
    assert state["component"] == c and state["batch_size"] == 4
    rest = list(td.EvalLoader.from_state(state, robots.project.client))
    np.testing.assert_array_equal(_check(rest, plan, c), whole[4:])


def test_its_own_batch_size_at_a_world_size_the_mix_does_not_divide(plan):
    """The mix's batch is 12; an eval pass of 16 on 8 ranks is valid (it was refused)."""
    c = plan.components.index("so100")
    seen = []
    for r in range(8):
        loader = td.EvalLoader(plan, 16, only="so100", rank=r, world_size=8)
        assert len(loader) == -(-plan.eligible(c) // 16)
        seen += _check(list(loader), plan, c).tolist()
    assert sorted(seen) == plan.eligible_moments(c, np.arange(plan.eligible(c))).tolist()


def test_one_component_of_a_mix_in_worker_processes(plan):
    here = list(td.EvalLoader(plan, 4, only="aloha"))
    there = list(td.EvalLoader(plan, 4, only="aloha", workers=2))
    _check(there, plan, plan.components.index("aloha"))
    assert len(here) == len(there)
    for a, b in zip(here, there, strict=True):
        assert set(a) == set(b)
        for k in a:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_a_robot_without_the_optional_camera_evaluates_alone(robots):
    loader = td.EvalLoader(td.Component(robots.table("bi14"), _windows()), 8)
    batches = list(loader)
    assert sum(int(np.asarray(b["_valid"]).sum()) for b in batches) == loader.num_moments > 0
    for b in batches:
        assert not np.asarray(b["cam_is_present"]).any()
        assert np.asarray(b["cam"]).shape == (8, 1, 16, 16, 3) and not np.asarray(b["cam"]).any()


def test_picking_a_component_is_checked(plan, robots):
    with pytest.raises(PlanError, match=r"3 components \(\['so100', 'arm7', 'aloha'\]\).*only="):
        td.EvalLoader(plan, 4)
    with pytest.raises(PlanError, match="only='nope'"):
        td.EvalLoader(plan, 4, only="nope")
    with pytest.raises(PlanError, match="only=3"):
        td.EvalLoader(plan, 4, only=3)
    with pytest.raises(PlanError, match="batch_size 6 is not divisible by world_size 4"):
        td.EvalLoader(plan, 6, only=0, rank=0, world_size=4)
    with pytest.raises(PlanError, match="give it the plan"):
        td.EvalLoader(td.Component(robots.table("arm4"), _windows()), 4, only=0)
