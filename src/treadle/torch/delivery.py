"""The delivery loop both loaders share: exact steps -> samples -> reader -> transform ->
tensors (:mod:`treadle.torch.device_steps`), in a background thread or in worker processes.

``workers=0`` runs it on one thread up to ``prefetch`` steps ahead
(:func:`treadle.read.prefetch.prefetch`); ``workers=N`` runs it in N worker processes
(:mod:`treadle.workers.processes`), worker ``k`` taking steps ``start+k, start+k+N, ...``,
their batches handed over through shared-memory slots and taken back in step order.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import logging
import os
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from treadle import reaper
from treadle.concurrency import CONCURRENCY
from treadle.errors import PlanError
from treadle.fork_locks import check_not_forked
from treadle.plan.nextuse import NodeNextUse
from treadle.plan.plan import Plan
from treadle.read.budget import check_batch_fits
from treadle.read.lookahead import GROUP_STEPS, Lookahead, lookahead_store, tracked
from treadle.read.prefetch import prefetch
from treadle.read.shared_window import ReadFrontier, SharedWindow
from treadle.read.step_chunks import StepTakes
from treadle.read.steps import StepSamples, host_reader, read_steps, train_samples
from treadle.torch.convert import to_torch
from treadle.torch.device_steps import Sampler, finish_for, plan_reader
from treadle.torch.hook import Transform, check_transform
from treadle.workers.processes import Job, check_workers, read_in_processes
from treadle.workers.processes import context as worker_context
from treadle.workers.worker import pack_finish

if TYPE_CHECKING:
    from treadle.storage.chunkstore import ChunkStore

__all__ = ["StepLoader", "default_rank_world", "plan_reader", "rank_world", "read_steps"]


def default_rank_world() -> tuple[int, int]:
    """(rank, world size) from torch.distributed, else RANK/WORLD_SIZE, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        raise PlanError("RANK and WORLD_SIZE must be integers") from None


def rank_world(rank: Any, world_size: Any) -> tuple[int, int]:
    """This process's (rank, world size): each given, else :func:`default_rank_world`'s.
    A rank or world size that is not an integer is refused (``int(1.7)`` read rank 1), and
    so is a world of several ranks when neither ``rank=``, torch.distributed nor ``RANK``
    gives a rank: every process read rank 0's slots, and the rest of each batch none."""
    rank = None if rank is None else _whole(rank, "rank", 0)
    world_size = None if world_size is None else _whole(world_size, "world_size", 1)
    d_rank, d_world = default_rank_world()
    world = d_world if world_size is None else world_size
    if rank is None:
        dist = torch.distributed
        if (
            world > 1
            and "RANK" not in os.environ
            and not (dist.is_available() and dist.is_initialized())
        ):
            raise PlanError(
                f"world size {world} but no rank: pass rank= (or run under torch.distributed, "
                "or set RANK); without one every process would read rank 0's samples"
            )
        rank = d_rank
    return rank, world


# Iterators not yet finished: closed (their threads, workers and slots ended) before the
# interpreter tears its modules down. Left to the teardown, a suspended one's ``finally``
# runs with module globals already None and prints "Exception ignored in: <generator ...>".
_OPEN: weakref.WeakSet[Iterator[Any]] = weakref.WeakSet()
_HOOKED: list[bool] = []


def close_at_exit(it: Iterator[Any]) -> None:
    """Close ``it`` (a loader's or dataset's iterator) at interpreter exit if it is not
    finished by then."""
    # Registered at the first iteration, so it runs before (atexit is last-in, first-out)
    # the store's event-loop shutdown registered by the first store request.
    if not _HOOKED:
        atexit.register(_close_open)
        _HOOKED.append(True)
    _OPEN.add(it)


def _close_open() -> None:
    for it in list(_OPEN):
        with suppress(ValueError):  # one running on another thread ends with its thread
            it.close()
    reaper.drain(reaper.EXIT_WAIT_S)  # their threads, workers and slots end before exit


log = logging.getLogger(__name__)


def _whole_env(name: str) -> int:
    """An environment variable's integer (1 when unset)."""
    raw = os.environ.get(name, "1")
    try:
        return int(raw)
    except ValueError:
        raise PlanError(f"{name} must be an integer, got {raw!r}") from None


