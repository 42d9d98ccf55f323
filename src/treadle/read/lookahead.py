"""The plan drives the chunk cache: a loader's ``lookahead`` stage.

The plan knows every future sample, so a loader at step ``s`` knows which rows steps
``s .. s+L`` will read. :class:`Lookahead` runs one thread that walks those steps (only the
loader's position and the plan decide what it fetches: a restart fetches exactly what its own
steps need), maps each step's rows of chunked columns (:mod:`treadle.read.chunk_rows`) to the
chunks of their data files and its video windows to chunks of their streams
(:mod:`treadle.read.chunk_media`), and has the node's chunk store fetch the missing ones
(coalesced range requests, a few rounds at once: :mod:`treadle.read.downloads`). Each
chunk is held for the step that reads it, then takes its next use among the next
:data:`HORIZON_STEPS` steps (none: it goes first; with ranks of a node sharing the folder,
any rank's next use), so eviction follows the plan (Belady's policy over the steps it sees;
``treadle simulate`` replays it: :func:`treadle.plan.simcache.lookahead`). Chunks that find
no room when their step enters the window are asked for again (:mod:`treadle.read.owed`).

It only fetches: a reader reads rows from present chunks and takes the others with Lance, so
batches are the same with or without it (a fetch that fails is logged once, and the reads
that need its bytes raise). Its thread never blocks a finalizer: :meth:`Lookahead.close`
only flags it to stop (in a forked child, not even that: the stage is the parent's).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle import fastpaths, reaper
from treadle.errors import TreadleError
from treadle.fastpaths import log
from treadle.read.chunk_needs import Need, step_needs
from treadle.read.downloads import Downloads, Fetches
from treadle.read.owed import Owed
from treadle.storage.chunkstore import NEVER, ChunkStore

if TYPE_CHECKING:
    from treadle.read.sample_reader import SampleReader
    from treadle.read.shared_window import SharedWindow
    from treadle.read.step_chunks import StepTakes

__all__ = ["Lookahead"]

LAST: dict[str, float] = {}
"""The last lookahead's :meth:`Lookahead.report` in this process (``td.info()``)."""

GROUP_STEPS = 8
"""Steps whose chunks one round of requests fetches at most (and plans the uses of after)."""
HORIZON_STEPS = 64  # steps ahead whose uses give a chunk its next use
MIN_ASKED = 64  # chunks asked for before the stage may decide that most find no room


