"""The one event loop thread that runs obstore's async calls for every store."""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import Any, TypeVar

from treadle import reaper
from treadle.errors import StorageError
from treadle.fork_locks import renew_lock_in_child

T = TypeVar("T")


class _Loop:
    """One long-lived event loop thread shared by every store (obstore's async API).

    Nothing may call into Python once the interpreter finalises: a request still in
    flight in obstore's Rust runtime takes the GIL when it ends, and a thread that takes
    it during finalisation kills the process (SIGABRT/SIGSEGV at exit). Cancelling the
    request does not help: its Rust task still takes the GIL to learn it was cancelled,
    possibly after the caller has seen the cancellation. So every obstore call goes
    through :func:`request`, which never cancels the call and remembers it until Rust has
    delivered its result; :meth:`gather` cancels the Python side of the siblings of a
    failed request (the error is raised at once), and an ``atexit`` hook cancels every
    task, waits for every request still in flight, then stops the loop.
    """

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _pid: int | None = None
    _closed: int | None = None  # the pid whose exit hook stopped the loop: no new one there
    _SHUTDOWN_WAIT_S = 10.0
    _CALLS_WAIT_S = 5.0

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._closed == os.getpid():
                # a new loop now would run requests nobody waits for while the interpreter
                # finalises (a daemon reader retrying after the hook cancelled its read)
                raise StorageError(
                    "object-store read after interpreter exit began: treadle's I/O loop "
                    "has shut down (read before exit, or from a non-daemon thread)"
                )
            if cls._loop is None or cls._pid != os.getpid():
                loop = asyncio.new_event_loop()
                _IN_FLIGHT.clear()  # a forked child's copy of its parent's calls
                t = threading.Thread(target=loop.run_forever, name="treadle-io", daemon=True)
                t.start()
                reaper.forbid_waits(t)  # nothing may block the thread every read needs
                if cls._pid is None:
                    atexit.register(cls.shutdown)
                cls._loop, cls._thread, cls._pid = loop, t, os.getpid()
            return cls._loop

    @classmethod
    def run(cls, coro):
        try:
            loop = cls.get()
        except BaseException:
            coro.close()  # never handed to the loop: it never runs
            raise
        if threading.current_thread() is cls._thread:
            coro.close()
            # it would wait for the thread it blocks: a hang, which a finalizer run by the
            # garbage collector on this thread would otherwise turn into
            raise StorageError(
                "an object-store call was made from treadle's I/O loop thread (treadle-io), "
                "which would wait for itself forever: a finalizer or callback running there "
                "must hand its work to another thread (treadle.reaper.reap)"
            )
        fut = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return fut.result()
        except BaseException:
            # The caller gave up (Ctrl-C, a signal handler's exception): stop the task too,
            # else it retries on for minutes against a hung server, holding what it read.
            # Its obstore calls still run to their end (request() never cancels them).
            fut.cancel()
            raise

    @classmethod
    def run_through_dup(cls, fd: int, work: Callable[[int], Awaitable[T]]) -> T | None:
        """``await work(own)`` on the loop (:meth:`run`), ``own`` a duplicate of ``fd``.

        ``own`` is closed on the loop once ``work`` has ended: a caller that gave up (Ctrl-C)
        closes ``fd`` at once, while a part whose bytes had arrived still wrote them, into
        whatever file took that number meanwhile. If ``work`` never started (a Ctrl-C or an
        error before the loop ran it) ``own`` is closed here, and ``work`` never runs."""
        started = threading.Lock()  # taken once: by the loop as work starts, or here

        async def owned() -> T | None:
            if not started.acquire(blocking=False):
                return None  # the caller gave up first and closed ``own``
            try:
                return await work(own)
            finally:
                os.close(own)

        own = os.dup(fd)
        try:
            return cls.run(owned())
        except BaseException:
            if started.acquire(blocking=False):  # work never ran, nor will
                os.close(own)
            raise

    @staticmethod
    async def gather(coros: Sequence[Any]) -> list[Any]:
        """``asyncio.gather``, but the first failure cancels the others and waits for them
        (their obstore calls run on to their end: see :func:`request`)."""
        tasks = [asyncio.ensure_future(c) for c in coros]
        try:
            return await asyncio.gather(*tasks)
        except BaseException:
            await _cancel_and_wait(tasks)
            raise

    @classmethod
    def shutdown(cls) -> None:
        """Cancel and await every task on the loop, wait for every obstore call still in
        flight (at most ``_CALLS_WAIT_S``), then stop the loop (run at interpreter exit).
        Cleanups still with the reaper (readers stopped early) run first, while the loop
        still serves them (at most ``reaper.EXIT_WAIT_S``)."""
        reaper.drain(reaper.EXIT_WAIT_S)
        with cls._lock:
            loop, thread, pid = cls._loop, cls._thread, cls._pid
            cls._loop = cls._thread = None
            cls._closed = os.getpid()
        if loop is None or thread is None or pid != os.getpid() or not loop.is_running():
            return

        async def drain() -> None:
            me = asyncio.current_task()
            await _cancel_and_wait([t for t in asyncio.all_tasks() if t is not me])
            if _IN_FLIGHT:  # then the calls: their callers are gone, the calls are not
                _, late = await asyncio.wait(list(_IN_FLIGHT), timeout=cls._CALLS_WAIT_S)
                for f in late:  # a stuck call: cancel it, and hope Rust is quick to see it
                    f.cancel()

        with suppress(Exception):
            asyncio.run_coroutine_threadsafe(drain(), loop).result(cls._SHUTDOWN_WAIT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(cls._SHUTDOWN_WAIT_S)
        if not thread.is_alive():
            loop.close()
        # A Rust thread that delivered the last result may still be giving the GIL back.
        time.sleep(_GIL_HANDBACK_S)


#: obstore calls whose Rust task has not delivered its result yet (see :func:`request`)
_IN_FLIGHT: set[asyncio.Future[Any]] = set()
_GIL_HANDBACK_S = 0.02


async def request(call: Awaitable[T]) -> T:
    """Await one obstore call without ever cancelling it.

    Cancelling the caller cancels only its wait: the call runs to its end and stays in
    ``_IN_FLIGHT`` until then, so interpreter exit can wait for it (see :class:`_Loop`).
    """
    fut = asyncio.ensure_future(call)
    _IN_FLIGHT.add(fut)
    fut.add_done_callback(_settled)
    return await asyncio.shield(fut)


def in_flight() -> int:
    """How many obstore calls are still running (their callers may have given up)."""
    return len(_IN_FLIGHT)


def _settled(fut: asyncio.Future[Any]) -> None:
    _IN_FLIGHT.discard(fut)
    if not fut.cancelled():
        fut.exception()  # retrieved: an abandoned call's error is not logged as lost


renew_lock_in_child(_Loop, "_lock")  # else a forked child's first get() may wait forever


async def _cancel_and_wait(tasks: Sequence[asyncio.Future[Any]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
