"""treadle.lerobot: LeRobot's keys, shapes and dtypes from tl.windows + tl.to_lerobot; integer
episodes; and examples/lerobot_act.py (LeRobot's ACT on treadle batches, losses bit-identical
to LeRobot's own DataLoader) run as CI runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import treadle as td
from importer_fixtures import make_lerobot_v3
from treadle import lerobot as tl

REPO = Path(__file__).parents[1]
CAMS = ("observation.images.top", "observation.images.side")


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tl")
    written = make_lerobot_v3(tmp / "ds", lengths=(12, 9, 15), cams=CAMS, episode_keyframes=True)
    client = td.Client(str(tmp / "store"), create=True)
    td.importers.lerobot(str(tmp / "ds"), client.project("p"), "robot", progress=False)
    return client.project("p").branch().table("robot"), written


def test_to_lerobot_gives_lerobots_keys_shapes_and_dtypes(table):
    t, written = table
    dt = {"observation.state": [-0.1, 0.0], "action": [i / 10 for i in range(4)],
          "observation.images.top": [0.0]}  # fmt: skip
    windows = tl.windows(t, dt)
    plan = td.Recipe(seed=0, batch_size=4, components=[td.Component(t, windows)]).plan()
    raw = next(iter(td.TrainLoader(plan, steps=1)))
    b = tl.to_lerobot(raw)
    keys = {k for k in b if not k.startswith("_")}
    assert keys == {
        "observation.state", "observation.state_is_pad", "action", "action_is_pad",
        "observation.images.top", "observation.images.top_is_pad", "observation.images.side",
        "timestamp", "frame_index", "episode_index", "index", "task_index", "task",
    }  # fmt: skip
    assert tuple(b["observation.state"].shape) == (4, 2, 6)
    assert tuple(b["action"].shape) == (4, 4, 6) and b["action_is_pad"].dtype == torch.bool
    top, side = b["observation.images.top"], b["observation.images.side"]
    assert top.dtype == side.dtype == torch.float32
    assert top.ndim == 5 and side.ndim == 4 and side.shape[1] == 3  # no T where LeRobot has none
    assert all(v.is_contiguous() for v in b.values() if isinstance(v, torch.Tensor))
    for k in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert tuple(b[k].shape) == (4,), k
    assert b["index"].tolist() == raw["_moment"].tolist()  # rows are LeRobot's frames in order
    assert isinstance(b["task"], list) and all(isinstance(s, str) for s in b["task"])
    # CHW float32 == uint8 / 255 exactly: the same frames read as uint8
    u8 = td.Windows({"observation_images_side": td.Video([0], layout="TCHW")})
    p8 = td.Recipe(seed=0, batch_size=4, components=[td.Component(t, u8)]).plan()
    q = next(iter(td.TrainLoader(p8, steps=1)))["observation_images_side"][:, 0]
    assert torch.equal(side, q.to(torch.float32) / 255)
    with pytest.raises(td.PlanError, match="no column 'observation_nope'"):
        tl.windows(t, {"observation.nope": [0]})


def test_episodes_take_lerobot_indices(table):
    t, _ = table
    comp = td.Component(t, tl.windows(t, {"action": [0.0]}), episodes=[2, 0])
    assert comp.episodes == ("episode_000000", "episode_000002")
    plan = td.Recipe(seed=0, batch_size=4, components=[comp]).plan()
    eps = {int(e) for b in td.TrainLoader(plan, steps=4) for e in tl.to_lerobot(b)["episode_index"]}
    assert eps <= {0, 2} and eps
    with pytest.raises(td.PlanError, match="LeRobot episode index"):
        td.Recipe(seed=0, batch_size=4, components=[td.Component(t, None, episodes=[7])]).plan()
    with pytest.raises(td.PlanError, match=">= 0"):
        td.Component(t, None, episodes=[-1])
    with pytest.raises(td.PlanError, match="names"):
        td.Component(t, None, episodes=[True])


def test_source_stats_are_lerobots_stats_json_under_its_names(tmp_path):
    import json

    src = tmp_path / "ds"
    make_lerobot_v3(src, lengths=(5, 4))
    shipped = {"observation.state": {"mean": [0.5] * 6, "std": [0.1] * 6, "count": [9]},
               "observation.images.top": {"mean": [[[0.2]], [[0.3]], [[0.4]]]}}  # fmt: skip
    (src / "meta" / "stats.json").write_text(json.dumps(shipped))
    client = td.Client(str(tmp_path / "store"), create=True)
    td.importers.lerobot(str(src), client.project("p"), "r", progress=False)
    got = tl.source_stats(client.project("p").branch().table("r"))
    assert set(got) == set(shipped)
    for f, fields in shipped.items():
        for k, v in fields.items():
            np.testing.assert_array_equal(got[f][k], np.asarray(v))


@pytest.mark.slow
def test_act_trains_bit_identically_on_treadle_and_lerobot():
    pytest.importorskip("lerobot")
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "lerobot_act.py"), "--steps", "20"],
        capture_output=True, text=True, timeout=900, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    assert '{"steps": 20, "identical": true, "anchors": 80}' in out.stdout
    rows = [ln.split() for ln in out.stdout.splitlines() if ln.strip()[:1].isdigit()]
    assert len(rows) == 20 and all(r[1] == r[2] for r in rows)


def test_dataset_stats_are_keyed_as_the_batch_to_lerobot_gives(table):
    """A LeRobot normaliser looks stats up by the batch's feature names and silently leaves
    a feature it finds none for unnormalised: plan.stats' column names
    (``observation_state``) never matched the batch's (``observation.state``)."""
    t, _ = table
    windows = tl.windows(t, {"observation.state": [-0.1, 0.0], "action": [0.0, 0.1]})
    plan = td.Recipe(seed=0, batch_size=4, components=[td.Component(t, windows)]).plan()
    stats = plan.stats(["observation_state", "action", "observation_images_top"])
    got = tl.dataset_stats(stats)
    batch = tl.to_lerobot(next(iter(td.TrainLoader(plan, steps=1))))
    assert set(got) == {"observation.state", "action", "observation.images.top"} <= set(batch)
    for col, feature in (("observation_state", "observation.state"), ("action", "action")):
        assert got[feature].keys() == stats[col].to_lerobot().keys()
        np.testing.assert_array_equal(got[feature]["q99"], stats[col].q99)
    assert got["observation.images.top"]["mean"].shape == (3, 1, 1)
    with pytest.raises(td.PlanError, match="by_component"):
        tl.dataset_stats(plan.stats(["action"], by_component=True))
