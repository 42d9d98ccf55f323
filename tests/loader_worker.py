"""Subprocess bodies for the loader tests (crash/restart and torch.distributed ranks)."""

from __future__ import annotations

import json
import os
import sys

import torch

import treadle as td
from loader_helpers import batch_hash, emit, sample_hashes
from treadle import transforms as tf

AUGMENT = tf.Augment("cam", [tf.RandomResizedCrop((24, 24)), tf.HorizontalFlip(),
                             tf.BrightnessContrast()])  # fmt: skip


def train(
    root: str, record_path: str, steps: int, every: int, out: str, augment: bool = False
) -> None:
    """Read ``steps`` batches, checkpointing every ``every`` steps; resume from the latest row
    (``augment``: with the seeded augmentations of ``AUGMENT``)."""
    transform = AUGMENT if augment else None
    client = td.Client(root)
    branch = client.project("robotics").branch()
    ckpts = td.Checkpoints(branch)
    with open(record_path) as f:
        record = json.load(f)
    row = ckpts.latest(run_id=td.RunRecord.from_json(record).run_id)
    if row is not None:
        loader = td.TrainLoader.from_state(
            row.loader_state, client, steps=steps, transform=transform
        )
        weight = row.model_state()["w"]
    else:
        loader = td.TrainLoader(
            td.Plan.from_record(record, client), steps=steps, transform=transform
        )
        weight = torch.zeros(1)
    for batch in loader:
        step = loader.step - 1
        weight = weight + batch["action"].float().mean()
        emit(out, {"step": step, "hash": batch_hash(batch)})
        if loader.step % every == 0:
            ckpts.save(loader.step, {"w": weight}, loader)


def ranks(root: str, record_path: str, start: int, stop: int, out: str) -> None:
    """One torch.distributed rank: write every sample's (slot, component, moment, hash)."""
    torch.distributed.init_process_group("gloo")
    client = td.Client(root)
    with open(record_path) as f:
        record = json.load(f)
    state = {"record": record, "step": start}
    loader = td.TrainLoader.from_state(state, client, steps=stop)
    rank, world = loader.rank, loader.world_size
    for batch in loader:
        step = loader.step - 1
        emit(
            out,
            {
                "step": step,
                "rank": rank,
                "world": world,
                "component": batch["_component"].tolist(),
                "moment": batch["_moment"].tolist(),
                "hash": sample_hashes(batch),
            },
        )
    if rank == 0:
        with open(out + ".state", "w") as f:
            json.dump(loader.state_dict(), f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    cmd, *args = sys.argv[1:]
    if cmd == "train":
        train(args[0], args[1], int(args[2]), int(args[3]), args[4], args[5:] == ["augment"])
    elif cmd == "ranks":
        ranks(args[0], args[1], int(args[2]), int(args[3]), args[4])
