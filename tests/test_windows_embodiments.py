"""Components of different shapes in one batch: ``Component(pad_to=..., name=...)`` and
``td.Rows/td.Video(..., optional=True)``, on the CPU loader with workers=0 and workers=2."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treadle as td
from embodiment_helpers import DIMS, make_robots, values
from treadle.errors import PlanError
from treadle.plan.card import render_card
from treadle.plan.stack import component_names


@pytest.fixture(scope="module")
def robots(tmp_path_factory):
    return make_robots(str(tmp_path_factory.mktemp("robots")))


def _windows(cam: bool = True) -> td.Windows:
    specs = {
        "state": td.Rows([-1, 0], pad=True),
        "action": td.Rows([0, 1, 2], pad=True),
        "cam": td.Video([0], size=(16, 16), optional=True),
    }
    return td.Windows(specs)


def _recipe(branch, **extra) -> td.Recipe:
    pad = {"state": 14, "action": 14}
    comps = [
        td.Component(branch.table("arm4"), _windows(), weight=1, pad_to=pad, name="so100"),
        td.Component(branch.table("arm7"), _windows(), weight=1, pad_to=pad),
        td.Component(branch.table("bi14"), _windows(), weight=1, name="aloha", **extra),
    ]
    return td.Recipe(seed=3, batch_size=12, components=comps)


def _check_batch(batch: dict, plan: td.Plan) -> None:
    comp = np.asarray(batch["_component"])
    assert set(comp.tolist()) == {0, 1, 2}
    state, action = np.asarray(batch["state"]), np.asarray(batch["action"])
    assert state.shape == (12, 2, 14) and action.shape == (12, 3, 14)
    names = ["arm4", "arm7", "bi14"]
    for key, arr in (("state_dim_mask", state), ("action_dim_mask", action)):
        mask = np.asarray(batch[key])
        assert mask.shape == (12, 14) and mask.dtype == np.bool_
        for i, c in enumerate(comp.tolist()):
            d = DIMS[names[c]]
            assert mask[i].tolist() == [True] * d + [False] * (14 - d)
            assert not arr[i][..., d:].any()  # padded dimensions are zeros
    # the real dimensions are the table's values at the anchor (frame offset 0)
    moment, episode = np.asarray(batch["_moment"]), np.asarray(batch["_episode"])
    frame = np.asarray(batch["_frame"])
    for i, c in enumerate(comp.tolist()):
        table = plan.table(c)
        n = int(table.episodes().lengths[episode[i]])
        want = values(names[c], int(episode[i]), n, DIMS[names[c]], 0.0)[frame[i]]
        np.testing.assert_array_equal(state[i, 1, : DIMS[names[c]]], want)
        assert table.episodes().starts[episode[i]] + frame[i] == moment[i]
    cam = np.asarray(batch["cam"])
    present = np.asarray(batch["cam_is_present"])
    assert cam.shape == (12, 1, 16, 16, 3) and present.dtype == np.bool_
    assert present.tolist() == (comp != 2).tolist()
    assert not cam[comp == 2].any()  # zeros where the table has no camera
    assert cam[comp != 2].any()


def test_mixed_dims_batch_pads_masks_and_zeros(robots):
    plan = _recipe(robots).plan()
    assert plan.components == ["so100", "arm7", "aloha"]
    batches = list(td.TrainLoader(plan, steps=3))
    for batch in batches:
        _check_batch(batch, plan)
    # the record keeps pad_to, names and optional specs: a rebuilt plan delivers the same
    again = td.Plan.from_record(plan.record.to_json(), robots.project.client)
    assert again.run_id == plan.run_id and again.components == plan.components
    card = render_card(plan.record, plan=plan)
    assert "[0] so100 (arm4)" in card and "[2] aloha (bi14)" in card
    assert "pad_to: {'action': 14, 'state': 14}" in card


@pytest.mark.slow
def test_mixed_dims_batch_with_worker_processes(robots):
    plan = _recipe(robots).plan()
    here = list(td.TrainLoader(plan, steps=3))
    there = list(td.TrainLoader(plan, steps=3, workers=2))
    for a, b in zip(here, there, strict=True):
        _check_batch(b, plan)
        assert set(a) == set(b)
        for k in a:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_unpadded_components_of_different_shapes_are_refused_at_plan_time(robots):
    w = td.Windows({"state": td.Rows([0])})
    comps = [td.Component(robots.table("arm4"), w), td.Component(robots.table("bi14"), w)]
    with pytest.raises(PlanError, match=r"\(4,\).*\(14,\).*pad_to=\{'state': 14\}"):
        td.Recipe(1, 4, comps).plan()


@pytest.mark.parametrize(
    ("pad_to", "match"),
    [
        ({"state": 3}, "smaller than the column's last dimension 4"),
        ({"speed": 8}, "is a scalar"),
        ({"nope": 8}, r"pad_to names \['nope'\]"),
        ({"state": 0}, "must be >= 1"),
        ({"state": 2.5}, "positive integer"),
    ],
)
def test_bad_pad_to_is_refused(robots, pad_to, match):
    w = td.Windows({"state": td.Rows([0]), "speed": td.Rows([0])})
    with pytest.raises(PlanError, match=match):
        td.Recipe(1, 4, [td.Component(robots.table("arm4"), w, pad_to=pad_to)]).plan()


def test_optional_column_rules(robots):
    # a column no table has: nothing to take the shape from
    w = td.Windows({"state": td.Rows([0]), "gripper": td.Rows([0], optional=True)})
    with pytest.raises(PlanError, match="optional in every component"):
        td.Recipe(1, 4, [td.Component(robots.table("arm4"), w)]).plan()
    # an absent optional video needs its size
    w = td.Windows({"state": td.Rows([0]), "cam": td.Video([0], optional=True)})
    with pytest.raises(PlanError, match=r"size=\(H, W\)"):
        td.Recipe(1, 4, [td.Component(robots.table("bi14"), w)]).plan()
    # a column that is not optional must exist, as before
    w = td.Windows({"state": td.Rows([0]), "cam": td.Video([0], size=(16, 16))})
    with pytest.raises(PlanError, match="'cam' is not a column"):
        td.Recipe(1, 4, [td.Component(robots.table("bi14"), w)]).plan()


def test_names_default_to_table_names_made_unique(robots):
    w = td.Windows({"state": td.Rows([0])})
    t = robots.table("arm4")
    plan = td.Recipe(1, 4, [td.Component(t, w), td.Component(t, w, where="frame > 2")]).plan()
    assert plan.components == ["arm4", "arm4-2"]
    with pytest.raises(PlanError, match="'x' is given to more than one"):
        td.Recipe(1, 4, [td.Component(t, w, name="x"), td.Component(t, w, name="x")]).plan()
    # a record without names, pad_to or optional keeps its run id (fields written only if set)
    comps = plan.record.to_dict()["components"]
    assert all(not {"name", "pad_to"} & c.keys() for c in comps)
    assert "optional" not in str(comps)


@settings(max_examples=80, deadline=None)
@given(
    tables=st.lists(st.sampled_from(["a", "b", "a-2"]), min_size=1, max_size=6),
    given_names=st.lists(st.one_of(st.none(), st.sampled_from(["a", "x", "y"])), max_size=6),
)
def test_component_names_are_unique_and_keep_the_given_ones(tables, given_names):
    names = (given_names + [None] * len(tables))[: len(tables)]
    explicit = [n for n in names if n is not None]
    comps = tuple(SimpleNamespace(table=i, name=n) for i, n in enumerate(names))
    record = SimpleNamespace(components=comps, tables=[SimpleNamespace(name=t) for t in tables])
    if len(set(explicit)) < len(explicit):
        with pytest.raises(PlanError, match="is given to more than one component"):
            component_names(record)
        return
    got = component_names(record)
    assert len(set(got)) == len(got)
    for n, g, t in zip(names, got, tables, strict=True):
        assert g == n if n is not None else g == t or g.startswith(f"{t}-")


def test_a_windowed_scalar_column_gets_no_dim_mask(local_root):
    # A scalar's last axis as delivered is its window's time axis: the layout took a
    # Rows(range(3)) window of a scalar for a column padded from nothing to 3 and added
    # "t_dim_mask" (LeRobot's index/timestamp columns got masks nobody asked for).
    branch = td.Client(local_root).project("p").branch("main")
    branch.table("s").append_episode(
        {"t": np.arange(6, dtype=np.float32), "a": np.zeros((6, 4), np.float32)}, episode="e"
    )
    windows = td.Windows({"t": td.Rows(range(3)), "a": td.Rows(range(3))})
    recipe = td.Recipe(seed=0, batch_size=2, components=[td.Component(branch.table("s"), windows)])
    (batch,) = list(td.TrainLoader(recipe, steps=1))
    assert batch["t"].shape == (2, 3) and batch["a"].shape == (2, 3, 4)
    assert not [k for k in batch if k.endswith("_dim_mask")]
