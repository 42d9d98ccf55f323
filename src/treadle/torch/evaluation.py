"""``EvalLoader``: every eligible moment of one component exactly once, in table order.

Positions ``0 .. N-1`` are the component's eligible moments in table order
(:meth:`treadle.plan.plan.Plan.eligible_moments`, pure). Rank ``r`` of ``W`` takes positions
``r, r + W, r + 2W, ...`` in batches of ``batch_size / W`` (so step ``k`` of every rank
together covers positions ``k * batch_size .. (k + 1) * batch_size - 1``); a rank's last
batch may be short, and ranks may differ by one batch when ``N`` is not a multiple of
``batch_size``. Batches carry the same columns as ``TrainLoader``'s (the same reader), and
``_moment`` is the moment's row in the pinned table. ``state_dict()`` counts delivered
batches; ``from_state`` continues mid-pass at any world size dividing ``batch_size``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from treadle.errors import PlanError
from treadle.plan.plan import Plan
from treadle.plan.recipe import Component, Recipe
from treadle.plan.record import RunRecord
from treadle.read.batch import BatchReader
from treadle.read.prefetch import prefetch_steps
from treadle.torch.hook import Transform, as_torch, check_transform, run_transform
from treadle.torch.loader import default_rank_world, to_tensors

_STATE_KEYS = {"record", "step", "eval"}


def eval_positions(step: int, batch_size: int, rank: int, world: int, total: int) -> np.ndarray:
    """Global positions (= eligible indices) rank ``rank`` reads at ``step``."""
    b = batch_size // world
    i = np.arange(step * b, (step + 1) * b, dtype=np.int64)
    pos = rank + world * i
    return pos[pos < total]


def eval_steps(batch_size: int, rank: int, world: int, total: int) -> int:
    """Batches rank ``rank`` reads in one pass."""
    mine = max(0, -(-(total - rank) // world))
    return -(-mine // (batch_size // world))


class _Reader:
    """Reads the eval batch of one step (in the main process or a worker)."""

    def __init__(self, plan: Plan, rank: int, world: int, transform: Transform | None,
                 video_threads: int, device: Any = None):  # fmt: skip
        self.plan, self.rank, self.world, self.transform = plan, rank, world, transform
        self.total = plan.eligible(0)
        self.reader = BatchReader(plan, video_threads=video_threads, device=device)

    def read(self, step: int) -> dict[str, Any]:
        pos = eval_positions(step, self.plan.batch_size, self.rank, self.world, self.total)
        moments = self.plan.eligible_moments(0, pos)
        batch = self.reader.read_samples(np.zeros(len(pos), np.int64), moments)
        if self.transform is None:
            return batch
        return run_transform(self.transform, batch, self.plan.seed, pos, f"eval step {step}")

    def close(self) -> None:
        self.reader.close()


class _EvalSteps(torch.utils.data.IterableDataset):
    """Worker side of ``workers>0``: worker ``k`` of ``n`` reads steps ``start+k, start+k+n``."""

    def __init__(self, record: str, root: str, options: dict, rank: int, world: int, start: int,
                 stop: int, video_threads: int, transform: Transform | None):  # fmt: skip
        self.args = (record, root, options, rank, world, start, stop, video_threads, transform)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from treadle.catalog import Client

        record, root, options, rank, world, start, stop, threads, transform = self.args
        info = torch.utils.data.get_worker_info()
        k, n = (info.id, info.num_workers) if info else (0, 1)
        plan = Plan.from_record(record, Client(root, options or None))
        reader = _Reader(plan, rank, world, transform, threads)
        try:
            for step in range(start + k, stop, n):
                yield as_torch(reader.read(step))
        finally:
            reader.close()


class EvalLoader:
    """Iterate one pass over every eligible moment of ``component`` for this rank.

    ``batch_size`` is the global batch (``batch_size % world_size == 0``; each rank gets
    ``batch_size / world_size`` per step). ``transform``, ``workers``, ``prefetch`` and
    ``video_threads`` work as in ``TrainLoader``; ``seed`` only feeds the transform's seeds.
    """

    def __init__(
        self,
        component: Component | Plan,
        batch_size: int | None = None,
        *,
        device: str | torch.device = "cpu",
        rank: int | None = None,
        world_size: int | None = None,
        transform: Transform | None = None,
        workers: int = 0,
        prefetch: int = 2,
        video_threads: int | None = None,
        seed: int = 0,
    ):
        if isinstance(component, Plan):
            plan = component
        elif isinstance(component, Component):
            if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
                raise PlanError(f"EvalLoader batch_size must be an integer, got {batch_size!r}")
            plan = Recipe(seed=seed, batch_size=int(batch_size), components=[component]).plan()
        else:
            raise PlanError(f"EvalLoader takes a td.Component, got {type(component).__name__}")
        if plan.num_components != 1:
            raise PlanError(f"an eval plan has one component, this one has {plan.num_components}")
        d_rank, d_world = default_rank_world()
        self.rank = d_rank if rank is None else int(rank)
        self.world_size = d_world if world_size is None else int(world_size)
        plan.batch(0, self.rank, self.world_size)  # validates rank, world size, B % W
        if prefetch < 1 or workers < 0:
            raise PlanError("prefetch must be >= 1 and workers >= 0")
        if video_threads is None:
            video_threads = 1 if workers else min(4, os.cpu_count() or 1)
        if int(video_threads) < 1:
            raise PlanError(f"video_threads must be >= 1, got {video_threads}")
        check_transform(transform, workers)
        self.plan, self.transform = plan, transform
        self.workers, self.prefetch, self.video_threads = (
            int(workers),
            int(prefetch),
            int(video_threads),
        )
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise PlanError("device='cuda' but CUDA is not available; use device='cpu'")
        self.num_moments = plan.eligible(0)
        self.steps = eval_steps(plan.batch_size, self.rank, self.world_size, self.num_moments)
        self._next_step = 0

    @property
    def step(self) -> int:
        """The next step this loader will deliver."""
        return self._next_step

    def __len__(self) -> int:
        """Batches left in this pass for this rank."""
        return max(0, self.steps - self._next_step)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable ``{"record", "step", "eval": 1}``."""
        return {"record": self.plan.record.to_dict(), "step": self._next_step, "eval": 1}

    @classmethod
    def from_state(cls, state: dict[str, Any], client: Any, **kwargs: Any) -> EvalLoader:
        """An eval loader for the pass in ``state`` (its pinned versions), at its step."""
        if not isinstance(state, dict) or set(state) != _STATE_KEYS:
            raise PlanError(f"eval loader state must be a dict with keys {sorted(_STATE_KEYS)}")
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise PlanError(f"eval loader state step must be an integer >= 0, got {step!r}")
        record = RunRecord.from_json(state["record"])
        loader = cls(Plan.from_record(record, client), **kwargs)
        loader._next_step = step
        return loader

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        source = self._processes() if self.workers else self._thread()
        pin = self.device.type == "cuda"
        for arrays in source:
            batch = to_tensors(arrays, self.device, pin)
            self._next_step += 1
            yield batch

    def _thread(self) -> Iterator[dict[str, Any]]:
        reader = _Reader(self.plan, self.rank, self.world_size, self.transform,
                         self.video_threads, self.device)  # fmt: skip
        return prefetch_steps(reader.read, self._next_step, self.steps, self.prefetch, reader.close)

    def _processes(self) -> Iterator[dict[str, Any]]:
        if self._next_step >= self.steps:
            return iter(())
        client = self.plan.table(0).project.client
        ds = _EvalSteps(self.plan.record.to_json(), client.root, client.storage_options,
                        self.rank, self.world_size, self._next_step, self.steps,
                        self.video_threads, self.transform)  # fmt: skip
        return iter(
            torch.utils.data.DataLoader(
                ds,
                batch_size=None,
                num_workers=min(self.workers, self.steps - self._next_step),
                prefetch_factor=self.prefetch,
                multiprocessing_context="spawn",
            )
        )
