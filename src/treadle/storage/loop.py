"""The one event loop thread that runs obstore's async calls for every store."""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
from collections.abc import Sequence
from contextlib import suppress
from typing import Any


class _Loop:
    """One long-lived event loop thread shared by every store (obstore's async API).

    Nothing is left running on it when a call returns or the interpreter exits: a
    request still in flight in obstore's Rust runtime while Python finalises calls back
    into a dying interpreter (SIGABRT/SIGSEGV at exit). :meth:`gather` cancels and awaits
    the siblings of a failed request; an ``atexit`` hook cancels and awaits whatever is
    still running (another thread's read), then stops the loop.
    """

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _pid: int | None = None
    _SHUTDOWN_WAIT_S = 10.0

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._pid != os.getpid():
                loop = asyncio.new_event_loop()
                t = threading.Thread(target=loop.run_forever, name="treadle-io", daemon=True)
                t.start()
                if cls._pid is None:
                    atexit.register(cls.shutdown)
                cls._loop, cls._thread, cls._pid = loop, t, os.getpid()
            return cls._loop

    @classmethod
    def run(cls, coro):
        return asyncio.run_coroutine_threadsafe(coro, cls.get()).result()

    @staticmethod
    async def gather(coros: Sequence[Any]) -> list[Any]:
        """``asyncio.gather``, but the first failure cancels the others and waits for them."""
        tasks = [asyncio.ensure_future(c) for c in coros]
        try:
            return await asyncio.gather(*tasks)
        except BaseException:
            await _cancel_and_wait(tasks)
            raise

    @classmethod
    def shutdown(cls) -> None:
        """Cancel and await every task on the loop, then stop it (run at interpreter exit)."""
        with cls._lock:
            loop, thread, pid = cls._loop, cls._thread, cls._pid
            cls._loop = cls._thread = None
        if loop is None or thread is None or pid != os.getpid() or not loop.is_running():
            return

        async def drain() -> None:
            me = asyncio.current_task()
            await _cancel_and_wait([t for t in asyncio.all_tasks() if t is not me])

        with suppress(Exception):
            asyncio.run_coroutine_threadsafe(drain(), loop).result(cls._SHUTDOWN_WAIT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(cls._SHUTDOWN_WAIT_S)
        if not thread.is_alive():
            loop.close()


async def _cancel_and_wait(tasks: Sequence[asyncio.Future[Any]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
