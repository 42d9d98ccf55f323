"""Which rank a loader reads: a rank or world size that is not a whole number, or a world of
several ranks with no rank from anywhere, is refused (each was read silently as another)."""

from __future__ import annotations

import numpy as np
import pytest

import treadle as td
from treadle.torch import ScanDataset


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    branch = td.Client(str(tmp_path_factory.mktemp("ranks")), create=True).project("p").branch()
    branch.table("a").append_episode({"x": np.arange(20, dtype=np.float32)}, episode="e")
    return td.Recipe(seed=1, batch_size=4, components=[td.Component(branch.table("a"))]).plan()


@pytest.fixture
def no_rank_env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rank": 1.7, "world_size": 2}, "rank must be an integer"),  # was rank 1
        ({"rank": 0, "world_size": 2.9}, "world_size must be an integer"),  # was 2 ranks
        ({"rank": True, "world_size": 2}, "rank must be an integer"),  # was rank 1
    ],
)
def test_a_rank_or_world_size_that_is_not_an_integer_is_refused(plan, no_rank_env, kwargs, match):
    with pytest.raises(td.PlanError, match=match):
        td.TrainLoader(plan, steps=1, **kwargs)
    with pytest.raises(td.PlanError, match=match):
        td.EvalLoader(plan, **kwargs)
    with pytest.raises(td.PlanError, match=match):
        ScanDataset(plan.table(0).scan_request(["x"]), 4, **kwargs)


def test_several_ranks_and_no_rank_is_refused(plan, no_rank_env):
    """``world_size=2`` without ``rank=`` (no torch.distributed, no ``RANK``): every process
    read rank 0's slots, the other half of each batch never."""
    with pytest.raises(td.PlanError, match=r"world size 2 .*no rank"):
        td.TrainLoader(plan, steps=1, world_size=2)
    with pytest.raises(td.PlanError, match=r"world size 2 .*no rank"):
        ScanDataset(plan.table(0).scan_request(["x"]), 4, world_size=2)
    no_rank_env.setenv("WORLD_SIZE", "4")  # a launcher's world size, its RANK missing
    with pytest.raises(td.PlanError, match=r"world size 4 .*no rank"):
        td.TrainLoader(plan, steps=1)
    loader = td.TrainLoader(plan, steps=1, rank=3)  # a rank given: the world is the launcher's
    assert (loader.rank, loader.world_size) == (3, 4)
    no_rank_env.setenv("RANK", "2")
    loader = td.TrainLoader(plan, steps=1)
    assert (loader.rank, loader.world_size) == (2, 4)
    assert next(iter(loader))["_moment"].tolist() == plan.batch(0, 2, 4).moment.tolist()
    no_rank_env.delenv("RANK")
    loader = td.TrainLoader(plan, steps=1, world_size=1)  # one rank needs no rank
    assert (loader.rank, loader.world_size) == (0, 1)
