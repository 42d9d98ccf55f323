"""The delivery loop both loaders share: exact steps -> samples -> reader -> transform ->
tensors, in a background thread or in spawned worker processes.

A loader says which samples step ``k`` holds for its rank (a *sampler*:
``sampler(plan, step, rank, world) -> samples`` with ``.step``, ``.component``, ``.moment``
and ``.position``); :func:`read_steps` hands the reader exactly the steps to deliver, in
order, so its read-ahead (:meth:`treadle.read.reader.SampleReader.read_many`) reads only
those. ``workers=0`` runs that on one thread up to ``prefetch`` steps ahead
(:func:`treadle.read.prefetch.prefetch`); ``workers=N`` runs it in N spawned processes,
worker ``k`` taking steps ``start+k, start+k+N, ...`` (the DataLoader's round-robin gives
them back in step order).
"""

from __future__ import annotations

import atexit
import itertools
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from treadle.errors import PlanError
from treadle.plan.plan import Plan
from treadle.read.columns import output_columns
from treadle.read.prefetch import prefetch
from treadle.read.reader import SampleReader
from treadle.torch.convert import to_torch
from treadle.torch.hook import Transform, check_transform, run_transform

Sampler = Callable[[Plan, int, int, int], Any]


def default_rank_world() -> tuple[int, int]:
    """(rank, world size) from torch.distributed, else RANK/WORLD_SIZE, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        raise PlanError("RANK and WORLD_SIZE must be integers") from None


def plan_reader(plan: Plan, video_threads: int = 1, device: Any = None) -> SampleReader:
    """A reader of ``plan``'s components. CUDA devices decode with NVDEC straight into
    device tensors when the hardware can (else a one-time warning and the CPU path)."""
    from treadle.gpu import select_backend

    tables = [plan.table(c) for c in range(plan.num_components)]
    backend = select_backend(device)
    return SampleReader(tables, output_columns(plan), video_threads=video_threads,
                        backend=backend)  # fmt: skip


def read_steps(
    plan: Plan, sampler: Sampler, reader: SampleReader, steps: Iterable[int], rank: int,
    world: int, transform: Transform | None, label: str,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """The batches of exactly ``steps``, in order, each through ``transform`` if any."""
    samples = (sampler(plan, step, rank, world) for step in steps)
    for s, batch in reader.read_many(samples):
        if transform is not None:
            where = f"{label} {s.step}"
            batch = run_transform(transform, batch, plan.seed, s.position, where)
        yield batch


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


class _Worker(torch.utils.data.IterableDataset):
    """Worker side of ``workers>0``: worker ``k`` of ``n`` reads ``start+k, start+k+n, ...``."""

    def __init__(self, record: str, root: str, options: dict, sampler: Sampler, label: str,
                 rank: int, world: int, start: int, stop: int | None, video_threads: int,
                 transform: Transform | None):  # fmt: skip
        self.args = (record, root, options, sampler, label, rank, world, start, stop)
        self.video_threads, self.transform = video_threads, transform

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from treadle.catalog import Client

        record, root, options, sampler, label, rank, world, start, stop = self.args
        info = torch.utils.data.get_worker_info()
        k, n = (info.id, info.num_workers) if info else (0, 1)
        plan = Plan.from_record(record, Client(root, options or None))
        reader = plan_reader(plan, self.video_threads)
        mine = itertools.count(start + k, n) if stop is None else range(start + k, stop, n)
        try:
            for batch in read_steps(plan, sampler, reader, mine, rank, world, self.transform,
                                    label):  # fmt: skip
                yield to_torch(batch)
        finally:
            reader.close()


class StepLoader:
    """What ``TrainLoader`` and ``EvalLoader`` share: options, resume step, iteration.

    Subclasses set :attr:`sampler` (a module-level function, so workers can rebuild it) and
    :attr:`label` (how errors name a step), and call :meth:`_setup`.
    """

    sampler: Sampler
    label = "step"
    plan: Plan
    steps: int | None

    def _setup(self, plan: Plan, device: str | torch.device, rank: int | None,
               world_size: int | None, prefetch: int, workers: int, video_threads: int | None,
               transform: Transform | None) -> None:  # fmt: skip
        d_rank, d_world = default_rank_world()
        self.rank = d_rank if rank is None else int(rank)
        self.world_size = d_world if world_size is None else int(world_size)
        plan.batch(0, self.rank, self.world_size)  # validates rank, world size, B % W
        if prefetch < 1 or workers < 0:
            raise PlanError("prefetch must be >= 1 and workers >= 0")
        check_transform(transform, workers)
        # PyAV decodes without the GIL: one decode thread per core (per worker process).
        if video_threads is None:
            video_threads = 1 if workers else min(4, os.cpu_count() or 1)
        if int(video_threads) < 1:
            raise PlanError(f"video_threads must be >= 1, got {video_threads}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise PlanError("device='cuda' but CUDA is not available; use device='cpu'")
        self.plan, self.transform = plan, transform
        self.prefetch, self.workers = int(prefetch), int(workers)
        self.video_threads = int(video_threads)
        self._next_step = 0

    @property
    def step(self) -> int:
        """The next step this loader will deliver."""
        return self._next_step

    def __len__(self) -> int:
        """Batches left to deliver."""
        if self.steps is None:
            raise TypeError(f"{type(self).__name__} without steps= has no length")
        return max(0, self.steps - self._next_step)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        source = self._processes() if self.workers else self._thread()
        pin = self.device.type == "cuda"
        for arrays in source:
            batch = to_torch(arrays, self.device, pin)
            self._next_step += 1
            yield batch

    def _steps(self) -> Iterable[int]:
        start = self._next_step
        return itertools.count(start) if self.steps is None else range(start, self.steps)

    def _thread(self) -> Iterator[dict[str, Any]]:
        reader = plan_reader(self.plan, self.video_threads, self.device)
        batches = read_steps(self.plan, self.sampler, reader, self._steps(), self.rank,
                             self.world_size, self.transform, self.label)  # fmt: skip
        return prefetch(batches, self.prefetch, close=reader.close)

    def _processes(self) -> Iterator[dict[str, Any]]:
        start, stop = self._next_step, self.steps
        workers = self.workers if stop is None else min(self.workers, stop - start)
        if workers < 1:
            return iter(())
        client = self.plan.table(0).project.client
        ds = _Worker(self.plan.record.to_json(), client.root, client.storage_options,
                     type(self).sampler, self.label, self.rank, self.world_size, start, stop,
                     self.video_threads, self.transform)  # fmt: skip
        return iter(
            torch.utils.data.DataLoader(
                ds,
                batch_size=None,
                num_workers=workers,
                prefetch_factor=self.prefetch,
                multiprocessing_context="spawn",
                worker_init_fn=_exit_without_finalizing,
            )
        )
