"""The lookahead stage's downloads: rounds of reserved chunks fetched by a few threads at
once, each round's end told in the order the rounds were reserved.

A round of the stage (:mod:`treadle.read.lookahead`) reserves the chunks of the steps
entering its window, then downloads them: at least one request latency, plus the transfer.
With one round at a time a loader behind an object store 30 ms away delivered about 8 steps
per latency whatever its bandwidth (issue 48's bench: 0.2x of the link). Here the stage's
thread reserves round after round, in step order as before (what is reserved, evicted and
counted does not change), while :data:`IN_FLIGHT` rounds download together; the stage hears
that a round ended only once every round reserved before it ended, so a reader gated on the
last fetched step never passes a step whose chunks are still on their way.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from treadle.storage.chunkstore import ChunkStore, ObjectChunks

__all__ = ["IN_FLIGHT", "Downloads"]

IN_FLIGHT = 8
"""Rounds downloading at once (the stage's thread waits to reserve one more). Rounds that
with no chunk to fetch, and rounds that ended and wait for the earlier ones, hold no thread:
once the window moves a step at a time most rounds are a step whose chunks are all present,
and counting them held the stage a few steps behind a slow download (issue 48's bench: the reader waited for rounds not yet reserved)."""

Fetches = list[tuple[Any, list[tuple[ObjectChunks, list[int]]]]]  # (store, its chunks)


@dataclass
class _Round:
    last: int  # the last step of the round
    reserved: Fetches
    state: int = 0  # 0 queued, 1 downloading, 2 ended
    error: BaseException | None = field(default=None, repr=False)


class Downloads:
    """Downloads rounds of reserved chunks into ``chunks`` on ``threads`` threads; calls
    ``ended(last, error)`` for each round, in the order of :meth:`submit`, once it and every
    round before it ended (``error``: why its download failed, else None)."""

    def __init__(self, chunks: ChunkStore, ended: Callable[[int, BaseException | None], None],
                 threads: int = IN_FLIGHT) -> None:  # fmt: skip
        self.chunks, self._ended = chunks, ended
        # one lock, two conditions: a round queued wakes one idle thread (waking all of them
        # for every round, most of which fetch nothing, took the GIL from the reader a
        # dozen times a step); a round's end wakes the stage's thread (room, drain)
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._queued = threading.Condition(lock)
        self._rounds: deque[_Round] = deque()
        self._stop = False
        self._threads = [
            threading.Thread(target=self._work, name=f"treadle-lookahead-get_{i}", daemon=True)
            for i in range(max(1, threads))
        ]
        for t in self._threads:
            t.start()

    def submit(self, last: int, reserved: Fetches) -> None:
        """Download ``reserved`` (the chunks of steps up to ``last``); waits while as many
        rounds as threads are still to download (a round with no chunk to fetch, or one that
        downloaded and waits only for an earlier one to end, holds no thread). After
        :meth:`close` it gives their room back."""
        empty = not any(chunks for _, items in reserved for _, chunks in items)
        with self._cond:
            if not empty:  # a round with nothing to fetch (every chunk a hit) needs no thread
                self._cond.wait_for(lambda: self._stop or self._downloading() < len(self._threads))
            if not self._stop:
                self._rounds.append(_Round(last, reserved, state=2 if empty else 0))
                if empty:
                    self._end_in_order()
                else:
                    self._queued.notify()
                return
        self.abandon(reserved)

    def _downloading(self) -> int:
        """Under the lock: rounds queued or downloading."""
        return sum(r.state < 2 for r in self._rounds)

    def _end_in_order(self) -> None:
        """Under the lock: tell the rounds that ended and every round before which ended."""
        while self._rounds and self._rounds[0].state == 2:
            r = self._rounds.popleft()
            self._ended(r.last, r.error)

    def drain(self) -> None:
        """Wait until every round submitted ended (or the downloads were closed)."""
        with self._cond:
            self._cond.wait_for(lambda: self._stop or not self._rounds)

    def close(self) -> None:
        """Stop: rounds under way end, those not started give their room back; never waits
        for a download (:meth:`join` does)."""
        with self._cond:
            self._stop = True
            # from the first round not started on: none of them is told (a later round told
            # would pass the steps of one never fetched)
            cut = next((i for i, r in enumerate(self._rounds) if r.state == 0), len(self._rounds))
            dropped = [self._rounds.pop() for _ in range(len(self._rounds) - cut)][::-1]
            self._cond.notify_all()
            self._queued.notify_all()
        for r in dropped:
            self.abandon(r.reserved)

    def join(self, timeout: float) -> None:
        for t in self._threads:
            t.join(timeout)

    def _work(self) -> None:
        while True:
            with self._cond:
                self._queued.wait_for(lambda: self._stop or any(r.state == 0 for r in self._rounds))
                todo = next((r for r in self._rounds if r.state == 0), None)
                if todo is None:  # stopped, nothing queued
                    return
                todo.state = 1
            for i, (store, items) in enumerate(todo.reserved):
                try:
                    self.chunks.download(store, items)  # on failure it gives their room back
                except Exception as e:  # the reads that need these bytes take them (and raise)
                    todo.error = e
                    self.abandon(todo.reserved[i + 1 :])
                    break
            with self._cond:
                todo.state = 2
                self._end_in_order()
                self._cond.notify_all()

    def abandon(self, reserved: Fetches) -> None:
        """Give back the room of reserved chunks no round will download."""
        for _, items in reserved:
            self.chunks.abandon(items)
