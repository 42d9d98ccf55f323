"""``Component(rename=...)``: tables of different robots stack into one batch."""

from __future__ import annotations

import numpy as np
import pytest

import treadle as td
from treadle.errors import PlanError


def _branch(root):
    branch = td.Client(root).project("robotics").branch()
    rng = np.random.default_rng(0)
    with branch.transaction("two robots") as tx:
        for e in range(2):
            tx.table("aloha").append_episode(
                {
                    "cam_high": td.VideoFrames(
                        rng.integers(0, 255, (6, 16, 16, 3), dtype=np.uint8), fps=10
                    ),
                    "qpos": np.full((6, 2), e, np.float32),
                },
                episode=f"a-{e}",
            )
            tx.table("franka").append_episode(
                {
                    "wrist": td.VideoFrames(
                        rng.integers(0, 255, (6, 16, 16, 3), dtype=np.uint8), fps=10
                    ),
                    "state": np.full((6, 2), 10 + e, np.float32),
                },
                episode=f"f-{e}",
            )
    return branch


def test_renamed_tables_stack_into_one_batch(tmp_path):
    branch = _branch(str(tmp_path))
    a = td.Windows({"cam_high": td.Video([0, 1], pad=True), "qpos": td.Rows([0, 1], pad=True)})
    f = td.Windows({"wrist": td.Video([0, 1], pad=True), "state": td.Rows([0, 1], pad=True)})
    recipe = td.Recipe(
        seed=1,
        batch_size=8,
        components=[
            td.Component(branch.table("aloha"), a, rename={"cam_high": "image", "qpos": "obs"}),
            td.Component(branch.table("franka"), f, rename={"wrist": "image", "state": "obs"}),
        ],
    )
    plan = recipe.plan()
    batch = next(iter(td.TrainLoader(plan, steps=1)))
    assert set(batch) == {
        "image",
        "obs",
        "image_is_pad",
        "obs_is_pad",
        "_component",
        "_moment",
        "_episode",
        "_frame",
    }
    assert batch["image"].shape == (8, 2, 16, 16, 3)
    c = batch["_component"].numpy()
    obs = batch["obs"].numpy()[:, 0, 0]
    assert set(obs[c == 0]) <= {0, 1} and set(obs[c == 1]) <= {10, 11} and set(c) == {0, 1}
    # the run id changes with the rename
    plain = td.Recipe(1, 8, [td.Component(branch.table("aloha"), a)]).plan().run_id
    renamed = (
        td.Recipe(1, 8, [td.Component(branch.table("aloha"), a, rename={"qpos": "obs"})])
        .plan()
        .run_id
    )
    assert plain != renamed
    again = td.Plan.from_record(plan.record.to_json(), branch.project.client)
    assert again.run_id == plan.run_id


@pytest.mark.parametrize(
    ("rename", "match"),
    [
        ({"qpos": "cam_high"}, r"component 0 \(table 'aloha'\).*'qpos' -> 'cam_high'.*already"),
        ({"qpos": "x", "cam_high": "x"}, r"table 'aloha'.*'qpos' and 'cam_high' onto one name 'x'"),
        ({"nope": "x"}, r"component 0 \(table 'aloha'\).*'nope' is not a column"),
    ],
)
def test_bad_renames_are_plan_errors(tmp_path, rename, match):
    branch = _branch(str(tmp_path))
    with pytest.raises(PlanError, match=match):
        td.Recipe(1, 2, [td.Component(branch.table("aloha"), None, rename=rename)]).plan()
