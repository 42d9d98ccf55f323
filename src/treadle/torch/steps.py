"""What every delivery path runs, in the loader's thread or in a worker process: exact
steps -> samples -> reader -> transform.

A loader says which samples step ``k`` holds for its rank (a *sampler*:
``sampler(plan, step, rank, world) -> samples`` with ``.step``, ``.component``, ``.moment``
and ``.position``); :func:`read_steps` hands the reader exactly the steps to deliver, in
order, so its read-ahead (:meth:`treadle.read.reader.SampleReader.read_many`) reads only
those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from treadle.plan.plan import Plan
from treadle.read.columns import output_columns
from treadle.read.reader import SampleReader
from treadle.torch.hook import Transform, run_transform

Sampler = Callable[[Plan, int, int, int], Any]


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
