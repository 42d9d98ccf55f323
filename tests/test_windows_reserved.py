"""Batch keys treadle generates are reserved: a column or rename onto one is a PlanError.

Before the check, a column ``action_is_pad`` beside a padded ``action`` window silently
replaced the generated mask with the column's values (and ``rename=`` onto it the same).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import treadle as td
from treadle.errors import PlanError
from treadle.plan.reserved import RESERVED_SUFFIXES, reserved


@pytest.fixture(scope="module")
def branch(tmp_path_factory):
    """A table holding ``action_is_pad``, as written before writes refused reserved names
    (test_tryout_turn): the plan's check is what guards such a table."""
    root = tmp_path_factory.mktemp("reserved")
    b = td.Client(str(root)).project("p").branch()
    with pytest.MonkeyPatch.context() as mp, b.transaction("rows") as tx:
        mp.setattr("treadle.table.write.check_not_reserved", lambda column, where: None)
        for e in range(2):
            tx.table("t").append_episode(
                {
                    "action": np.arange(8, dtype=np.float32).reshape(4, 2),
                    "action_is_pad": np.ones(4, bool),  # same shape and dtype as the mask
                    "grip": np.ones(4, bool),
                },
                episode=f"e{e}",
            )
    return b


def _plan(branch, windows, rename=None):
    comp = td.Component(branch.table("t"), td.Windows(windows), rename=rename)
    return td.Recipe(seed=0, batch_size=2, components=[comp]).plan()


def test_a_column_named_like_a_pad_mask_is_refused(branch):
    windows = {"action": td.Rows(range(-2, 1), pad=True), "action_is_pad": td.Rows(range(-2, 1))}
    with pytest.raises(PlanError, match=r"column 'action_is_pad'.*reserved"):
        _plan(branch, windows)


def test_a_rename_onto_a_generated_key_is_refused(branch):
    windows = {"action": td.Rows(range(-2, 1), pad=True), "grip": td.Rows(range(-2, 1))}
    for new in ("action_is_pad", "grip_dim_mask", "grip_is_present"):
        with pytest.raises(PlanError, match=rf"rename 'grip' -> '{new}'.*reserved"):
            _plan(branch, windows, rename={"grip": new})


def test_a_reserved_column_is_refused_without_windows(branch):
    with pytest.raises(PlanError, match=r"column 'action_is_pad'"):
        td.Recipe(seed=0, batch_size=2, components=[td.Component(branch.table("t"))]).plan()


def test_renaming_a_reserved_column_away_delivers_both(branch):
    windows = {"action": td.Rows(range(-2, 1), pad=True), "action_is_pad": td.Rows(range(-2, 1))}
    plan = _plan(branch, windows, rename={"action_is_pad": "action_flag"})
    batches = list(td.TrainLoader(plan, steps=2))
    mask = torch.cat([b["action_is_pad"] for b in batches])
    # the unpadded window keeps anchors at frames 2, 3: nothing is padded, while the
    # column (all True) would have said every offset was
    assert mask.dtype == torch.bool and mask.shape == (4, 3) and not mask.any()
    assert torch.cat([b["action_flag"] for b in batches]).all()


def test_a_hand_made_record_with_a_reserved_rename_is_refused(branch):
    windows = {"action": td.Rows(range(-2, 1), pad=True), "grip": td.Rows(range(-2, 1))}
    record = _plan(branch, windows, rename={"grip": "g"}).record
    comp = dataclasses.replace(record.components[0], rename=(("grip", "action_is_pad"),))
    record = dataclasses.replace(record, components=(comp,))
    with pytest.raises(PlanError, match=r"'action_is_pad'.*reserved"):
        td.Plan.from_record(record, branch.project.client)


def test_the_rule():
    for key in ("_component", "_moment", "_episode", "_frame", "_valid", "_anything"):
        assert reserved(key)
    for suffix in RESERVED_SUFFIXES:
        assert reserved(f"cam{suffix}")
    for key in ("action", "is_pad", "cam_is_padded", "a_b", "observation.state"):
        assert not reserved(key)
