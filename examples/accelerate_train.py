"""Hugging Face Accelerate on treadle batches.

    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_train.py --root R --out D
    python examples/accelerate_train.py --root R --out D                   # one process

On a machine without GPUs ``--multi_gpu`` starts the processes (torchrun) and
``Accelerator(cpu=True)`` makes them one CPU (gloo) group. ``accelerator.prepare(model, optimizer)`` wraps the model (DDP) and the optimizer; the
loader is a ``td.TrainLoader`` that takes its rank and world size from Accelerate's state
(``accelerator.process_index`` / ``num_processes``). Do not pass the loader to ``prepare``:
it is not a torch ``DataLoader``, so Accelerate would hand it back untouched (nothing is
re-sharded, each process already reads only its share), and :func:`check_not_prepared`
says so if it is. Each process writes the moments of its batches to ``D/rank<k>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

import treadle as td

BATCH, STEPS = 8, 5


def make_data(root: str) -> None:
    client = td.Client(root, create=True)
    if "acc" in client.projects():
        return
    rng = np.random.default_rng(1)
    branch = client.project("acc").branch()
    with branch.transaction("accelerate example data") as tx:
        for e, n in enumerate((17, 25)):
            x = rng.standard_normal((n, 3)).astype(np.float32)
            tx.table("arm").append_episode({"x": x, "y": x.sum(1, keepdims=True)}, episode=f"e{e}")


def check_not_prepared(accelerator: Any, loader: td.TrainLoader) -> None:
    """Passing a TrainLoader to ``prepare`` changes nothing: say so rather than let users
    believe Accelerate re-shards it (or think they must)."""
    if accelerator.prepare(loader) is not loader:
        raise RuntimeError("accelerate wrapped the TrainLoader: its batches would be re-sharded")
    accelerator.print(
        "note: accelerator.prepare(TrainLoader) returns it unchanged; the loader already reads "
        f"this process's share (rank {loader.rank} of {loader.world_size})"
    )


def main(argv: list[str] | None = None) -> None:
    from accelerate import Accelerator

    ap = argparse.ArgumentParser(description="Accelerate on treadle batches")
    ap.add_argument("--root", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    accelerator = Accelerator(cpu=True)
    if accelerator.is_main_process:
        make_data(args.root)
    accelerator.wait_for_everyone()
    arm = td.Client(args.root).project("acc").branch().table("arm")
    windows = td.Windows({"x": td.Rows([0, 1]), "y": td.Rows([1])})
    plan = td.Recipe(seed=11, batch_size=BATCH, components=[td.Component(arm, windows)]).plan()
    loader = td.TrainLoader(plan, steps=STEPS, rank=accelerator.process_index,
                            world_size=accelerator.num_processes)  # fmt: skip
    check_not_prepared(accelerator, loader)
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1)
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    seen = []
    for batch in loader:
        loss = ((model(batch["x"].flatten(1)) - batch["y"][:, 0]) ** 2).mean()
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        seen.append(batch["_moment"].tolist())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rank = accelerator.process_index
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"world": accelerator.num_processes, "rank": rank, "batches": seen}, f)
    accelerator.end_training()


if __name__ == "__main__":
    main()
