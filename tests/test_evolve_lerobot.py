"""A LeRobot-imported table gets a ``success`` column (issue 47): tl.to_lerobot of a new
run's batch equals, key by key, the one before the change (which tests/test_lerobot.py
checks against LeRobot's own keys and values), and the new run can select on it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import treadle as td
from importer_fixtures import make_lerobot_v3
from treadle import lerobot as tl


def test_lerobot_table_takes_a_success_column(tmp_path):
    make_lerobot_v3(tmp_path / "ds", lengths=(12, 9, 15))
    client = td.Client(str(tmp_path / "store"), create=True)
    td.importers.lerobot(str(tmp_path / "ds"), client.project("p"), "robot", progress=False)
    t = client.project("p").branch().table("robot")
    dt = {"observation.state": [-0.1, 0.0], "action": [0.0, 0.1],
          "observation.images.top": [0.0]}  # fmt: skip

    def first_batch(**kw):
        comp = td.Component(t, tl.windows(t, dt), **kw)
        plan = td.Recipe(seed=0, batch_size=4, components=[comp]).plan()
        return tl.to_lerobot(next(iter(td.TrainLoader(plan, steps=1))))

    before = first_batch()
    names = list(t.pin().episodes().names)
    t.add_column("success", {names[0]: True, names[1]: False, names[2]: True})
    after = first_batch()
    assert set(after) - set(before) == {"success"}  # the new feature, beside the others
    for k, v in before.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, after[k]), k
        else:
            assert v == after[k], k
    picked = first_batch(where="success = false")
    assert set(picked["episode_index"].tolist()) == {1}


@pytest.mark.slow
def test_success_column_beside_lerobots_own_batches(tmp_path):
    """A table imported from a dataset LeRobot's own writer made gets a ``success`` column;
    tl.to_lerobot of treadle's batches then equals LeRobotDataset's batches at the same
    anchors on every one of LeRobot's keys (examples/lerobot_act.py's comparison)."""
    pytest.importorskip("lerobot")
    path = Path(__file__).resolve().parents[1] / "examples" / "lerobot_act.py"
    spec = importlib.util.spec_from_file_location("lerobot_act_example", path)
    assert spec is not None and spec.loader is not None
    act = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(act)
    act.define_torchvision_ops()
    act.write_lerobot_dataset(tmp_path / "lerobot")
    client = td.Client(str(tmp_path / "store"), create=True)
    td.importers.lerobot(str(tmp_path / "lerobot"), client.project("p"), "act", progress=False)
    t = client.project("p").branch().table("act")
    names = list(t.pin().episodes().names)
    t.add_column("success", {n: i != 1 for i, n in enumerate(names)})
    ours = list(act.treadle_batches(t, 3))
    anchors = [int(m) for b in ours for m in b["_moment"]]
    _, theirs = act.lerobot_batches(tmp_path / "lerobot", anchors)
    for a in ours:
        b = next(theirs)
        assert {k for k in a if not k.startswith("_")} - set(b) == {"success"}
        assert [k for k in b if not act.same(a[k], b[k])] == []
        assert a["success"].tolist() == [e != 1 for e in a["episode_index"].tolist()]