def _whole(value: Any, name: str, least: int) -> int:
    """``value`` as an int, refusing a bool, a float (``workers=1.5`` read as 1) or too small."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PlanError(f"{name} must be an integer >= {least}, got {value!r}")
    if value < least:
        raise PlanError(f"{name} must be >= {least}, got {value}")
    return int(value)


class StepLoader:
    """What ``TrainLoader`` and ``EvalLoader`` share: options, resume step, iteration.

    Subclasses set :attr:`sampler` (a module-level function or a ``functools.partial`` of
    one, so workers can rebuild it; an instance may set its own) and
    :attr:`label` (how errors name a step), and call this constructor with a function that
    makes their plan: with ``workers``, the process server starts importing first.
    """

    sampler: Sampler
    label = "step"
    _resident_bytes: int | None = None  # worker readers' budget for resident columns (tests)
    plan: Plan
    steps: int | None

    def __init__(self, make_plan: Callable[[], Plan], *, device: str | torch.device,
                 rank: int | None, world_size: int | None, prefetch: int, workers: int,
                 video_threads: int | None, transform: Transform | None,
                 read_ahead: int | None = None, lookahead: int | None = None) -> None:  # fmt: skip
        if isinstance(workers, int) and workers > 0:
            worker_context()  # the process server imports while the plan is made
        plan = make_plan()
        self.rank, self.world_size = rank_world(rank, world_size)
        prefetch, workers = _whole(prefetch, "prefetch", 1), _whole(workers, "workers", 0)
        check_workers(workers, prefetch)
        self._check_world(plan)
        check_transform(transform, workers)
        if video_threads is None:
            video_threads = CONCURRENCY.video_threads(workers)
        video_threads = _whole(video_threads, "video_threads", 1)
        if read_ahead is not None:
            read_ahead = _whole(read_ahead, "read_ahead", 1)
        if lookahead is not None:
            lookahead = _whole(lookahead, "lookahead", 0)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise PlanError("device='cuda' but CUDA is not available; use device='cpu'")
        self.plan, self.transform = plan, transform
        self.prefetch, self.workers = int(prefetch), int(workers)
        self.video_threads = int(video_threads)
        self.read_ahead: int | None = read_ahead
        self.lookahead: int | None = lookahead
        self._next_step = 0
        self._iterators = 0  # how many times this loader was iterated: the newest one runs

    def _check_world(self, plan: Plan) -> None:
        """Rank, world size and ``B % W`` of the steps this loader delivers, and that one of
        its batches fits in memory (an ``EvalLoader`` of a mix has its own batch size)."""
        check_batch_fits(plan, plan.batch_size // max(1, self.world_size))  # before batch(0)
        plan.batch(0, self.rank, self.world_size)  # validates rank, world size, B % W

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
        # A pass that delivered every step is over: iterating it again gave no batch,
        # silently (an epoch loop around the training loop, a validation over nothing).
        if self._iterators and self.steps and self._next_step >= self.steps:
            raise PlanError(self._over())
        it = self._deliver()
        close_at_exit(it)
        return it

    def _over(self) -> str:
        """What to do instead of iterating again a loader that delivered all its steps."""
        return f"this loader has delivered its {self.steps} steps: make a new one"

    def _deliver(self) -> Iterator[dict[str, torch.Tensor]]:
        # One live iterator: an older one that is still iterated would deliver steps the
        # newer one also delivers (they share the step count), so it stops with an error.
        self._iterators += 1
        mine = self._iterators
        pin = self.device.type == "cuda"
        at = self._next_step
        home = os.getpid()
        while True:
            source = self._processes() if self.workers else self._thread()
            try:
                for arrays in source:
                    self._check_newest(mine)
                    if self._next_step != at:
                        break  # load_state_dict moved the position: read from there
                    batch = to_torch(arrays, self.device, pin)
                    self._next_step = at = at + 1
                    yield batch
                    # resumed in a forked child: its reader threads are not there and its
                    # worker processes are the parent's (a hang, or the parent's batches)
                    check_not_forked(home, f"this {type(self).__name__}'s iterator")
            finally:
                close = getattr(source, "close", None)
                if close is not None and os.getpid() == home:
                    close()
            if self._next_step == at:
                return
            # a rollback inside the loop (load_state_dict of an earlier state): the batches
            # read ahead were of the old position; what comes next is the state's step
            self._check_newest(mine)
            at = self._next_step

    def _check_newest(self, mine: int) -> None:
        if self._iterators != mine:
            raise PlanError(
                f"this {type(self).__name__} was iterated again (iter() at step "
                f"{self._next_step}): an older iterator of it cannot go on; use the "
                "newest one"
            )

    def _steps(self) -> Iterable[int]:
        start = self._next_step
        return itertools.count(start) if self.steps is None else range(start, self.steps)

    def _thread(self) -> Iterator[dict[str, Any]]:
        chunks = self._chunk_store()
        reader = plan_reader(self.plan, self.video_threads, self.device, self.read_ahead, chunks)
        finish = finish_for(self.plan, self.transform, self.label)
        stage, sampler = None, self.sampler
        if chunks is not None and self.lookahead is not None:
            # each step's samples computed once, for the stage and then the reader
            memo = StepSamples(self.sampler, self.plan, self.rank, self.world_size,
                               stop=self.steps)  # fmt: skip
            if self.read_ahead is None:  # the stage fetches: reads are local (until it stops)
                reader.hold_ahead(CONCURRENCY.lookahead_read_ahead)
            stage = self._lookahead(reader, chunks, self.lookahead, memo.ahead)
            memo.keep, sampler = 2 * (stage.horizon + GROUP_STEPS), memo.take
        steps = self._steps() if stage is None else stage.gate(self._steps())
        batches = read_steps(self.plan, sampler, reader, steps, self.rank,
                             self.world_size, finish)  # fmt: skip
        if stage is not None:
            batches = tracked(batches, self._steps(), stage)
        return prefetch(batches, self.prefetch, close=reader.close)

    def _chunk_store(self) -> ChunkStore | None:
        """The node's chunk store when ``lookahead`` is set and a table is on an object store:
        on local files there is nothing to fetch, and a stage would report a hit rate of 1.0
        over no chunks (``td.info()``'s ``last lookahead``)."""
        if self.lookahead is None:
            return None
        if all(t.project.store.is_local for t in self.plan.tables):
            log.warning("treadle: lookahead=%d has no effect: the tables are on a local store "
                        "(it fetches from object stores)", self.lookahead)  # fmt: skip
            return None
        return lookahead_store()

    def _lookahead(self, reader: Any, chunks: Any, lookahead: int,
                   samples: Callable[[int], Any]) -> Lookahead:  # fmt: skip
        self.lookahead_stage = Lookahead(reader, samples, self._steps(), lookahead, chunks,
                                         node=self._node_uses())  # fmt: skip
        return self.lookahead_stage

    def _node_uses(self) -> Callable[..., NodeNextUse] | None:
        """Ranks of a node share its chunk cache (``LOCAL_WORLD_SIZE`` ranks a node, numbered
        node by node): their next uses, computed from the plan (training steps only)."""
        per_node = _whole_env("LOCAL_WORLD_SIZE")
        if per_node <= 1 or self.world_size % per_node or self.sampler is not train_samples:
            return None  # its own uses (a loader of its own world: world_size=1, say)
        return partial(
            NodeNextUse, self.plan, self.rank, self.world_size, per_node, stop=self.steps
        )

    def _processes(self) -> Iterator[dict[str, Any]]:
        start, stop = self._next_step, self.steps
        workers = self.workers if stop is None else min(self.workers, stop - start)
        if workers < 1:
            return iter(())
        client = self.plan.table(0).project.client
        finish = pack_finish(finish_for(self.plan, self.transform, self.label))
        job = Job(self.plan.record.to_json(), client.root, client.storage_options,
                  self.sampler, self.rank, self.world_size, start, stop,
                  self.video_threads, finish, self.prefetch, self.read_ahead,
                  resident_bytes=self._resident_bytes)  # fmt: skip
        chunks = self._chunk_store()
        # without a transform (which runs in the workers), this process reads the first step
        # while the workers start: it does not wait for their server's imports
        here = self.transform is None
        stage = None if chunks is None else self._worker_lookahead(chunks, workers, here)
        first = None
        if here:
            first = functools.partial(self._read_here, chunks=chunks, stage=stage)
        if stage is None:
            return read_in_processes(job, workers, first)
        job = replace(job, chunks=(str(chunks.directory), chunks.max_bytes, chunks.chunk_bytes))
        return _closing(read_in_processes(job, workers, first, stage.shared), stage)

    def _worker_lookahead(self, chunks: ChunkStore, workers: int, here: bool) -> Lookahead:
        """The lookahead stage of a ``workers=N`` loader, in this process: it walks every
        step and fetches their chunks; the workers read rows from the same chunk store,
        each step once the stage fetched it (a :class:`SharedWindow`; ``here``: this
        process reads the first step). Its position is where the workers have read (a
        :class:`ReadFrontier`), not where this loader is: the chunks of steps read but not
        yet taken back are not held. Its window is ``lookahead`` steps, at least what the
        slowest worker reads ahead of that position: a worker ahead of the slowest waits
        for the window rather than read steps it has not fetched, so the window's chunks
        are all the cache must hold."""
        remote = not self.plan.table(0).project.store.is_local
        ahead = self.read_ahead or (CONCURRENCY.cloud_read_ahead if remote else 1)
        planner = StepTakes(self.plan, chunks, 0, self._resident_bytes)
        # steps past the first one not read that the slowest worker reads (its reader's
        # read_ahead batches of its own, one more where it decodes: it hands a batch out
        # once the next one's decode started)
        reach = workers * (ahead + int(planner.decodes))
        planner.read_ahead = reach - 1
        window = max(int(self.lookahead or 0), reach)

        def samples(step: int) -> Any:
            return self.sampler(self.plan, step, self.rank, self.world_size)

        start = self._next_step
        shared = SharedWindow(workers, start, window, here=here)
        follow: list[ReadFrontier] = []

        def after() -> None:  # on the reaper, once the stage's thread ended
            for f in follow:
                f.stop()  # the steps read since its last look count in the report
            planner.close()

        stage = Lookahead(planner, samples, self._steps(), window, chunks, shared,
                          after=after)  # fmt: skip
        follow.append(ReadFrontier(shared, start, self.steps, stage.done, stage.close))
        self.lookahead_stage = stage
        return stage

    def _read_here(self, step: int, chunks: ChunkStore | None = None,
                   stage: Lookahead | None = None) -> dict[str, Any]:  # fmt: skip
        """Step ``step``'s batch, read in this process as a worker reads it (CPU decode into
        host memory), by a reader that keeps no column resident (Lance takes: the same
        values, without reading whole columns for one batch). On an object store it maps
        the wide columns from the object cache, as a ``workers=0`` loader's first batch
        does: the copies are made before the first batch, and the workers map them, rather
        than each waiting for them in its first batches."""
        remote = not self.plan.table(0).project.store.is_local
        reader = host_reader(self.plan, self.video_threads, read_ahead=1,
                             fixed_columns=remote, resident_bytes=0, chunks=chunks)  # fmt: skip
        steps = [step] if stage is None else stage.gate([step])  # after its chunks' fetch
        try:
            [batch] = read_steps(self.plan, self.sampler, reader, steps, self.rank,
                                 self.world_size)  # fmt: skip
        finally:
            reader.close()
        if stage is not None and stage.shared is not None:
            stage.shared.read_here(len(batch.get("_moment", ())))  # the stage moves past it
        return batch


def _closing(batches: Iterator[dict[str, Any]], stage: Lookahead) -> Iterator[dict[str, Any]]:
    """``batches``, stopping ``stage`` when they end or are closed (without waiting): the
    workers' reads move it on (:class:`ReadFrontier`), not this loader's. A forked child's
    copy, closed (its exit closes the iterators it inherited), leaves the stage alone: it is
    the parent's, and its lock may have been held by a thread of the parent at the fork
    (the child waited for it forever)."""
    home = os.getpid()
    try:
        yield from batches
    finally:
        if os.getpid() == home:
            stage.close()
