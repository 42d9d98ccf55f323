"""After import, one Recipe mixes an imported WebDataset table and an imported LeRobot table
and trains in one TrainLoader run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from importer_fixtures import make_lerobot_v3
from treadle.catalog import Client
from treadle.importers import lerobot as import_lerobot
from treadle.importers import webdataset as import_wds
from treadle.plan.recipe import Component, Recipe
from treadle.plan.windows import Rows, Video, Windows
from treadle.torch.loader import TrainLoader

pytest.importorskip("webdataset")


def _wds_with_actions(folder, n=48, seed=3):
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with wds.TarWriter(str(folder / "actions-000000.tar")) as w:
        for i in range(n):
            w.write({"__key__": f"a{i:04d}", "npy": rng.random(6).astype(np.float32), "cls": i % 3})
    return str(folder / "actions-000000.tar")


def test_recipe_over_imported_webdataset_and_lerobot_trains(tmp_path, local_root):
    client = Client(local_root)
    project = client.project("robots")
    shard = _wds_with_actions(tmp_path / "wds")
    import_wds(shard, project, "grasps_wds", rename={"npy": "action"}, progress=False)
    make_lerobot_v3(tmp_path / "lr", lengths=(12, 9, 15))
    import_lerobot(str(tmp_path / "lr"), project, "grasps_lerobot", progress=False)

    main = project.branch("main")
    windows = Windows({"action": Rows(range(1))})
    recipe = Recipe(
        seed=7,
        batch_size=8,
        components=[
            Component(main.table("grasps_wds"), windows, weight=0.5),
            Component(main.table("grasps_lerobot"), windows, weight=0.5),
        ],
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = set()
    losses = []
    for batch in TrainLoader(recipe, device="cpu", steps=12):
        x = batch["action"].reshape(batch["action"].shape[0], -1).float()
        assert x.shape == (8, 6)
        seen.update(batch["_component"].tolist())
        assert (batch["_component"] == 0).sum() == 4  # exact per-batch shares (0.5 * 8)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert seen == {0, 1}
    assert len(losses) == 12 and np.mean(losses[-3:]) < np.mean(losses[:3])


def test_imported_lerobot_video_windows_load(tmp_path, local_root):
    client = Client(local_root)
    project = client.project("robots")
    make_lerobot_v3(tmp_path / "lr", lengths=(12, 9))
    import_lerobot(str(tmp_path / "lr"), project, "cams", progress=False)
    windows = Windows({"observation_images_top": Video(range(4)), "action": Rows(range(4))})
    recipe = Recipe(
        seed=1, batch_size=4, components=[Component(project.branch("main").table("cams"), windows)]
    )
    batches = list(TrainLoader(recipe, device="cpu", steps=2))
    assert len(batches) == 2
    v = batches[0]["observation_images_top"]
    assert tuple(v.shape) == (4, 4, 32, 32, 3) and v.dtype == torch.uint8
    assert tuple(batches[0]["action"].shape)[:2] == (4, 4)
    assert v.float().std() > 1.0  # real pixels, not zeros
