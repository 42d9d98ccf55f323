"""The ``transform=fn`` hook of the loaders: ``fn(batch, seeds) -> batch`` on the reader side.

``batch`` is the reader's batch (CPU ``torch.Tensor`` per tensor column, zero-copy views of
the decoded arrays where they are contiguous; lists for non-tensor columns; device tensors only when NVDEC decoded
straight to the GPU); ``seeds`` is ``uint64 [b]`` from
:func:`treadle.plan.seeds.sample_seeds` of the run seed and each sample's global position.
It runs in the prefetch thread (``workers=0``) or in each worker process (``workers>0``),
before the move to the device. What comes back must be a dict with the same batch length.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from treadle.errors import PlanError
from treadle.plan.seeds import sample_seeds
from treadle.torch.convert import to_torch

Transform = Callable[[dict[str, Any], np.ndarray], dict[str, Any]]


def check_transform(fn: Transform | None, workers: int) -> None:
    """Fail now, not in a worker: ``fn`` must be callable, and picklable when ``workers > 0``."""
    if fn is None:
        return
    if not callable(fn):
        raise PlanError(f"transform must be a callable fn(batch, seeds) -> batch, got {fn!r}")
    if workers:
        try:
            pickle.dumps(fn)
        except Exception as e:
            raise PlanError(
                f"transform {getattr(fn, '__qualname__', fn)!r} cannot be pickled for the "
                f"{workers} worker processes ({type(e).__name__}: {e}); define it at module "
                "level (not a lambda or closure), or use workers=0"
            ) from None


def run_transform(
    fn: Transform | None, batch: dict[str, Any], seed: int, positions: np.ndarray, where: str
) -> dict[str, Any]:
    """``fn(batch, seeds)`` checked: a dict whose tensors and lists keep the batch length."""
    batch = to_torch(batch)
    if fn is None:
        return batch
    b = len(positions)
    try:
        out = fn(batch, sample_seeds(seed, positions))
    except Exception as e:  # the user's own error, kept as it is: say which batch it hit
        e.add_note(f"in the transform at {where}")
        raise
    if not isinstance(out, dict):
        raise PlanError(f"transform at {where} returned {type(out).__name__}, not a dict batch")
    for k, v in out.items():
        n = len(v) if isinstance(v, (list, tuple, np.ndarray, torch.Tensor)) else None
        if n is not None and isinstance(v, (np.ndarray, torch.Tensor)) and v.ndim == 0:
            n = None
        if n != b:
            raise PlanError(
                f"transform at {where} changed the batch length of key {k!r}: "
                f"{b} samples in, {'no batch axis' if n is None else n} out"
            )
    return out


def transform_step(
    fn: Transform, seed: int, label: str, batch: dict[str, Any], samples: Any
) -> dict[str, Any]:
    """``fn`` on the batch of ``samples`` (a step's ``finish``, see :mod:`treadle.read.steps`)."""
    return run_transform(fn, batch, seed, samples.position, f"{label} {samples.step}")
