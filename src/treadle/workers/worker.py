"""One ``workers=N`` worker process: rebuild the plan, read my steps, write each batch into
a shared-memory slot (:mod:`treadle.workers.slots`), send its :mod:`~treadle.workers.messages`.

Worker ``k`` of ``n`` reads steps ``start+k, start+k+n, ...`` (:func:`treadle.read.steps.read_steps`,
read ahead on one thread by :func:`treadle.read.prefetch.prefetch`). This module and what it
imports need no torch (the batches are numpy arrays), so the process server the workers
fork from starts without importing it; a transform (the torch layer's ``finish``) imports
what it needs when it is unpickled. The loader's side is :mod:`treadle.workers.processes`.
"""

from __future__ import annotations

import itertools
import os
import select
import signal
import sys
import traceback
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import reduction
from typing import Any

from treadle.errors import TreadleError
from treadle.read.prefetch import prefetch
from treadle.read.shared_window import SharedWindow
from treadle.read.steps import Finish, Sampler, host_reader, read_steps
from treadle.storage.chunkstore import ChunkStore
from treadle.workers import messages
from treadle.workers.slots import Slot


@dataclass
class Job:
    """What every worker of one loader needs to rebuild its share of the run."""

    record: str
    root: str
    options: dict | None = field(repr=False)  # may hold credentials: never in a repr
    sampler: Sampler
    rank: int
    world: int
    start: int
    stop: int | None
    video_threads: int
    finish: bytes | None  # the steps' Finish, pickled (pack_finish): unpickled in the worker
    depth: int
    read_ahead: int | None = None
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ), repr=False)
    chunks: tuple[str, int, int] | None = None  # lookahead: the chunk store (folder, bytes, chunk)
    resident_bytes: int | None = None  # the readers' budget for resident columns (None: default)


def pack_finish(finish: Finish | None) -> bytes | None:
    """``finish`` (a loader's transform) pickled for :class:`Job`: each worker unpickles it
    itself, so one its process cannot load is an error naming it in the training process;
    unpickled by multiprocessing, the worker exited (code 1) with the reason on stderr."""
    return None if finish is None else bytes(reduction.ForkingPickler.dumps(finish))


def _unpack_finish(raw: bytes | None, k: int) -> Finish | None:
    if raw is None:
        return None
    try:
        return reduction.ForkingPickler.loads(raw)
    except Exception as e:
        if isinstance(e, RuntimeError) and "bootstrapping phase" in str(e):
            # multiprocessing's refusal: the main module, imported here for the transform,
            # started processes (a script's loader, with no `if __name__ == "__main__":`)
            raise TreadleError(
                f"treadle worker process {k} cannot load the loader's transform: importing "
                "the script that defines it ran the script's own loader again, which cannot "
                "start processes in a worker: put the code that builds and iterates the "
                'loader under `if __name__ == "__main__":` (the transform stays at the top '
                "level), or use workers=0"
            ) from None
        raise TreadleError(
            f"treadle worker process {k} cannot load the loader's transform "
            f"({type(e).__name__}: {e}): a worker process imports it by name, so define it "
            "at the top level of a module, not inside a function nor under "
            '`if __name__ == "__main__":` (or use workers=0)'
        ) from None


def _portable(e: BaseException, k: int) -> BaseException:
    """``e`` with the worker's traceback as a note, as itself if it pickles, else as a
    TreadleError carrying its type and message."""
    note = f"in treadle worker process {k}:\n" + "".join(traceback.format_exception(e))
    try:
        e.add_note(note)
        reduction.ForkingPickler.loads(reduction.ForkingPickler.dumps(e))
        return e
    except Exception:
        out = TreadleError(f"{type(e).__name__} in treadle worker process {k}: {e}")
        out.add_note(note)
        return out


def work(job: Job, k: int, n: int, out: Any, back: Any, fds: list[int],
         window: int | None = None) -> None:  # fmt: skip
    """Worker ``k`` of ``n`` (the process target); ends with ``os._exit`` so no finaliser
    runs while Lance or PyAV threads are still at work. ``window``: the descriptor of the
    loader's :class:`~treadle.read.shared_window.SharedWindow` (with ``job.chunks``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loader's to handle
    os.environ.clear()
    os.environ.update(job.env)
    try:
        _serve(job, k, n, out, back, [Slot(fd) for fd in fds], window)
    except BaseException as e:
        try:
            out.send(messages.error(_portable(e, k)))
        except Exception:
            pass  # the loader went away (its pipes are closed): nobody to tell
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(0)


def _hung_up(conn: Any) -> bool:
    """Whether every writer of ``conn`` (the loader's end of its pipe: only the loader holds
    it) has closed it: the loader's process ended or closed this worker."""
    poll = select.poll()
    poll.register(conn.fileno(), select.POLLIN)
    return any(ev & (select.POLLHUP | select.POLLERR) for _, ev in poll.poll(0))


def _serve(job: Job, k: int, n: int, out: Any, back: Any, slots: list[Slot],
           window_fd: int | None) -> None:  # fmt: skip
    from treadle.catalog import Client
    from treadle.plan.plan import Plan

    plan = Plan.from_record(job.record, Client(job.root, job.options or None))
    chunks = window = None
    if job.chunks is not None and window_fd is not None:  # rows from the loader's fetches
        chunks, window = ChunkStore(*job.chunks), SharedWindow(fd=window_fd)
    reader = host_reader(plan, job.video_threads, read_ahead=job.read_ahead,
                         resident_bytes=job.resident_bytes, chunks=chunks)  # fmt: skip
    first = job.start + k
    mine = itertools.count(first, n) if job.stop is None else range(first, job.stop, n)
    steps = mine if window is None else window.gate(mine, k, gone=partial(_hung_up, back))
    finish = _unpack_finish(job.finish, k)
    batches = read_steps(plan, job.sampler, reader, steps, job.rank, job.world, finish)
    if window is not None:  # each step read moves the stage on (its chunks not held)
        batches = window.reading(k, first, n, batches)
    free = deque(range(len(slots)))
    for step, batch in zip(itertools.count(first, n), prefetch(batches, job.depth,
                                                                 close=reader.close)):  # fmt: skip
        while not free:
            free.append(back.recv())  # the loader hands slots back in the order it got them
        i = free.popleft()
        if window is not None and chunks is not None:  # counted before the loader has it
            window.count(k, chunks.stats)
        out.send(messages.batch(step, i, slots[i].pack(batch)))
    out.send(messages.end())
