"""LeRobot's ACT policy trained on treadle batches, bit-identical to LeRobot's own DataLoader.

1. Writes a small LeRobot v3.0 dataset with LeRobot's own writer (``LeRobotDataset.create``,
   ``add_frame``, ``save_episode``; H.264, so the import copies the packets).
2. Imports it (``td.importers.lerobot``): one table, the dataset's stats.json kept.
3. Trains a tiny ACT (``pretrained_backbone_weights=None``, CPU) for ``--steps`` steps on
   treadle: ``tl.windows`` + ``td.TrainLoader`` + ``tl.to_lerobot``, stats from
   ``tl.source_stats(table)``.
4. Trains the same ACT from the same initial weights on ``LeRobotDataset`` + ``DataLoader``
   for exactly the anchors treadle's plan drew (``batch["_moment"]`` is LeRobot's ``index``),
   stats from ``dataset.meta.stats``.
5. Asserts every input tensor and every loss of every step is bit-identical; prints the
   losses side by side.

Run: ``python examples/lerobot_act.py [--steps 20] [--out DIR]``. Needs LeRobot 0.4.x with
torchcodec (and FFmpeg's shared libraries), diffusers (< 0.36) and pyserial.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

import treadle as td
from treadle import lerobot as tl

FPS, SIZE, DIM, CHUNK, BATCH = 10, 16, 4, 5, 4
LENGTHS = (14, 11, 17)
CAM = "observation.images.top"


def define_torchvision_ops() -> None:
    """torchvision's compiled ops do not load on a CPU torch build it was not made for; its
    Python part (all LeRobot uses) imports once these two operator schemas exist."""
    try:
        torch.ops.torchvision.nms  # noqa: B018
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    define_torchvision_ops.lib = lib  # type: ignore[attr-defined]  # kept alive


def write_lerobot_dataset(root: Path) -> None:
    """Three episodes of a moving pattern with LeRobot's own writer (v3.0, H.264)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        CAM: {"dtype": "video", "shape": (SIZE, SIZE, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (DIM,), "names": None},
        "action": {"dtype": "float32", "shape": (DIM,), "names": None},
    }
    ds = LeRobotDataset.create("local/act", FPS, features, root=root, vcodec="h264",
                               image_writer_threads=0)  # fmt: skip
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    for e, n in enumerate(LENGTHS):
        for i in range(n):
            img = np.stack([(xx * 16 + i * 5) % 256, (yy * 16 + e * 40) % 256,
                            (xx + yy + i * 3) % 256], axis=-1).astype(np.uint8)  # fmt: skip
            ds.add_frame({
                CAM: img,
                "observation.state": rng.standard_normal(DIM).astype(np.float32),
                "action": rng.standard_normal(DIM).astype(np.float32),
                "task": ["pick the cube", "place the cube"][e % 2],
            })  # fmt: skip
        ds.save_episode()
    ds.finalize()


def make_policy(stats: dict[str, dict[str, Any]]) -> tuple[Any, Any]:
    """A tiny ACT and its pre-processor, the same initial weights every call."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.act.processor_act import make_act_pre_post_processors

    config = ACTConfig(
        input_features={
            "observation.state": PolicyFeature(FeatureType.STATE, (DIM,)),
            CAM: PolicyFeature(FeatureType.VISUAL, (3, SIZE, SIZE)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (DIM,))},
        chunk_size=CHUNK, n_action_steps=CHUNK, dim_model=16, n_heads=2, dim_feedforward=32,
        n_encoder_layers=1, n_decoder_layers=1, latent_dim=4, n_vae_encoder_layers=1,
        pretrained_backbone_weights=None, device="cpu",
    )  # fmt: skip
    torch.manual_seed(0)
    policy = ACTPolicy(config)
    pre, _post = make_act_pre_post_processors(config, dataset_stats=stats)
    return policy, pre


def train(
    batches: Any, stats: dict[str, Any], steps: int, backbone: bool = False
) -> tuple[list[float], list[dict]]:
    """``steps`` steps of ACT on ``batches`` (LeRobot batches); the losses and inputs.

    ``backbone=False`` freezes the ResNet-18 (its 11M weights' backward and AdamW step are
    most of a CPU step); its features of the images still feed every loss."""
    policy, pre = make_policy(stats)
    policy.train()
    if not backbone:
        policy.model.backbone.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    losses, inputs = [], []
    for step, batch in zip(range(steps), batches):
        inputs.append({k: v.clone() if isinstance(v, torch.Tensor) else v
                       for k, v in batch.items()})  # fmt: skip
        torch.manual_seed(1000 + step)  # the VAE's and dropout's draws: the same per step
        loss, _ = policy.forward(pre(batch))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, inputs


def treadle_batches(table: Any, steps: int) -> Any:
    """treadle's batches as LeRobot's, ACT's windows: an action chunk, the current frame."""
    windows = tl.windows(table, {"action": [i / FPS for i in range(CHUNK)]})
    plan = td.Recipe(seed=7, batch_size=BATCH, components=[td.Component(table, windows)]).plan()
    for batch in td.TrainLoader(plan, steps=steps):
        yield tl.to_lerobot(batch)


