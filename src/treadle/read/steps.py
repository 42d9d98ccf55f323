"""What every delivery path runs, in the loader's thread or in a worker process: exact
steps -> samples -> reader -> finish (the torch layer's transform hook, when there is one).

A loader says which samples step ``k`` holds for its rank (a *sampler*:
``sampler(plan, step, rank, world) -> samples`` with ``.step``, ``.component``, ``.moment``
and ``.position``); :func:`read_steps` hands the reader exactly the steps to deliver, in
order, so its read-ahead (:meth:`treadle.read.sample_reader.SampleReader.read_many`) reads only
those. Nothing here imports torch: worker processes run this module without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.plan.exclude import drawn_from
from treadle.plan.plan import Batch, Plan
from treadle.read.columns import output_columns
from treadle.read.sample_reader import SampleReader

if TYPE_CHECKING:
    from treadle.video.protocols import VideoBackend

Sampler = Callable[[Plan, int, int, int], Any]
Finish = Callable[[dict[str, Any], Any], dict[str, Any]]
"""``finish(batch, samples) -> batch``: what runs on each batch after the read."""


def train_samples(plan: Plan, step: int, rank: int, world: int) -> Batch:
    """The samples of ``step`` for ``rank``: the plan's batch."""
    return plan.batch(step, rank, world)


def eval_positions(
    step: int, batch_size: int, rank: int, world: int, total: int
) -> tuple[np.ndarray, np.ndarray]:
    """(positions, valid) rank ``rank`` reads at eval ``step``: always ``batch_size / world``
    of them. Positions past the last one (``>= total``) are padding: they wrap around to
    ``position % total`` (real samples, read again) and are ``valid == False``."""
    b = batch_size // world
    i = np.arange(step * b, (step + 1) * b, dtype=np.int64)
    pos = rank + world * i
    valid = pos < total
    if total > 0:
        pos = np.where(valid, pos, pos % total)
    return pos, valid


@dataclass(frozen=True)
class EvalSamples:
    """The samples of one eval step for one rank (one component, moments in table order)."""

    step: int
    component: np.ndarray
    moment: np.ndarray
    position: np.ndarray
    """Global positions (= eligible indices): the transform's seeds come from these."""
    valid: np.ndarray
    """bool: False for the padding that gives every rank the same batches (``_valid``)."""


def eval_samples(
    plan: Plan, step: int, rank: int, world: int, component: int = 0,
    batch_size: int | None = None,
) -> EvalSamples:  # fmt: skip
    """The moments of ``component`` rank ``rank`` reads at eval ``step`` (padded: see
    :func:`eval_positions`), ``batch_size`` a step (default the plan's). The other components
    of ``plan`` give only the batch's layout (masks, presence flags, zeros), as in training."""
    kept = drawn_from(plan)  # a derived run's: without its excluded episodes
    b = plan.batch_size if batch_size is None else batch_size
    pos, valid = eval_positions(step, b, rank, world, kept.eligible(component))
    moments = kept.eligible_moments(component, pos)
    return EvalSamples(step, np.full(len(pos), component, np.int64), moments, pos, valid)


def host_reader(
    plan: Plan, video_threads: int = 1, backend: VideoBackend | None = None,
    read_ahead: int | None = None, fixed_columns: bool = True, copy_objects: bool = True,
    resident_bytes: int | None = None, chunks: Any = None,
) -> SampleReader:  # fmt: skip
    """A reader of ``plan``'s components (``backend``: a :mod:`treadle.gpu` backend, None
    for CPU decode into host memory; ``read_ahead``, ``fixed_columns``, ``copy_objects``,
    ``resident_bytes``: :class:`SampleReader`'s)."""
    tables = [plan.table(c) for c in range(plan.num_components)]
    return SampleReader(tables, output_columns(plan), video_threads=video_threads,
                        backend=backend, read_ahead=read_ahead, fixed_columns=fixed_columns,
                        copy_objects=copy_objects, resident_bytes=resident_bytes,
                        chunks=chunks)  # fmt: skip


def read_steps(
    plan: Plan, sampler: Sampler, reader: SampleReader, steps: Iterable[int], rank: int,
    world: int, finish: Finish | None = None,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """The batches of exactly ``steps``, in order, each through ``finish`` if any."""
    samples = (sampler(plan, step, rank, world) for step in steps)
    for s, batch in reader.read_many(samples):
        valid = getattr(s, "valid", None)
        if valid is not None:  # eval steps: which samples are padding
            batch["_valid"] = np.asarray(valid, dtype=bool)
        yield batch if finish is None else finish(batch, s)
