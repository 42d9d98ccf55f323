"""The one bounded, ordered prefetch primitive of the delivery path and the importers.

:func:`prefetch` iterates any iterable on one background thread, at most ``depth`` items
ahead of the consumer, in order; a failure in the producer is raised in the consumer at
the position it happened; closing the consumer's generator stops the producer after the
item it is working on (and closes the iterator it was given). :func:`ordered_map` runs
``fn`` over items on a thread pool with a bounded number in flight (and optionally a
bounded total weight), in order, running the items its ``inline`` test picks on the
calling thread (work too small for a thread handoff); closing it cancels the items not yet
started and closes the iterator of items. Neither ever waits for a thread when it is closed
(a finalizer may close it, on any thread): the waiting is handed to :mod:`treadle.reaper`.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from treadle import reaper
from treadle.concurrency import CONCURRENCY
from treadle.fork_locks import check_not_forked

T = TypeVar("T")

_log = logging.getLogger("treadle")

_END = object()

# Producers still running, stopped before the interpreter finalises: a daemon thread that is
# inside C++ code (torch, Lance) when Python finalises is killed on its way back to the GIL,
# and the process aborts ("terminate called without an active exception").
_LIVE: dict[threading.Thread, threading.Event] = {}


def _forget_in_child() -> None:
    _LIVE.clear()  # the parent's threads do not exist in a forked child
    _WORKERS.clear()


os.register_at_fork(after_in_child=_forget_in_child)


# ordered_map's daemon threads, and the queue each takes its items from
_WORKERS: dict[threading.Thread, queue.SimpleQueue[Any]] = {}


@atexit.register
def _stop_live_producers(timeout_s: float = 10.0) -> None:
    for stop in list(_LIVE.values()):
        stop.set()
    for jobs in list(_WORKERS.values()):
        jobs.put(None)  # an idle worker of a map nobody closed ends now
    deadline = time.monotonic() + timeout_s  # one bound for them all: a hung read may stay
    for t in list(_LIVE) + list(_WORKERS):
        t.join(max(0.0, deadline - time.monotonic()))


#: How long a consumer stopped by a failure or an interrupt waits for its producer to
#: finish the item it is on; a producer still in it (a read hung on a dead server, which
#: obstore gives up on only after minutes) is left to end on its daemon thread.
GIVE_UP_S = 5.0

#: How long the reaper waits for the producer of a prefetch closed early (a dropped
#: iterator, a ``break``) to finish the item it is on: every later cleanup the reaper runs
#: waits behind it, so a producer hung in a read on a dead store is left to end on its
#: daemon thread, without ``close()``, as one stopped by an interrupt is.
CLOSED_WAIT_S = 30.0


def default_threads() -> int:
    """Threads used for parallel work when the caller does not say (cores, at most
    :attr:`~treadle.concurrency.Concurrency.max_threads`)."""
    return CONCURRENCY.default_threads()


def prefetch(
    items: Iterable[T],
    depth: int = 2,
    *,
    close: Callable[[], None] | None = None,
    name: str = "treadle-prefetch",
) -> Iterator[T]:
    """Iterate ``items`` on a background thread, up to ``depth`` items ahead, in order.

    Exceptions raised while producing are re-raised here. At the end, the producer is
    waited for and ``close()`` runs here. Stopped early (closing this generator, which the
    garbage collector may do on any thread, or an error or an interrupt) nothing waits here:
    the reaper (:mod:`treadle.reaper`) stops the producer after the item it is on, waits for
    it (at most :data:`CLOSED_WAIT_S`; stopped by an error or an interrupt, at most
    :data:`GIVE_UP_S`: a producer still running then is left, without ``close()``, and a
    warning names it) and then runs ``close()``.
    """
    q: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()
    t = threading.Thread(target=_produce, args=(items, q, stop), name=name, daemon=True)
    live = _LIVE  # still bound if this generator is finalised in interpreter teardown
    closed_wait = CLOSED_WAIT_S
    live[t] = stop
    reaper.start()
    t.start()
    home, getpid = os.getpid(), os.getpid  # (bound: finalised in teardown, os may be None)
    try:
        while True:
            check_not_forked(home, f"a prefetch iterator ({name})")  # else q.get() never returns
            ok, item = q.get()
            if not ok:
                raise item
            if item is _END:
                break
            yield item
    except GeneratorExit:  # maybe a finalizer, on any thread: never wait here
        # (in a forked child the thread, and what close() ends, are the parent's)
        if getpid() == home:
            stop.set()
            reaper.reap(_stop, t, stop, closed_wait, live, close)
        raise
    except BaseException:  # a failure or an interrupt: a producer hung in a read is left
        if getpid() == home:
            stop.set()
            reaper.reap(_stop, t, stop, GIVE_UP_S, live, close)
        raise
    stop.set()
    t.join()  # it has handed over its end: it is on its way out
    live.pop(t, None)
    if close is not None:
        close()


def _produce(items: Iterable[Any], q: queue.Queue[tuple[bool, Any]],
             stop: threading.Event) -> None:  # fmt: skip
    """The producer of :func:`prefetch`: ``(True, item)``, then ``(True, _END)`` or
    ``(False, error)`` into ``q``, until ``stop`` is set."""

    def put(entry: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    it = iter(items)
    try:
        for item in it:
            if not put((True, item)):
                return
        put((True, _END))
    except BaseException as e:  # every failure is handed to the consumer
        put((False, e))
    finally:  # a generator stopped early stops its own work here, on its own thread
        if hasattr(it, "close"):
            it.close()


def _stop(
    t: threading.Thread,
    stop: threading.Event,
    wait: float,
    live: dict[threading.Thread, threading.Event],
    close: Callable[[], None] | None,
) -> None:
    """On the reaper: wait for the producer (at most ``wait``), then hand ``close`` in after
    the cleanups the producer handed in while it stopped (its iterator's)."""
    stop.set()
    t.join(wait)
    if t.is_alive():  # it still uses what close() closes: exit joins it, close() never runs
        _log.warning("treadle: prefetch thread %s still running %.1f s after it was told to "
                     "stop (a read hung?): left to end on its own, its close() skipped",
                     t.name, wait)  # fmt: skip
        return
    live.pop(t, None)
    if close is not None:
        reaper.reap(close)


def ordered_map(
    fn: Callable[[Any], T],
    items: Iterable[Any],
    threads: int | None = None,
    ahead: int | None = None,
    weight: Callable[[Any], int] | None = None,
    budget: int | Callable[[], int] | None = None,
    inline: Callable[[Any], bool] | None = None,
    leave_running: bool = False,
) -> Iterator[T]:
    """``map(fn, items)`` on a thread pool, in order, with at most ``ahead`` in flight.

    ``ahead`` defaults to ``2 * threads``; memory is bounded by ``ahead`` results. With
    ``weight`` and ``budget``, items are also held back while the weights of those in
    flight exceed ``budget`` (bytes, say: a few huge items then do not all sit in memory
    at once); one item is always let through, whatever its weight. A callable ``budget``
    is asked again at each item (a budget that adapts while items run). Items for which
    ``inline(item)`` is true run on the calling thread when they are reached (a failure is
    still raised at that item's place in the order). Items run on daemon threads; with
    ``leave_running``, a failure or an interrupt (not closing) does not wait for the items
    still running (a read hung on a dead server would hold the caller for minutes): for
    items that use nothing the caller closes once it has the error (the importers').
    """
    threads = threads or default_threads()
    ahead = max(1, ahead or 2 * threads)
    if threads <= 1:
        yield from map(fn, items)
        return
    it = iter(items)
    pool = _DaemonPool(threads, "treadle-map")
    pending: deque[tuple[Future[T], int]] = deque()
    load = 0
    reaper.start()
    home, getpid, reap = os.getpid(), os.getpid, reaper.reap  # bound: finalised in teardown
    try:
        for item in it:
            w = weight(item) if weight is not None else 0
            run = _now(fn, item) if inline is not None and inline(item) else None
            pending.append((run or pool.submit(fn, item), w))
            load += w
            while pending and (len(pending) >= ahead or _over(load, budget)):
                done, w = pending.popleft()
                load -= w
                yield _result(done, home)
        while pending:
            yield _result(pending.popleft()[0], home)
    except GeneratorExit:  # closed early, maybe a finalizer on any thread: never wait here
        if getpid() == home:  # a forked child's pool threads are the parent's
            reap(_shut, pending, pool, it, True)
        raise
    except BaseException:
        # A failure or an interrupt (Ctrl-C): items still running may be left to end on
        # their daemon threads, so a read hung on a dead server holds neither the caller
        # nor the interpreter's exit (a ThreadPoolExecutor waited for them, minutes).
        if getpid() == home:
            _shut(pending, pool, it, not leave_running)
        raise
    pool.shutdown(False)  # every item has ended: the threads just go
    if hasattr(it, "close"):
        it.close()


def _result(done: Future[T], home: int) -> T:
    """``done.result()``, a ForkError in a forked child (the threads it waits for are not there)."""
    check_not_forked(home, "a thread-pool map (ordered_map)")
    return done.result()


def _shut(pending: deque[tuple[Future[Any], int]], pool: _DaemonPool, it: Iterator[Any],
          wait: bool) -> None:  # fmt: skip
    """Stop a map early: items not started never run; ``wait``: for those running."""
    for f, _ in pending:
        f.cancel()
    pool.shutdown(wait)
    if hasattr(it, "close"):
        it.close()


class _DaemonPool:
    """``ThreadPoolExecutor.submit`` on daemon threads (at most ``threads``), which
    interpreter exit does not wait for beyond :func:`_stop_live_producers`'s bound."""

    def __init__(self, threads: int, name: str):
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[Any], Any], Any] | None]
        self._jobs = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._max, self._name = threads, name

    def submit(self, fn: Callable[[Any], T], item: Any) -> Future[T]:
        fut: Future[T] = Future()
        self._jobs.put((fut, fn, item))
        if len(self._threads) < self._max:
            t = threading.Thread(
                target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
            )
            _WORKERS[t] = self._jobs
            self._threads.append(t)
            t.start()
        return fut

    def shutdown(self, wait: bool) -> None:
        """Stop every thread once its current item ends; ``wait``: wait for that."""
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            if not reaper.may_wait() or threading.current_thread() in self._threads:
                raise RuntimeError(  # it would wait for itself: a bug, never a hang
                    f"{self._name}: a pool shut down from {threading.current_thread().name}"
                    " cannot wait for its threads there"
                )
            for t in self._threads:
                t.join()

    def _work(self) -> None:
        try:
            while (job := self._jobs.get()) is not None:
                fut, fn, item = job
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    fut.set_result(fn(item))
                except BaseException as e:  # raised where the consumer reaches this item
                    fut.set_exception(e)
                del job, fut, fn, item  # a finished item's result is not held here
        finally:
            _WORKERS.pop(threading.current_thread(), None)


def _over(load: int, budget: int | Callable[[], int] | None) -> bool:
    if budget is None:
        return False
    return load > (budget() if callable(budget) else budget)


def _now(fn: Callable[[Any], T], item: Any) -> Future[T]:
    """``fn(item)`` run here, as a finished future (its result or its exception)."""
    done: Future[T] = Future()
    try:
        done.set_result(fn(item))
    except Exception as e:  # raised where the consumer reaches this item
        done.set_exception(e)
    return done
