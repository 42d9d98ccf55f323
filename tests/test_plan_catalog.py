"""The planner on real tables in a local root: pinning, commits mid-run, from_record."""

from __future__ import annotations

import numpy as np
import pytest

import treadle as td
from treadle.errors import PlanError
from treadle.plan.plan import Plan
from treadle.plan.recipe import Component, Recipe
from treadle.plan.record import RunRecord
from treadle.video.values import VideoFrames


@pytest.fixture
def robots(tmp_path):
    client = td.Client(str(tmp_path), create=True)
    branch = client.project("robotics").branch("main")
    fails = branch.table("failed_grasps")
    for i, n in enumerate([12, 20]):
        fails.append_episode(
            {
                "cam": VideoFrames(np.full((n, 16, 16, 3), i, np.uint8), fps=30),
                "action": np.arange(n * 7, dtype=np.float32).reshape(n, 7),
            },
            episode=f"f{i}",
        )
    nominal = branch.table("nominal_grasps")
    for i, n in enumerate([50, 3, 40]):
        nominal.append_episode({"action": np.zeros((n, 7), np.float32)}, episode=f"n{i}")
    return client, branch


def recipe(branch, seed=2048):
    windows = td.Windows({"cam": td.Video(range(8)), "action": td.Rows(range(8))})
    return Recipe(
        seed=seed,
        batch_size=16,
        components=[
            Component(branch.table("failed_grasps"), windows, weight=0.3),
            Component(branch.table("nominal_grasps"), weight=0.7),
        ],
    )


def test_plan_pins_heads_and_records_them(robots):
    client, branch = robots
    plan = recipe(branch).plan()
    rec = plan.record
    assert rec.project == "robotics"
    head = branch.commit_id
    assert [t.name for t in rec.tables] == ["failed_grasps", "nominal_grasps"]
    assert [t.commit for t in rec.tables] == [head, head]
    assert [t.branch for t in rec.tables] == ["main", "main"]
    assert [t.num_moments for t in rec.tables] == [32, 93]
    assert [t.num_episodes for t in rec.tables] == [2, 3]
    assert (plan.eligible(0), plan.eligible(1)) == (5 + 13, 93)
    assert plan.tables[0].version == rec.tables[0].version
    batch = plan.batch(0)
    ep = plan.table(0).episodes()
    for m in batch.moment[batch.component == 0]:
        e = np.searchsorted(ep.starts, m, side="right") - 1
        assert m - ep.starts[e] + 7 < ep.lengths[e]


def test_a_commit_mid_run_changes_nothing_and_a_new_plan_is_a_new_run(robots):
    client, branch = robots
    plan = recipe(branch).plan()
    before = [plan.batch(s, 1, 2).moment.copy() for s in range(5)]
    branch.table("nominal_grasps").append_episode({"action": np.zeros((9, 7), np.float32)})
    assert [plan.batch(s, 1, 2).moment.tolist() for s in range(5)] == [b.tolist() for b in before]
    again = recipe(branch).plan()
    assert again.record.tables[1].version != plan.record.tables[1].version
    assert again.run_id != plan.run_id
    assert again.record.tables[1].num_moments == 102


def test_a_commit_to_another_table_keeps_the_run_id(robots):
    client, branch = robots
    plan = recipe(branch).plan()
    branch.table("checkpoints").append({"step": np.asarray([100], np.int64)})
    again = recipe(branch).plan()
    assert again.record.tables[0].commit != plan.record.tables[0].commit
    assert again.run_id == plan.run_id


def test_from_record_reopens_the_pinned_versions(robots):
    client, branch = robots
    plan = recipe(branch, seed=2**64 - 1).plan()
    text = plan.record.to_json()
    branch.table("failed_grasps").append_episode(
        {
            "cam": VideoFrames(np.zeros((30, 16, 16, 3), np.uint8)),
            "action": np.zeros((30, 7), np.float32),
        }
    )
    other = td.Client(client.root)
    again = Plan.from_record(RunRecord.from_json(text), other)
    assert again.run_id == plan.run_id
    assert [t.version for t in again.tables] == [t.version for t in plan.tables]
    for step in (0, 7, 10**12):
        a, b = plan.batch(step, 3, 4), again.batch(step, 3, 4)
        assert np.array_equal(a.component, b.component) and np.array_equal(a.moment, b.moment)


def test_explicitly_pinned_table_and_column_checks(robots):
    client, branch = robots
    ref = branch.table("failed_grasps")
    pinned = ref.at(ref.pin().version)
    plan = Recipe(1, 4, [Component(pinned, td.Windows({"action": td.Rows(0)}))]).plan()
    assert plan.record.tables[0].branch is None
    assert RunRecord.from_json(plan.record.to_json()) == plan.record
    with pytest.raises(PlanError, match="not a video column"):
        Recipe(1, 4, [Component(ref, td.Windows({"action": td.Video(0)}))]).plan()
    with pytest.raises(PlanError, match="td.Rows window on video column 'cam'"):
        Recipe(1, 4, [Component(ref, td.Windows({"cam": td.Rows(0)}))]).plan()
    with pytest.raises(PlanError, match="'wrist' is not a column"):
        Recipe(1, 4, [Component(ref, td.Windows({"wrist": td.Video(0)}))]).plan()
    with pytest.raises(PlanError, match="no eligible moments"):
        Recipe(1, 4, [Component(ref, td.Windows({"cam": td.Video(range(21))}))]).plan()