class Lookahead:
    """Fetches the chunks of steps ``[now, now + lookahead]`` of ``samples(step)`` (a
    batch with ``component`` and ``moment``) read by ``reader``, into ``chunks``.
    ``node(keys, horizon)``: where ranks of the node share the folder, a
    :class:`~treadle.plan.nextuse.NodeNextUse` (``functools.partial`` of it, given the
    keys and horizon here): a chunk read takes its next use by any rank of the node."""

    def __init__(self, reader: SampleReader | StepTakes, samples: Callable[[int], Any],
                 steps: Iterable[int], lookahead: int, chunks: ChunkStore,
                 shared: SharedWindow | None = None, after: Callable[[], None] | None = None,
                 node: Callable[..., Any] | None = None) -> None:  # fmt: skip
        self.reader, self.samples, self.chunks = reader, samples, chunks
        self.shared, self._after = shared, after  # workers=N: they read; after the thread
        # the reader's takes and windows run read_ahead steps ahead of the batch it
        # assembles, one after the last it handed out: the window covers them at least
        self.lookahead = max(int(lookahead), int(getattr(reader, "read_ahead", 0)) + 1)
        self.horizon = max(self.lookahead, HORIZON_STEPS)
        self._later: deque[int] = deque()  # steps past the next one to fetch, pulled ahead
        self._planned: dict[int, Need] = {}  # their needs, uses registered
        self._steps = iter(steps)
        self._now: int | None = None  # the first step not yet read
        self._fetched = -1  # the last step whose fetches ended
        self._stop = self._failed = self._reported = False
        self._died: BaseException | None = None  # what ended the thread, if it failed
        self._cond = threading.Condition()
        self._needs: dict[int, Need] = {}
        self._read: deque[int] = deque()  # steps read, their chunks not yet released
        self._inline = False  # the thread ended: done() releases them itself
        self._releasing = threading.Lock()  # one release at a time, in step order
        self._uses: dict[tuple[str, int], deque[int]] = {}  # steps in the window per chunk
        self.samples_seen = 0
        self._began, self._waited = 0.0, 0.0  # its first step passed the gate; waits after
        self._base = replace(chunks.stats)  # the store is the process's: count from here
        self._asked = self._skipped = 0  # chunks the steps needed; those that found no room
        # chunks found no room for, asked for again (workers=N read steps once fetched: not)
        self.owed = Owed(chunks, self.lookahead if shared else getattr(reader, "read_ahead", 0))
        # ranks of the node sharing the folder: a chunk's next use is any of theirs, in the
        # window (the plan is pure: every rank's steps are known here)
        self.node = None if node is None else node(self._keys, self.horizon)
        self._downloads = Downloads(chunks, self._round_ended)  # rounds fetched together
        self._thread = threading.Thread(target=self._run, name="treadle-lookahead", daemon=True)
        self._home = os.getpid()  # a forked child's close() leaves the parent's stage alone
        reaper.start()  # close() hands the join to it
        self._thread.start()

    def done(self, step: int, samples: int) -> None:
        """The reader has read ``step`` (``samples`` samples): the window moves on, and its
        chunks take their next use in the window. The stage's thread releases them before
        its next round (a release waits for the node's folder lock, which a round's
        reservation may hold for a scan: the reader does not wait for it); once the thread
        has ended, here."""
        with self._cond:
            inline = self._inline
            self._read.append(step)  # released in order, whoever drains the queue
            self._now = step + 1
            self.samples_seen += samples
            self._changed()
        if inline:
            self._release_read()

    def _release_read(self) -> None:
        """The steps read so far let their chunks go, in order (before a round: it then sees
        these chunks' next uses, not their stale ones, which count as never needed)."""
        with self._releasing:
            while True:
                with self._cond:
                    steps, self._read = list(self._read), deque()
                if not steps:
                    return
                self._release(steps)

    def _release(self, steps: list[int]) -> None:
        """Steps ``steps`` were read: in order, their chunks take their next use in the window
        (any rank's of the node), under one lock of the folder; then what they owed settles."""
        released = []
        with self._cond:
            for step in steps:
                for _, obj, ids in self._needs.pop(step, []):
                    n = []
                    for c in ids.tolist():
                        q = self._uses.get((obj.name, c))
                        if q and q[0] == step:
                            q.popleft()
                        n.append(q[0] if q else NEVER)
                        if q is not None and not q:
                            del self._uses[(obj.name, c)]
                    released.append((obj, ids.tolist(), step, n))
        if (node := self.node) is not None:  # any rank's, not under the condition: it may
            for obj, ids, step, n in released:  # read via the I/O loop, where close() may run
                n[:] = [node.next_use((obj.name, c), step) for c in ids]
        self.chunks.release_many(released)
        for step in steps:
            self.owed.read(step)

    def close(self) -> None:
        """Stop the thread (it ends after the fetch under way); never waits here: the
        reaper joins it (``reaper.drain`` waits for that)."""
        if os.getpid() != self._home:  # its lock may have been held by a thread at the fork
            return
        with self._cond:
            self._stop = True
            reported, self._reported = self._reported, True
            self._changed()
        if not reported:
            reaper.reap(self._finish)

    def _finish(self) -> None:
        """On the reaper thread: wait for the thread, then report the run (one log line)."""
        self._thread.join(60)
        self._downloads.join(60)
        self.owed.abandon()  # reserved when steps were read, after the thread's last round
        if self._after is not None:
            self._after()
        if self.samples_seen:
            LAST.clear()
            LAST.update(self.report())
            log.info("treadle: lookahead %s", LAST)

    def report(self) -> dict[str, float | None]:
        """The chunk cache's hit rate (chunks the steps needed that were present), and bytes
        fetched and requests sent per sample, over the samples read so far; and the share of
        the reader's time it waited for fetches after its first step (``reader_waited``: near
        1, the window of ``lookahead`` steps is shorter than a fetch takes)."""
        st, n = self.chunks.stats.since(self._base), max(1, self.samples_seen)
        if self.shared is not None:  # rows and windows the workers read
            for name, count in self.shared.counts().items():
                setattr(st, name, getattr(st, name) + count)
        out = st.report(n, self.samples_seen)
        if self._began:  # this process's reader passed the gate (with workers, they read)
            spent = max(time.perf_counter() - self._began, 1e-9)
            out["reader_waited"] = round(min(1.0, self._waited / spent), 3)
        return out

    def _run(self) -> None:
        """The thread: walk the steps; if it dies, the gate raises its error (a reader
        waiting for a step would otherwise wait forever)."""
        try:
            self._walk()
        except BaseException as e:
            with self._cond:
                self._died, self._stop = e, True
                self._cond.notify_all()
                with suppress(Exception):  # the workers' window: read at once
                    if self.shared is not None:
                        self.shared.publish(self._now, self._fetched, True)
            raise
        finally:
            with self._cond:
                self._inline = True  # steps read from now on are released as they are
            try:
                self._release_read()
            finally:
                self._downloads.close()  # rounds under way end; those not started give back

    def _walk(self) -> None:
        steps = iter(self._steps)
        pending, now = next(steps, None), self._now
        while pending is not None:
            self._release_read()  # the steps read since the last round let their chunks go
            with self._cond:
                if self._now is None:
                    self._now = pending
                    self._changed()
                while not self._stop and pending > self._now + self.lookahead and not self._read:
                    self._cond.wait()
                if self._stop:
                    return
                if self._read:  # released first, then the window looked at again
                    continue
                now, last = self._now, self._now + self.lookahead
            group = []  # the steps in the window now: their chunks fetched together
            while pending is not None and pending <= last and len(group) < GROUP_STEPS:
                group.append(pending)
                pending = self._later.popleft() if self._later else next(steps, None)
            todo: Fetches = []
            try:
                todo = self._fetch(group, now)
                self._plan_ahead(steps, pending, now)
            except Exception as e:  # the reads that need these bytes take them (and raise)
                self._round_ended(group[-1], e)
            self._downloads.submit(group[-1], todo)
        self._downloads.drain()
        self._settle(now)
        with self._cond:
            self._stop = True  # no more steps: nobody waits for one
            self._changed()

    def _settle(self, seen: int | None) -> None:
        """After the last step's round (at ``seen``): rounds for owed chunks as it moves."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda s=seen: self._stop or self._now != s)
                if self._stop:
                    return
            self._release_read()
            with self._cond:
                if not self.owed.due(self._now):
                    return
                seen = self._now
            try:
                self._downloads.submit(self._fetched, self._fetch([], seen))
            except Exception as e:  # the reads that need these bytes take them
                return log.warning("treadle: lookahead could not fetch owed chunks: %s", e)

    def _plan_ahead(self, steps: Iterator[int], pending: int | None, now: int) -> None:
        """Register the uses of the next :data:`GROUP_STEPS` steps not yet planned after
        the one fetched next (``pending``), all at once, when the first of them lies within
        the horizon (``now + horizon``): chunks read take their next use among them. A
        round at a time: one vectorised pass plans them, and the first batch does not wait
        for them."""
        ahead = [] if pending is None else [pending, *self._later]
        todo = [st for st in ahead if st not in self._planned][:GROUP_STEPS]
        while pending is not None and len(todo) < GROUP_STEPS:
            got = next(steps, None)
            if got is None:
                break
            self._later.append(got)
            todo.append(got)
        if todo and todo[0] <= now + self.horizon:
            self._planned.update(self._register(todo))

    def _register(self, steps: list[int]) -> dict[int, Need]:
        """The needs of ``steps``, their uses registered (in step order)."""
        needs = step_needs(self.reader, [(b.component, b.moment) for b in map(self.samples, steps)])
        with self._cond:
            for step, need in zip(steps, needs):
                for _, obj, ids in need:
                    for c in ids.tolist():
                        self._uses.setdefault((obj.name, c), deque()).append(step)
        return dict(zip(steps, needs))

    def _fetch(self, steps: list[int], now: int) -> Fetches:
        """Reserve the chunks of ``steps`` (each held for its step; a step's objects under
        one lock of the folder): what to download, in one round of range requests per store."""
        reserved = self.owed.take()  # for owed chunks: nearer steps than those entering
        try:
            if unplanned := [st for st in steps if st not in self._planned]:
                self._planned.update(self._register(unplanned))
            for step in steps:
                need = self._planned.pop(step)
                with self._cond:
                    self._needs[step] = need
                wanted = [(obj, ids.tolist(), [step] * len(ids)) for _, obj, ids in need]
                got, skip = self.chunks.reserve(wanted, now, at=step, defer=True)
                for (store, obj, ids), kept, skipped in zip(need, got, skip):
                    reserved.setdefault(id(store), (store, []))[1].append((obj, kept))
                    self.owed.add(step, store, obj, skipped)
                    self._asked += len(ids)
                    self._skipped += len(skipped)
        except BaseException:
            self._downloads.abandon(list(reserved.values()))
            raise
        if self._asked >= MIN_ASKED and self._skipped > self._asked // 2:
            self._downloads.abandon(list(reserved.values()))  # chunks that would not last
            self._give_up()
            return []
        return list(reserved.values())

    def _round_ended(self, last: int, error: BaseException | None) -> None:
        """The chunks of steps up to ``last`` were fetched (``error``: or could not be)."""
        if error is not None and not self._failed:
            self._failed = True
            log.warning("treadle: lookahead could not fetch steps up to %d: %s", last, error)
        with self._cond:
            self._fetched = max(self._fetched, last)
            self._changed()

    def _give_up(self) -> None:
        """Most chunks the window needs find no room: stop fetching (rows are taken as
        without ``lookahead``), and say why."""
        fastpaths.off("chunk cache", (
            f"the chunks {self.lookahead + 1} steps need do not fit the chunk cache "
            f"({self.chunks.max_bytes:,} bytes, TREADLE_CHUNK_CACHE_BYTES): {self._skipped:,} of "
            f"{self._asked:,} found no room (a full shuffle beyond the cache: use "
            "td.BlockShuffle, or a smaller lookahead)"))  # fmt: skip
        self.owed.abandon()
        getattr(self.reader, "hold_ahead", lambda _: None)(None)  # takes: read ahead as before
        with self._cond:
            self._stop = True
            self._changed()

    def _changed(self) -> None:
        """Under the condition: wake the waiting reader, and tell the workers (if any)."""
        self._cond.notify_all()
        if self.shared is not None:
            self.shared.publish(self._now, self._fetched, self._stop)

    def gate(self, steps: Iterable[int]) -> Iterator[int]:
        """``steps``, each once its fetches ended: the reader never passes the fetches,
        except for a step beyond the window (read ahead further than ``lookahead``), which
        it reads at once (its rows taken where their chunks are not present)."""
        for step in steps:
            with self._cond:
                began = time.perf_counter()
                while (
                    not self._stop
                    and self._fetched < step
                    and (self._now is None or step <= self._now + self.lookahead)
                ):
                    self._cond.wait()
                if self._began:  # the clock starts after the first round (its footers, copies)
                    self._waited += time.perf_counter() - began
                else:
                    self._began = time.perf_counter()
                if self._died is not None:
                    raise TreadleError(
                        f"treadle: the lookahead stage's thread failed before step {step}: "
                        f"{type(self._died).__name__}: {self._died}") from self._died  # fmt: skip
            yield step

    def _need(self, step: int) -> Need:
        """Step ``step``'s chunks, per data file and stream (:mod:`~treadle.read.chunk_needs`)."""
        batch = self.samples(step)
        return step_needs(self.reader, [(batch.component, batch.moment)])[0]

    def _keys(self, component: np.ndarray, moment: np.ndarray) -> list[tuple[str, int]]:
        """``(object name, chunk)`` of every chunk these samples need."""
        (need,) = step_needs(self.reader, [(component, moment)])
        return [(o.name, c) for _, o, ids in need for c in ids.tolist()]


def tracked(batches: Iterator[dict[str, Any]], steps: Iterable[int],
            stage: Lookahead) -> Iterator[dict[str, Any]]:  # fmt: skip
    """``batches`` (one per step of ``steps``), telling ``stage`` as each is read; it stops
    the stage when it ends or is closed (without waiting)."""
    try:
        for step, batch in zip(steps, batches):
            stage.done(step, len(batch.get("_moment", ())))
            yield batch
    finally:
        stage.close()


def lookahead_store() -> ChunkStore | None:
    """The node's chunk store for a loader's lookahead, or None (the ``chunk cache`` fast
    path is off and says why; an earlier loader's report is not this one's)."""
    from treadle.storage.chunkstore import chunk_store

    if isinstance(got := chunk_store(), str):
        fastpaths.off("chunk cache", got)
        LAST.clear()
    return None if isinstance(got, str) else got
