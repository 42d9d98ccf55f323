"""PyTorch Lightning on treadle batches, resumable mid-epoch with ``ckpt_path=``.

    python examples/lightning_train.py --root R --out D [--devices 2] [--kill-at 6] [--resume]

:class:`TreadleData` is a ``LightningDataModule`` whose train loader is a ``td.TrainLoader``
(no epochs: ``max_steps`` bounds the run), handed to Lightning as a plain iterable
(:class:`Batches`). The module's ``state_dict`` is the loader's, at the number of batches
trained (``trainer.global_step``), not the number the loader handed out (Lightning fetches
one batch ahead), and Lightning stores it in every checkpoint; on ``fit(...,
ckpt_path=...)`` Lightning calls ``load_state_dict`` before it asks for the loader, so the
loader continues with the batch after the last one trained. ``--devices 2`` runs DDP on CPU
(gloo); each rank reads its own share (rank and world size from the trainer).
``--kill-at K`` ends the process (``os._exit``, no clean-up) after training batch ``K``;
``--resume`` continues from the newest checkpoint in ``D``. Each rank appends the moments of
every batch it trains to ``D/rank<k>.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _torchvision_op_schemas() -> None:
    """Lightning imports torchvision when it is installed; a PyPI torchvision whose compiled
    ops do not match this torch build imports once these two schemas exist."""
    try:
        torch.ops.torchvision.nms  # noqa: B018
    except (AttributeError, RuntimeError):
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _torchvision_op_schemas.lib = lib  # type: ignore[attr-defined]  # kept alive


_torchvision_op_schemas()
import lightning as L  # noqa: E402

import treadle as td  # noqa: E402

BATCH, STEPS, EVERY = 8, 10, 4


def make_data(root: str) -> None:
    client = td.Client(root, create=True)
    if "pl" in client.projects():
        return
    rng = np.random.default_rng(2)
    with client.project("pl").branch().transaction("lightning example data") as tx:
        for e, n in enumerate((21, 30, 16)):
            x = rng.standard_normal((n, 3)).astype(np.float32)
            tx.table("arm").append_episode({"x": x, "y": x[:, :1] * 2}, episode=f"e{e}")


class Batches:
    """The loader's batches, without its ``state_dict``: Lightning saves the state of a loader
    that has one as it stands when the checkpoint is written, one batch past the last one
    trained (it fetches ahead), and restores it over the data module's on resume."""

    def __init__(self, loader: td.TrainLoader):
        self.loader = loader

    def __iter__(self) -> Any:
        return iter(self.loader)


class TreadleData(L.LightningDataModule):
    """A TrainLoader as Lightning's train loader; its position in Lightning's checkpoints."""

    def __init__(self, root: str):
        super().__init__()
        self.root = root
        self.loader: td.TrainLoader | None = None
        self._resume: dict[str, Any] | None = None

    def train_dataloader(self) -> Batches:
        arm = td.Client(self.root).project("pl").branch().table("arm")
        windows = td.Windows({"x": td.Rows([0]), "y": td.Rows([0])})
        plan = td.Recipe(seed=5, batch_size=BATCH, components=[td.Component(arm, windows)]).plan()
        # no steps=: the run is max_steps long, and Lightning needs no len() mid-epoch
        self.loader = td.TrainLoader(plan, rank=self.trainer.global_rank,
                                     world_size=self.trainer.world_size)  # fmt: skip
        if self._resume is not None:
            self.loader.load_state_dict(self._resume)
        return Batches(self.loader)

    def state_dict(self) -> dict[str, Any]:
        if self.loader is None:
            return {}
        state = self.loader.state_dict()
        state["step"] = self.trainer.global_step  # trained, not fetched ahead
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = state or None


class Model(L.LightningModule):
    def __init__(self, out: str, kill_at: int | None):
        super().__init__()
        self.net = torch.nn.Linear(3, 1)
        self.out, self.kill_at = out, kill_at

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = ((self.net(batch["x"][:, 0]) - batch["y"][:, 0]) ** 2).mean()
        record = {"step": self.global_step, "moments": batch["_moment"].tolist()}
        with open(os.path.join(self.out, f"rank{self.global_rank}.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.kill_at is not None and self.global_step >= self.kill_at:
            os._exit(3)  # killed mid-epoch: whatever came after the last checkpoint is lost

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Lightning on treadle batches")
    ap.add_argument("--root", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--kill-at", type=int)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    make_data(args.root)  # every rank: made once, before Lightning starts the other ranks
    ckpt = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=os.path.join(args.out, "ckpt"), every_n_train_steps=EVERY, save_top_k=-1
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices, max_steps=STEPS, callbacks=[ckpt],
        strategy="ddp" if args.devices > 1 else "auto", logger=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    path = None
    if args.resume:
        found = sorted(Path(args.out, "ckpt").glob("*.ckpt"), key=os.path.getmtime)
        path = str(found[-1])
    torch.manual_seed(0)
    trainer.fit(Model(args.out, args.kill_at), datamodule=TreadleData(args.root), ckpt_path=path)


if __name__ == "__main__":
    main()
