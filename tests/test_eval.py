"""EvalLoader: each eligible moment once, in table order, at any rank count; exact resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import treadle as td
from loader_helpers import WINDOWS, make_project, sample_hashes


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("eval") / "store")
    return root, make_project(root, episodes=3, frames=10)


def _component(branch, windows=WINDOWS):
    return td.Component(branch.table("nominal"), td.Windows(windows))


def _expected(branch) -> list[int]:
    """Eligible moments by hand: every frame with 3 more frames after it in its episode."""
    t = branch.table("nominal").pin()
    eps = t.to_arrow(["episode", "frame"]).to_pylist()
    lengths = {}
    for r in eps:
        lengths[r["episode"]] = lengths.get(r["episode"], 0) + 1
    return [i for i, r in enumerate(eps) if r["frame"] + 3 < lengths[r["episode"]]]


def test_one_rank_reads_every_eligible_moment_once_in_table_order(project):
    root, branch = project
    want = _expected(branch)
    assert len(want) == 3 * 7
    loader = td.EvalLoader(_component(branch), 4)
    assert len(loader) == 6  # 21 moments in batches of 4: the last one padded
    batches = list(loader)
    assert [len(b["_moment"]) for b in batches] == [4, 4, 4, 4, 4, 4]
    assert [int(b["_valid"].sum()) for b in batches] == [4, 4, 4, 4, 4, 1]
    assert all(b["_valid"].dtype == torch.bool for b in batches)
    got = np.concatenate([b["_moment"][b["_valid"]].numpy() for b in batches]).tolist()
    assert got == want
    assert batches[-1]["_moment"][1:].tolist() == want[:3]  # padding: position p % N
    b0 = batches[0]
    assert tuple(b0["cam"].shape) == (4, 4, 32, 32, 3) and tuple(b0["action"].shape) == (4, 4, 7)
    # same columns, same values as TrainLoader's reader gives for those moments
    t = branch.table("nominal").pin()
    rows = (np.asarray(want[:4])[:, None] + np.arange(4)).reshape(-1)
    act = t.take(rows, ["action"]).column("action")
    np.testing.assert_array_equal(
        b0["action"].numpy().reshape(-1, 7), np.array(act.to_pylist(), np.float32)
    )
    assert len(loader) == 0


def test_a_second_pass_over_one_loader_is_an_error_not_no_batches(project):
    """``for b in val`` each epoch over one EvalLoader gave no batch from the second epoch
    on, silently: a validation metric over nothing."""
    root, branch = project
    loader = td.EvalLoader(_component(branch), 4)
    assert len(list(loader)) == 6
    with pytest.raises(
        td.PlanError, match="delivered its pass .6 batches of 21 moments.: make a new"
    ):
        iter(loader)
    # a state restored at its pass's end still gives nothing (a resumed run's finished pass)
    done = td.EvalLoader.from_state(loader.state_dict(), td.Client(root))
    assert list(done) == []


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_partition_the_moments(project, world):
    root, branch = project
    want = _expected(branch)
    seen: list[int] = []
    for r in range(world):
        loader = td.EvalLoader(_component(branch), 3 * world, rank=r, world_size=world)
        mine = [m for b in loader for m in b["_moment"][b["_valid"]].tolist()]
        assert mine == want[r::world]  # positions r, r+W, ...
        seen += mine
    assert sorted(seen) == want and len(set(seen)) == len(seen)


@pytest.fixture(scope="module")
def rows121(tmp_path_factory):
    branch = (
        td.Client(str(tmp_path_factory.mktemp("e121") / "s"), create=True).project("p").branch()
    )
    branch.table("t").append({"x": np.arange(121, dtype=np.int64)})
    return td.Component(branch.table("t"), None)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_every_rank_gets_the_same_batches_and_valid_samples_cover_each_moment_once(
    rows121, workers
):
    """N=121, B=24, W=4: ranks had [6, 5, 5, 5] batches (a per-batch all_reduce hung)."""
    loaders = [td.EvalLoader(rows121, 24, rank=r, world_size=4, workers=workers) for r in range(4)]
    assert [len(ld) for ld in loaders] == [6, 6, 6, 6]
    per_rank = [list(ld) for ld in loaders]
    assert [len(bs) for bs in per_rank] == [6, 6, 6, 6]
    assert all(tuple(b["x"].shape) == (6,) and b["_valid"].dtype == torch.bool
               for bs in per_rank for b in bs)  # fmt: skip
    valid = [int(b["_valid"].sum()) for bs in per_rank for b in bs]
    assert sum(valid) == 121 and valid.count(6) == 20
    seen = sorted(m for bs in per_rank for b in bs for m in b["x"][b["_valid"]].tolist())
    assert seen == list(range(121))
    padded = [m for bs in per_rank for b in bs for m in b["x"][~b["_valid"]].tolist()]
    assert len(padded) == 144 - 121 and set(padded) <= set(range(121))


def test_resume_mid_pass_and_at_another_world_size(project):
    root, branch = project
    full = [sample_hashes(b) for b in td.EvalLoader(_component(branch), 4)]
    loader = td.EvalLoader(_component(branch), 4)
    it = iter(loader)
    first = [sample_hashes(next(it)) for _ in range(2)]
    state = loader.state_dict()
    del it
    assert state["step"] == 2
    client = td.Client(root)
    rest = [sample_hashes(b) for b in td.EvalLoader.from_state(state, client)]
    assert first + rest == full
    # two ranks from the same state cover the same remaining positions
    halves = [td.EvalLoader.from_state(state, client, rank=r, world_size=2) for r in (0, 1)]
    got = sorted(h for ld in halves for b in ld for h in sample_hashes(b))
    assert got == sorted(h for b in full[2:] for h in b)
    with pytest.raises(td.PlanError, match="keys"):
        td.EvalLoader.from_state({"record": state["record"], "step": 2}, client)
    with pytest.raises(td.PlanError, match="keys"):
        td.TrainLoader.from_state(state, client)  # an eval state is not a training state


def test_bad_input(project):
    root, branch = project
    with pytest.raises(td.PlanError, match="batch_size must be >= 1"):
        td.EvalLoader(_component(branch), 0)
    with pytest.raises(td.PlanError, match="divisible"):
        td.EvalLoader(_component(branch), 3, rank=0, world_size=2)
    with pytest.raises(td.PlanError, match="Component"):
        td.EvalLoader(branch.table("nominal"), 4)


def test_plan_maps_eligible_indices_in_table_order(project):
    root, branch = project
    plan = td.Recipe(seed=1, batch_size=2, components=[_component(branch)]).plan()
    assert plan.eligible_moments(0, np.arange(plan.eligible(0))).tolist() == _expected(branch)
    with pytest.raises(td.PlanError, match="out of range"):
        plan.eligible_moments(0, [plan.eligible(0)])


@pytest.mark.slow
def test_workers_give_the_same_batches(project):
    root, branch = project
    ref = [sample_hashes(b) for b in td.EvalLoader(_component(branch), 4)]
    got = [sample_hashes(b) for b in td.EvalLoader(_component(branch), 4, workers=2)]
    assert got == ref
