"""``TrainLoader``: the plan's batches for this rank, as device tensors, resumable.

A thin adapter. Batches come from :class:`treadle.read.batch.BatchReader`; this module
only decides *where* that work runs and hands the result to torch:

- ``workers=0``: one background thread reads up to ``prefetch`` steps ahead into a
  bounded queue (I/O and decode overlap with the training step).
- With ``device="cuda"``, video is decoded by NVDEC straight into device tensors when
  the hardware can (``treadle.gpu.select_backend``), else on the CPU with a one-time
  warning; the same frames either way.
- ``workers=N``: a ``torch.utils.data.DataLoader`` with N *spawned* worker processes
  (these decode on the CPU)
  (Lance is not fork-safe); worker ``k`` reads steps ``start+k, start+k+N, ...`` and the
  DataLoader's round-robin returns them in step order. Use it when decode needs more
  than one core (PyAV decode does not run in parallel across Python threads).

Order is always the plan's order. ``state_dict()`` counts batches *delivered* to the
caller, never those prefetched, so a resumed loader continues with exactly the next
batch, at any world size that divides the batch size.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from treadle.errors import PlanError
from treadle.plan.plan import Plan
from treadle.plan.recipe import Recipe
from treadle.plan.record import RunRecord
from treadle.read.batch import BatchReader, output_columns
from treadle.read.prefetch import prefetch_steps
from treadle.torch.hook import Transform, as_torch, check_transform, run_transform

_STATE_KEYS = {"record", "step"}


def default_rank_world() -> tuple[int, int]:
    """(rank, world size) from torch.distributed, else RANK/WORLD_SIZE, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        raise PlanError("RANK and WORLD_SIZE must be integers") from None


def to_tensors(arrays: dict[str, Any], device: torch.device, pin: bool) -> dict[str, Any]:
    """numpy -> torch (zero copy), pinned and moved without blocking when the device is CUDA."""
    out = {}
    for k, v in arrays.items():
        if isinstance(v, list):  # strings, variable-length lists: Python lists of length b
            out[k] = v
            continue
        t = v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v))
        if t.device != device:  # video decoded by NVDEC is already there
            if pin and t.device.type == "cpu":
                t = t.pin_memory()
            t = t.to(device, non_blocking=True)
        out[k] = t
    return out


