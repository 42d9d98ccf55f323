"""A lookahead's window, shared with the worker processes that read its steps.

With ``workers=N`` and ``lookahead``, one :class:`~treadle.read.lookahead.Lookahead` in the
loader's process fetches the chunks of every step (one walk of the plan: each chunk fetched
once, eviction by the readers' position), and the workers read rows from the same chunk
store. A worker must not read a step before its fetches ended, as the reader of a
``workers=0`` loader waits at :meth:`Lookahead.gate <treadle.read.lookahead.Lookahead.gate>`.
:class:`SharedWindow` is the few numbers that takes: the stage's position, its last fetched
step and whether it stopped, in a small anonymous shared-memory file (a ``memfd``, handed to
each worker like its batch slots), and per worker the next step it has not read, the
samples it read, the rows it read from chunks and took otherwise, and the video windows it
read from chunks and fetched with range requests (the stage's report counts them). Whole
aligned 8-byte words are written and read, so a reader sees each number either before or
after a change, never half of it.

The stage's position is where the workers *read* (:class:`ReadFrontier`: the first step
some worker has not read), not where the loader takes batches: a worker reads a step's rows
a few dozen steps before the loader takes its batch (its read-ahead, prefetched batches and
slots), and the chunks of those steps need not stay held meanwhile. A worker ahead of the
slowest waits for steps past the window (the slowest never does: it reads them at once),
so every step is read from fetched chunks while the cache holds no more than the window's.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from treadle.errors import TreadleError
from treadle.fastpaths import log

__all__ = ["ReadFrontier", "SharedWindow"]

_NOW, _FETCHED, _STOP, _LOOKAHEAD, _HERE, _HERE_SAMPLES, _HEAD = range(7)
_POLL_S = (0.0002, 0.005)  # a waiting worker's (and the frontier's) first and longest sleep
_COUNTS = ("rows_read", "rows_taken", "windows_read", "windows_fetched")  # per worker
_NEXT, _SAMPLES = len(_COUNTS), len(_COUNTS) + 1  # per worker: first step not read, samples
_PER = len(_COUNTS) + 2
_NONE = 1 << 62  # the loader's process reads no step (more)
_FRONTIER_POLL_S = (0.001, 0.005)  # the read frontier's first and longest sleep
_GONE_EVERY_S = 0.2  # how often a worker waiting for the stage asks whether the loader is there


class SharedWindow:
    """``now``, ``fetched``, ``stopped`` and ``lookahead`` of a stage, and per worker the
    next step it has not read and its counts. Made by the loader (``fd=None``: a new memfd
    for ``workers`` workers, the stage at step ``start``; ``here``: the loader's process
    reads step ``start`` itself and the workers the steps after it, worker ``k`` from
    ``start + here + k`` on, every ``workers``-th), mapped again in a worker from the
    descriptor it inherits."""

    def __init__(self, workers: int = 0, start: int = 0, lookahead: int = 0,
                 fd: int | None = None, here: bool = False) -> None:  # fmt: skip
        made = fd is None
        if fd is None:
            fd = os.memfd_create("treadle-lookahead-window")
            os.ftruncate(fd, 8 * (_HEAD + _PER * max(1, workers)))
        self.fd = fd
        self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        self.words = np.frombuffer(self._map, np.int64)
        self.per = self.words[_HEAD:].reshape(-1, _PER)  # a row per worker
        if made:
            self.words[_NOW], self.words[_FETCHED] = start, start - 1
            self.words[_LOOKAHEAD] = lookahead
            self.words[_HERE] = start if here else _NONE
            first = start + int(here)
            self.per[:, _NEXT] = np.arange(first, first + len(self.per))

    def close(self) -> None:
        """Close the descriptor once no worker is started any more (the mapping stays)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def publish(self, now: int | None, fetched: int, stopped: bool) -> None:
        """The stage's state (its thread and the loader call this under its condition)."""
        if now is not None:
            self.words[_NOW] = now
        self.words[_FETCHED] = fetched
        self.words[_STOP] = int(stopped)

    def gate(self, steps: Iterable[int], worker: int | None = None,
             gone: Callable[[], bool] | None = None) -> Iterator[int]:  # fmt: skip
        """``steps``, each once the stage fetched it or stopped. A step beyond the window
        is read at once (its rows taken, as :meth:`Lookahead.gate` does) by the slowest
        worker, whose reading moves the window; worker ``worker``, when it is ahead of the
        slowest (its next step past the stage's position), waits for the window to reach
        it. Never waits for the loader to move. ``gone()``: whether the loader's process
        has gone (asked every :data:`_GONE_EVERY_S` of a wait): a :class:`TreadleError`,
        since a dead loader never sets the words again (its workers waited here forever)."""
        w = self.words
        mine = None if worker is None else self.per[worker]
        for step in steps:
            pause, asked = _POLL_S[0], time.monotonic()
            while (
                not w[_STOP]
                and w[_FETCHED] < step
                and (
                    step <= w[_NOW] + w[_LOOKAHEAD] or (mine is not None and mine[_NEXT] > w[_NOW])
                )
            ):
                time.sleep(pause)
                pause = min(2 * pause, _POLL_S[1])
                if gone is not None and time.monotonic() - asked > _GONE_EVERY_S:
                    if gone():
                        raise TreadleError(
                            f"treadle worker process {worker}: the loader's process has gone "
                            f"while step {step} waited for its lookahead's fetches"
                        )
                    asked = time.monotonic()
            yield step

    def reading(self, worker: int, first: int, every: int,
                batches: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:  # fmt: skip
        """``batches`` of worker ``worker``'s steps (``first``, then every ``every``-th),
        telling as it hands each out that it has read that step (its rows are copied out
        of the chunks): the next step it reads is ``every`` later."""
        row = self.per[worker]
        row[_NEXT] = first  # as the loader set it: the stage stays before it meanwhile
        return _told(row, every, batches)

    def read_here(self, samples: int) -> None:
        """The loader's process has read its step (``here``), of ``samples`` samples."""
        self.words[_HERE_SAMPLES] += samples
        self.words[_HERE] = _NONE

    def frontier(self) -> tuple[int, int]:
        """(the first step not read yet by the workers or the loader's process, samples
        they read)."""
        first = min(int(self.words[_HERE]), int(self.per[:, _NEXT].min()))
        return first, int(self.words[_HERE_SAMPLES]) + int(self.per[:, _SAMPLES].sum())

    def count(self, worker: int, stats: Any) -> None:
        """Worker ``worker``'s counts so far (a :class:`ChunkStats`: rows read from chunks
        and taken, windows read from chunks and fetched)."""
        if worker < len(self.per):
            self.per[worker, : len(_COUNTS)] = [getattr(stats, n) for n in _COUNTS]

    def counts(self) -> dict[str, int]:
        """Rows every worker read from chunks and took otherwise, and windows every worker
        read from chunks and fetched otherwise (``ChunkStats`` field names)."""
        per = self.per[:, : len(_COUNTS)].sum(axis=0)
        return {n: int(v) for n, v in zip(_COUNTS, per)}


def _told(row: np.ndarray, every: int, batches: Iterable[dict[str, Any]]
          ) -> Iterator[dict[str, Any]]:  # fmt: skip
    for batch in batches:
        row[_SAMPLES] += len(batch.get("_moment", ()))
        row[_NEXT] += every
        yield batch


class ReadFrontier:
    """Moves a stage along as its workers read: a thread that calls ``done(step,
    samples)`` for each step up to the first one not read (:meth:`SharedWindow.frontier`),
    in order, from ``start`` (with the samples the workers read since on the last one; none
    past ``stop``). :meth:`stop` ends it after a last look (the stage's report then counts
    every step read). Should it fail, ``failed()`` (the stage's ``close``) stops the
    stage, so no worker waits for a window that would no longer move."""

    def __init__(self, window: SharedWindow, start: int, stop: int | None,
                 done: Callable[[int, int], None], failed: Callable[[], None]) -> None:  # fmt: skip
        self.window, self._done, self._failed = window, done, failed
        self._next, self._stop_at, self._samples = start, stop, 0
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="treadle-read-frontier",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        """Count the steps read since the last look, and end the thread (without waiting)."""
        with self._lock:
            if not self._stopped:
                self._stopped = True
                self._look()

    def _run(self) -> None:
        pause = _FRONTIER_POLL_S[0]
        try:
            while True:
                with self._lock:
                    if self._stopped:
                        return
                    moved = self._look()
                pause = _FRONTIER_POLL_S[0] if moved else min(2 * pause, _FRONTIER_POLL_S[1])
                time.sleep(pause)
        except Exception as e:
            log.warning("treadle: the lookahead's read frontier failed (%s: %s); the stage "
                        "stops, rows are taken", type(e).__name__, e)  # fmt: skip
            self._failed()

    def _look(self) -> bool:
        """Tell the stage of the steps read since the last look; whether there were any."""
        first, samples = self.window.frontier()
        if self._stop_at is not None:
            first = min(first, self._stop_at)
        if first <= self._next:
            return False
        new, self._samples = samples - self._samples, samples
        for step in range(self._next, first):
            self._done(step, new if step == first - 1 else 0)
        self._next = first
        return True
