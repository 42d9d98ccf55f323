"""The torch side of the delivery steps (:mod:`treadle.read.steps`, whose ``read_steps``
the loader runs): a reader on the loader's device, and the transform hook as the steps'
``finish``."""

from __future__ import annotations

import functools
from typing import Any

from treadle.plan.plan import Plan
from treadle.read.sample_reader import SampleReader
from treadle.read.steps import Finish, Sampler, host_reader
from treadle.torch.hook import Transform, transform_step

__all__ = ["Sampler", "finish_for", "plan_reader"]


def plan_reader(
    plan: Plan,
    video_threads: int = 1,
    device: Any = None,
    read_ahead: int | None = None,
    chunks: Any = None,
) -> SampleReader:
    """A reader of ``plan``'s components. CUDA devices decode with NVDEC straight into
    device tensors when the hardware can (else a one-time warning and the CPU path)."""
    from treadle.gpu import select_backend

    return host_reader(plan, video_threads, select_backend(device), read_ahead, chunks=chunks)


def finish_for(plan: Plan, transform: Transform | None, label: str) -> Finish | None:
    """The steps' ``finish``: ``transform`` with its seeds, None without one (picklable)."""
    if transform is None:
        return None
    return functools.partial(transform_step, transform, plan.seed, label)