def _exit_without_finalizing(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: end the worker with ``os._exit`` once it is done.

    A loader closed early (``break``) stops its workers while multiprocessing's feeder
    thread may still be pickling a batch into shared memory inside torch's C++ code;
    Python's finalisation then kills that daemon thread, the unwinding hits C++ frames,
    and the worker dies with "terminate called without an active exception" (SIGABRT),
    which the parent reports as "DataLoader worker ... killed by signal: Aborted". By the
    time ``atexit`` handlers run, multiprocessing has flushed or abandoned its queues, so
    nothing is left to finalise that the parent could see.
    """
    del worker_id

    def leave() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(0)

    atexit.register(leave)


class _Steps(torch.utils.data.IterableDataset):
    """Worker side of ``workers>0``: reads steps ``start + k, start + k + N, ...``."""

    def __init__(self, record: str, root: str, options: dict, rank: int, world: int, start: int,
                 stop: int | None, video_threads: int, transform: Transform | None = None):  # fmt: skip
        self.record, self.root, self.options = record, root, options
        self.rank, self.world, self.start, self.stop = rank, world, start, stop
        self.video_threads, self.transform = video_threads, transform

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from treadle.catalog import Client

        info = torch.utils.data.get_worker_info()
        k, n = (info.id, info.num_workers) if info else (0, 1)
        plan = Plan.from_record(self.record, Client(self.root, self.options or None))
        reader = BatchReader(plan, video_threads=self.video_threads)
        step = self.start + k
        try:
            while self.stop is None or step < self.stop:
                batch = as_torch(reader.read(step, self.rank, self.world))
                if self.transform is not None:
                    positions = plan.batch(step, self.rank, self.world).position
                    batch = run_transform(
                        self.transform, batch, plan.seed, positions, f"step {step}"
                    )
                yield batch
                step += n
        finally:
            reader.close()


class TrainLoader:
    """Iterate device batches ``dict[str, torch.Tensor]`` of a recipe or plan for this rank.

    Every window column is stacked as ``[b, time, ...]`` (video ``uint8 [b, T, H, W, 3]``
    unless its spec's transform says otherwise), every other column as ``[b, ...]``, plus
    ``_component`` and ``_moment`` (int64 ``[b]``); ``b = batch_size / world_size``.

    ``steps`` bounds the run (None: forever). ``prefetch`` is how many steps are read
    ahead; ``workers`` > 0 reads in that many spawned processes; ``video_threads`` decode
    threads per reader (default: one per core, up to 4; 1 per worker process).
    ``transform``: ``fn(batch, seeds) -> batch`` on the reader side (:mod:`treadle.torch.hook`).
    """

    def __init__(
        self,
        recipe_or_plan: Recipe | Plan,
        *,
        device: str | torch.device = "cpu",
        rank: int | None = None,
        world_size: int | None = None,
        steps: int | None = None,
        prefetch: int = 2,
        workers: int = 0,
        video_threads: int | None = None,
        transform: Transform | None = None,
    ):
        if isinstance(recipe_or_plan, Recipe):
            plan = recipe_or_plan.plan()
        elif isinstance(recipe_or_plan, Plan):
            plan = recipe_or_plan
        else:
            raise PlanError(
                f"TrainLoader takes a td.Recipe or td.Plan, got {type(recipe_or_plan).__name__}"
            )
        d_rank, d_world = default_rank_world()
        self.rank = d_rank if rank is None else int(rank)
        self.world_size = d_world if world_size is None else int(world_size)
        plan.batch(0, self.rank, self.world_size)  # validates rank, world size, B % W
        if steps is not None and (int(steps) < 0):
            raise PlanError(f"steps must be >= 0, got {steps}")
        if prefetch < 1 or workers < 0:
            raise PlanError("prefetch must be >= 1 and workers >= 0")
        self.plan = plan
        self.steps = None if steps is None else int(steps)
        self.prefetch = int(prefetch)
        self.workers = int(workers)
        check_transform(transform, self.workers)
        self.transform = transform
        # PyAV decodes without the GIL: one decode thread per core (per worker process).
        if video_threads is None:
            video_threads = 1 if workers else min(4, os.cpu_count() or 1)
        if int(video_threads) < 1:
            raise PlanError(f"video_threads must be >= 1, got {video_threads}")
        self.video_threads = int(video_threads)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise PlanError("device='cuda' but CUDA is not available; use device='cpu'")
        self._columns = output_columns(plan)  # fail now on components that cannot stack
        self._next_step = 0

    # -- resume ------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """The next step this loader will deliver."""
        return self._next_step

    @property
    def run_id(self) -> str:
        return self.plan.run_id

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable ``{"record": <run record>, "step": <next step not yet delivered>}``."""
        return {"record": self.plan.record.to_dict(), "step": self._next_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly at ``state["step"]``; the state must come from this run."""
        record, step = _check_state(state)
        if record.run_id != self.plan.run_id:
            raise PlanError(
                f"loader state is from run {record.run_id}, this loader plans run "
                f"{self.plan.run_id} (seed, weights, windows, batch size or table versions "
                "differ); build the loader with TrainLoader.from_state(state, client) instead"
            )
        self._next_step = step

    @classmethod
    def from_state(cls, state: dict[str, Any], client: Any, **kwargs: Any) -> TrainLoader:
        """A loader for the run in ``state`` (its pinned versions), continuing at its step."""
        record, step = _check_state(state)
        loader = cls(Plan.from_record(record, client), **kwargs)
        loader._next_step = step
        return loader

    # -- iteration ---------------------------------------------------------------------
    def __len__(self) -> int:
        if self.steps is None:
            raise TypeError("TrainLoader without steps= has no length")
        return max(0, self.steps - self._next_step)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        source = self._processes() if self.workers else self._thread()
        pin = self.device.type == "cuda"
        for arrays in source:
            batch = to_tensors(arrays, self.device, pin)
            self._next_step += 1
            yield batch

    def _thread(self) -> Iterator[dict[str, Any]]:
        reader = BatchReader(self.plan, video_threads=self.video_threads, device=self.device)

        def read(step: int) -> dict[str, Any]:
            return self._transformed(reader.read(step, self.rank, self.world_size), step)

        return prefetch_steps(read, self._next_step, self.steps, self.prefetch, reader.close)

    def _transformed(self, batch: dict[str, Any], step: int) -> dict[str, Any]:
        if self.transform is None:
            return batch
        positions = self.plan.batch(step, self.rank, self.world_size).position
        return run_transform(self.transform, batch, self.plan.seed, positions, f"step {step}")

    def _processes(self) -> Iterator[dict[str, Any]]:
        client = self.plan.table(0).project.client
        ds = _Steps(
            self.plan.record.to_json(),
            client.root,
            client.storage_options,
            self.rank,
            self.world_size,
            self._next_step,
            self.steps,
            self.video_threads,
            self.transform,
        )
        dl = torch.utils.data.DataLoader(
            ds,
            batch_size=None,
            num_workers=self.workers,
            prefetch_factor=self.prefetch,
            multiprocessing_context="spawn",
            worker_init_fn=_exit_without_finalizing,
        )
        yield from dl


def _check_state(state: Any) -> tuple[RunRecord, int]:
    if not isinstance(state, dict) or set(state) != _STATE_KEYS:
        raise PlanError(f"loader state must be a dict with keys {sorted(_STATE_KEYS)}")
    step = state["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise PlanError(f"loader state step must be an integer >= 0, got {step!r}")
    return RunRecord.from_json(state["record"]), step
