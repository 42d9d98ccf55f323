"""What every delivery path runs, in the loader's thread or in a worker process: exact
steps -> samples -> reader -> finish (the torch layer's transform hook, when there is one).

A loader says which samples step ``k`` holds for its rank (a *sampler*:
``sampler(plan, step, rank, world) -> samples`` with ``.step``, ``.component``, ``.moment``
and ``.position``); :func:`read_steps` hands the reader exactly the steps to deliver, in
order, so its read-ahead (:meth:`treadle.read.sample_reader.SampleReader.read_many`) reads only
those. Nothing here imports torch: worker processes run this module without it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields, is_dataclass, replace
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


class StepSamples:
    """A bounded memo of one rank's ``sampler(plan, step, rank, world)``, for a loader whose
    lookahead stage and reader both ask for every step's samples (planning is pure, so each
    step's are computed once rather than by each of them).

    :meth:`ahead` (the stage) computes a step's samples and keeps them, their arrays read-only,
    the oldest dropped past ``keep`` steps; with :func:`train_samples`, it computes the next
    ``together`` steps (short of ``stop``) at once (:meth:`Plan.batches`: about the cost of
    one). :meth:`take` (the reader, as a sampler) hands a step's out once, as writable copies
    (they become the batch's ``_moment``, ``_component``), and forgets them. Thread-safe."""

    def __init__(self, sampler: Sampler, plan: Plan, rank: int, world: int, keep: int = 256,
                 together: int = 8, stop: int | None = None) -> None:  # fmt: skip
        self.sampler, self.plan, self.rank, self.world = sampler, plan, rank, world
        self.keep, self.together, self.stop = max(1, int(keep)), max(1, int(together)), stop
        self._kept: OrderedDict[int, Any] = OrderedDict()
        self._lock = threading.Lock()

    def ahead(self, step: int) -> Any:
        """The samples of ``step`` (arrays read-only), kept for :meth:`take`."""
        with self._lock:
            got = self._kept.get(step)
            if got is not None:
                return got
            end = step + self.together
            if self.stop is not None:
                end = min(end, self.stop)
            todo = [s for s in range(step + 1, end) if s not in self._kept]
        if self.sampler is train_samples:  # the steps after it too, in one pass
            computed = self.plan.batches([step, *todo], self.rank, self.world)
        else:
            todo, computed = [], [self.sampler(self.plan, step, self.rank, self.world)]
        if not is_dataclass(computed[0]):  # arrays it cannot copy: the reader asks again
            return computed[0]
        computed = [_read_only(c) for c in computed]
        with self._lock:
            self._kept.update(zip([step, *todo], computed))
            while len(self._kept) > self.keep:
                self._kept.popitem(last=False)
        return computed[0]

    def take(self, plan: Plan, step: int, rank: int, world: int) -> Any:
        """A sampler: the samples of ``step`` (kept ones forgotten: the reader asks once)."""
        if plan is not self.plan or (rank, world) != (self.rank, self.world):
            return self.sampler(plan, step, rank, world)
        with self._lock:
            got = self._kept.pop(step, None)
        if got is None:
            return self.sampler(plan, step, rank, world)
        return _copied(got)


def _arrays(samples: Any) -> dict[str, np.ndarray]:
    return {
        f.name: a for f in fields(samples) if isinstance(a := getattr(samples, f.name), np.ndarray)
    }


def _read_only(samples: Any) -> Any:
    """``samples`` (a dataclass) with read-only views of its arrays."""
    out = {}
    for name, a in _arrays(samples).items():
        view = a.view()
        view.flags.writeable = False
        out[name] = view
    return replace(samples, **out)


def _copied(samples: Any) -> Any:
    """``samples`` with writable copies of its arrays."""
    return replace(samples, **{name: a.copy() for name, a in _arrays(samples).items()})


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