def lerobot_batches(root: Path, anchors: list[int]) -> Any:
    """LeRobot's own DataLoader at ``anchors`` (dataset indices), in that order."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/act", root=root, video_backend="torchcodec",
                        delta_timestamps={"action": [i / FPS for i in range(CHUNK)]})  # fmt: skip
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(ds, anchors), batch_size=BATCH, shuffle=False, num_workers=0
    )
    return ds, iter(loader)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and a.is_contiguous() == b.is_contiguous() and torch.equal(a, b))  # fmt: skip
    return a == b


def check_stats(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """tl.source_stats is LeRobot's own stats.json, feature by feature; as tensors."""
    assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
    for f in theirs:
        for k, v in theirs[f].items():
            assert np.array_equal(np.asarray(ours[f][k]), np.asarray(v)), (f, k)
    return {f: {k: torch.as_tensor(np.asarray(v)) for k, v in d.items()} for f, d in ours.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", help="working folder (default: a temporary one)")
    ap.add_argument("--train-backbone", action="store_true", help="train the ResNet too")
    args = ap.parse_args(argv)
    define_torchvision_ops()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.out or tmp)
        write_lerobot_dataset(work / "lerobot")
        client = td.Client(str(work / "store"), create=True)
        result = td.importers.lerobot(str(work / "lerobot"), client.project("robot"), "act",
                                      progress=False)  # fmt: skip
        assert {v["video"] for v in result.videos} == {"copied"}, result.videos
        table = client.project("robot").branch().table("act")
        ours = list(treadle_batches(table, args.steps))
        anchors = [int(m) for b in ours for m in b["_moment"]]
        ds, theirs = lerobot_batches(work / "lerobot", anchors)
        stats = check_stats(tl.source_stats(table), ds.meta.stats)
        theirs = [next(theirs) for _ in ours]
        for step, (a, b) in enumerate(zip(ours, theirs)):
            assert set(k for k in a if not k.startswith("_")) == set(b), (sorted(a), sorted(b))
            bad = [k for k in b if not same(a[k], b[k])]
            assert not bad, f"step {step}: {bad} differ from LeRobot's batch"
        t_losses = train(iter(ours), stats, args.steps, args.train_backbone)[0]
        l_losses = train(iter(theirs), stats, args.steps, args.train_backbone)[0]
    print(f"{'step':>4}  {'LeRobot DataLoader':>20}  {'treadle':>20}")
    for s, (lv, tv) in enumerate(zip(l_losses, t_losses)):
        print(f"{s:>4}  {lv:>20.10f}  {tv:>20.10f}{'' if lv == tv else '  DIFFER'}")
    assert len(t_losses) == args.steps and all(math.isfinite(x) for x in t_losses)
    assert t_losses == l_losses, "losses differ"
    print(json.dumps({"steps": args.steps, "identical": True, "anchors": len(anchors)}))
    return {"treadle": t_losses, "lerobot": l_losses, "anchors": anchors}


if __name__ == "__main__":
    main(sys.argv[1:])
