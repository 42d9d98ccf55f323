"""The one bounded, ordered prefetch primitive of the delivery path and the importers.

:func:`prefetch` iterates any iterable on one background thread, at most ``depth`` items
ahead of the consumer, in order; a failure in the producer is raised in the consumer at
the position it happened; closing the consumer's generator stops the producer after the
item it is working on (and closes the iterator it was given). :func:`ordered_map` runs
``fn`` over items on a thread pool with a bounded number in flight (and optionally a
bounded total weight), in order, running the items its ``inline`` test picks on the
calling thread (work too small for a thread handoff); closing it cancels the items not yet
started and closes the iterator of items.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from treadle.concurrency import CONCURRENCY

T = TypeVar("T")

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

    Exceptions raised while producing are re-raised here; when the consumer stops (the end,
    an error, or closing this generator) the producer is stopped, waited for, and then
    ``close()`` runs; stopped by an error or an interrupt, it waits at most
    :data:`GIVE_UP_S`, and a producer still running then is left (without ``close()``).
    """
    q: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(entry: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
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

    t = threading.Thread(target=run, name=name, daemon=True)
    live = _LIVE  # still bound if this generator is finalised in interpreter teardown
    live[t] = stop
    t.start()
    wait: float | None = None
    try:
        while True:
            ok, item = q.get()
            if not ok:
                raise item
            if item is _END:
                return
            yield item
    except GeneratorExit:
        raise
    except BaseException:  # a failure or an interrupt: a producer hung in a read is left
        wait = GIVE_UP_S
        raise
    finally:
        _stop(t, stop, wait, live, close)


def _stop(
    t: threading.Thread,
    stop: threading.Event,
    wait: float | None,
    live: dict[threading.Thread, threading.Event],
    close: Callable[[], None] | None,
) -> None:
    stop.set()
    t.join(wait)
    if not t.is_alive():  # else it still uses what close() closes: exit joins it
        live.pop(t, None)
        if close is not None:
            close()


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
    load, wait = 0, True
    try:
        for item in it:
            w = weight(item) if weight is not None else 0
            run = _now(fn, item) if inline is not None and inline(item) else None
            pending.append((run or pool.submit(fn, item), w))
            load += w
            while pending and (len(pending) >= ahead or _over(load, budget)):
                done, w = pending.popleft()
                load -= w
                yield done.result()
        while pending:
            yield pending.popleft()[0].result()
    except GeneratorExit:  # closed early by its consumer: items running end first
        raise
    except BaseException:
        # A failure or an interrupt (Ctrl-C): items still running may be left to end on
        # their daemon threads, so a read hung on a dead server holds neither the caller
        # nor the interpreter's exit (a ThreadPoolExecutor waited for them, minutes).
        wait = not leave_running
        raise
    finally:  # stopped early (closed, or a failure): items not started never run
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
