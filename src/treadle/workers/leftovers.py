"""The worker processes' server removes the folder multiprocessing made for it when its
loader's process dies without removing it.

The server's socket lives in a ``pymp-*`` folder of the temp folder, made by the loader's
process and removed by that process's exit hook only: a loader killed by a signal (SIGTERM
with no handler, the OOM killer's SIGKILL) or a crash left one per run. The server outlives
it (it exits once its parent's end of their pipe closes), so it removes the folder then, if
its parent is gone: a parent still running (one that stopped the server) keeps its folder.
A SIGTERM sent to the whole process group (a batch system's cancel) kills the server too:
it removes the folder first, then dies of the signal. The loader's signal handlers are never
touched: it dies of its signal, as its supervisor expects.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import time
from typing import Any

#: In the server's environment at its start: ``<parent pid>:<folder>``
FOLDER_ENV = "TREADLE_WORKER_SERVER_FOLDER"

#: How long the server waits for its parent to be gone once their pipe closed (a dying
#: process closes its files a moment before it is gone)
PARENT_EXIT_WAIT_S = 2.0


def handed_over() -> str:
    """The value of :data:`FOLDER_ENV` for a server this process starts now."""
    from multiprocessing import util

    return f"{os.getpid()}:{util.get_temp_dir()}"


def remove_when_orphaned() -> None:
    """In the server (its preload): remove the folder named in :data:`FOLDER_ENV` at exit, or
    at a SIGTERM, if its parent is gone by then; then unblock SIGTERM (one that came while
    the server imported was kept pending: it is handled now)."""
    said = os.environ.pop(FOLDER_ENV, "")
    parent, _, folder = said.partition(":")
    if folder and parent.isdigit():
        _remove_at_exit(int(parent), folder)
    if hasattr(signal, "pthread_sigmask"):  # blocked since the server was spawned
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _remove_at_exit(parent: int, folder: str) -> None:
    server = os.getpid()

    def remove() -> None:
        if os.getpid() != server:  # a forked worker: the folder is its loader's
            return
        deadline = time.monotonic() + PARENT_EXIT_WAIT_S
        while os.getppid() == parent:
            if time.monotonic() > deadline:
                return  # the parent runs on (it stopped the server): the folder is its own
            time.sleep(0.01)
        shutil.rmtree(folder, ignore_errors=True)

    def on_term(signum: int, frame: Any) -> None:
        remove()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # the signal's own death, in the server or a worker

    atexit.register(remove)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_term)


def default_sigterm() -> None:
    """In a process forked from the server: SIGTERM's default action again, unblocked."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
