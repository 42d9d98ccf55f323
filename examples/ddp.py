"""DDP with torchrun: TrainLoader batches per rank, then an EvalLoader pass whose per-batch
``all_reduce`` never hangs and equals the single-process metric.

    torchrun --nproc_per_node 2 examples/ddp.py --root /tmp/ddp-store --out result.json
    python examples/ddp.py --root /tmp/ddp-store --out single.json     # one process

Each rank builds the same plan; ``td.TrainLoader(plan)`` takes rank and world size from
``torch.distributed`` (``RANK``/``WORLD_SIZE`` before it is initialised), so together the
ranks read each step's global batch, each its own share. ``td.EvalLoader`` gives every rank
the same number of batches (the last ones padded, ``batch["_valid"]`` False for padding), so
a collective per batch is safe. The metric is summed in fixed point (integers), so its value
does not depend on how many ranks added it up.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import treadle as td

BATCH, STEPS, SCALE = 8, 6, 2**24


def make_data(root: str) -> None:
    """A table of 3 episodes of (observation, action) rows, made once."""
    client = td.Client(root, create=True)
    if "ddp" in client.projects():
        return
    branch = client.project("ddp").branch()
    rng = np.random.default_rng(0)
    with branch.transaction("ddp example data") as tx:
        for e, n in enumerate((23, 19, 31)):
            obs = rng.standard_normal((n, 4)).astype(np.float32)
            tx.table("arm").append_episode(
                {"obs": obs, "action": (obs @ np.ones((4, 2), np.float32)).astype(np.float32)},
                episode=f"ep{e}",
            )


def components(root: str) -> td.Component:
    arm = td.Client(root).project("ddp").branch().table("arm")
    return td.Component(arm, td.Windows({"obs": td.Rows([0]), "action": td.Rows([0])}))


def evaluate(model: torch.nn.Module, comp: td.Component) -> tuple[int, float]:
    """(valid samples, mean squared error) over one EvalLoader pass, reduced per batch."""
    total = torch.zeros(2, dtype=torch.int64)
    batches = 0
    with torch.no_grad():
        for batch in td.EvalLoader(comp, BATCH):
            err = ((model(batch["obs"][:, 0]) - batch["action"][:, 0]) ** 2).mean(dim=1)
            valid = batch["_valid"]
            fixed = torch.round(err[valid].double() * SCALE).to(torch.int64).sum()
            part = torch.stack([valid.sum().to(torch.int64), fixed])
            if dist.is_initialized():
                dist.all_reduce(part)  # one collective per batch: every rank has as many
            total += part
            batches += 1
    return int(total[0]), float(total[1]) / SCALE / int(total[0])


def train(model: torch.nn.Module, root: str) -> list[list[int]]:
    """STEPS steps of DDP training; each step's global batch (moments, all ranks)."""
    ddp = torch.nn.parallel.DistributedDataParallel(model) if dist.is_initialized() else model
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    plan = td.Recipe(seed=3, batch_size=BATCH, components=[components(root)]).plan()
    seen = []
    for batch in td.TrainLoader(plan, steps=STEPS):  # rank, world size: torch.distributed's
        loss = ((ddp(batch["obs"][:, 0]) - batch["action"][:, 0]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        moments = batch["_moment"]
        if dist.is_initialized():
            parts = [torch.empty_like(moments) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, moments)
            moments = torch.cat(parts)
        seen.append(sorted(moments.tolist()))
    return seen


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description="DDP on treadle batches (gloo, CPU)")
    ap.add_argument("--root", required=True)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        make_data(args.root)
    if dist.is_initialized():
        dist.barrier()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    comp = components(args.root)
    n, before = evaluate(model, comp)  # the same weights on every rank and in one process
    seen = train(model, args.root)
    plan = td.Recipe(seed=3, batch_size=BATCH, components=[comp]).plan()
    want = [sorted(plan.batch(s).moment.tolist()) for s in range(STEPS)]
    assert seen == want, "the ranks' batches are not the plan's global batches"
    result = {"world": dist.get_world_size() if dist.is_initialized() else 1,
              "eval_samples": n, "eval_mse": before, "batches": seen}  # fmt: skip
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)
    if dist.is_initialized():
        dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
