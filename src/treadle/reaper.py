"""Cleanup that must not run where it is asked for: the reaper thread.

The garbage collector runs finalizers (a suspended generator's ``finally``, ``__del__``,
``weakref`` callbacks) on whichever thread happens to allocate when a pass starts: the I/O
loop thread, a decode thread, a thread holding a lock. A finalizer that stops a reader by
joining its threads can then wait for the very thread it runs on (the I/O loop thread
joining a reader that waits on the I/O loop: issue 49's deadlock). So a cleanup that may
run as a finalizer never blocks: it hands the blocking part to :func:`reap`, which only
puts it on a queue (``queue.SimpleQueue.put`` is safe from finalizers and signal handlers),
and one daemon thread, the reaper, runs the cleanups in the order they were handed in.

:func:`closing` is the form a generator uses: its cleanup runs in place when the generator
ends, and on the reaper when it is closed (``GeneratorExit``: an explicit ``close()``, a
dropped iterator, or the garbage collector, which a generator cannot tell apart) or fails.
Cleanups that must follow the cleanups of what they wrap (a reader's ``close`` after its
read-ahead pool stopped) are handed in after them, and the reaper keeps that order. :func:`drain` waits for the cleanups handed in so far (at exit, and
where a caller must know its readers are gone); it never waits on the reaper itself or on
a thread registered with :func:`forbid_waits` (the I/O loop thread).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Generator
from types import TracebackType
from typing import Any

_log = logging.getLogger("treadle")

#: How long interpreter exit waits for the cleanups still queued (a read hung on a dead
#: server may hold one for minutes: exit does not wait for that)
EXIT_WAIT_S = 10.0


class _Reaper:
    """One queue and one daemon thread per process (a forked child starts afresh)."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]]
        self.jobs = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.start_lock = threading.Lock()
        self.no_waits: set[int] = set()  # thread idents nothing may wait on

    def start(self) -> None:
        if self.thread is not None:
            return
        with self.start_lock:
            if self.thread is None:
                t = threading.Thread(target=self.run, name="treadle-reaper", daemon=True)
                t.start()
                self.thread = t

    def run(self) -> None:
        while True:
            fn, args = self.jobs.get()
            try:
                fn(*args)
            except BaseException as e:  # a cleanup's failure is logged, never lost silently
                _log.warning("treadle: a cleanup handed to the reaper failed: %r", e)
            del fn, args  # what the cleanup held goes now, not with the next job


_REAPER = _Reaper()


def _renew_in_child() -> None:
    global _REAPER
    _REAPER = _Reaper()  # the parent's thread, queue and locks do not exist here


os.register_at_fork(after_in_child=_renew_in_child)


def start() -> None:
    """Start the reaper thread if it is not running (call from ordinary code, never from a
    finalizer: starting a thread takes locks). Whatever sets up work that may later be
    cleaned up by :func:`reap` calls this first."""
    _REAPER.start()


def reap(fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` on the reaper thread, after every cleanup handed in before it.

    Never blocks: safe in a finalizer, on the I/O loop thread, under any lock. A cleanup
    handed in before the reaper was started (a forked child's first) runs once it starts.
    """
    _REAPER.jobs.put((fn, args))


def forbid_waits(thread: threading.Thread) -> None:
    """Mark ``thread`` as one nothing may block on (the I/O loop thread)."""
    if thread.ident is not None:
        _REAPER.no_waits.add(thread.ident)


def may_wait() -> bool:
    """Whether the current thread may block on other threads: not one marked with
    :func:`forbid_waits` (the reaper may: waiting is what it is for)."""
    return threading.get_ident() not in _REAPER.no_waits


def drain(timeout: float | None = None) -> bool:
    """Wait until the reaper is idle: every cleanup handed in before this call has run, and
    every cleanup those handed in (a producer's, handed in while it stopped); at most
    ``timeout`` seconds. True when they all have. Returns False at once where waiting is
    not allowed (:func:`may_wait`), on the reaper itself, or when no reaper thread runs."""
    r = _REAPER
    if not may_wait() or r.thread is None or r.thread is threading.current_thread():
        return False
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done = threading.Event()  # cleanups run in order: once this one runs, the earlier have
        r.jobs.put((done.set, ()))
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not done.wait(left):
            return False
        if r.jobs.empty():
            return True


@atexit.register
def _drain_at_exit() -> None:
    drain(EXIT_WAIT_S)


class closing:  # noqa: N801 (used as a statement, like contextlib.closing)
    """``with closing(cleanup, *args, inner=gen):`` in a generator: ``inner`` (a generator
    the block iterates) is closed first, then ``cleanup(*args)`` runs in place when the
    block ends, and on the reaper when it is left by an exception.

    ``GeneratorExit`` is one: an explicit ``close()``, a dropped iterator, or the garbage
    collector finalizing the generator on any thread (a generator cannot tell them apart).
    Closing ``inner`` early hands its own cleanups to the reaper: ``cleanup``, which must
    follow them (a reader's ``close`` after its read-ahead pool stopped), goes there too,
    after them (the exception is raised at once either way). In a process forked while the
    block ran, leaving it does nothing: its threads and processes are the parent's."""

    def __init__(
        self, cleanup: Callable[..., Any], *args: Any, inner: Generator[Any, Any, Any] | None = None
    ) -> None:
        self.cleanup, self.args, self.inner = cleanup, args, inner
        self.home = os.getpid()
        start()

    def __enter__(self) -> closing:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if os.getpid() != self.home:
            return  # a forked child's copy: what the block started (threads, processes) is the parent's
        if self.inner is not None:
            self.inner.close()  # never waits: its cleanups go to the reaper
        if kind is None:
            self.cleanup(*self.args)
        else:
            reap(self.cleanup, *self.args)
